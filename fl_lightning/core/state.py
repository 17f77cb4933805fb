"""Per-client state declared once: sized by K when the data is known, checkpointed, offloadable.

An algorithm declares each piece of state in its ``__init__`` with
``register_client_state(name, ...)``; the module creates the (K, ...) buffer when it learns
K (``setup``), or with the checkpoint's shape when one is loaded before any setup
(``load_from_checkpoint``). Buffers are checkpointed by Lightning like any other, and a
state declared with ``offload=True`` stays in host memory when the module moves to a GPU.

The (K, d) client history is checkpointed compactly: only the rows the algorithm can still read
(the hook ``FederatedModule.history_rows_to_keep``; by default every client ever seen), with
their indices; loading puts them back in a (K, d) buffer of zeros, and a row left out raises if
it is ever read before being written again. Checkpoints holding the whole buffer (written
before) load unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fl_lightning import private_api

COMPACT_HISTORY_KEY = "fl_compact_history"  # checkpoint entry: {"rows": kept row ids, "num_clients": K}

HISTORY_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                          "float16": torch.float16}


GLOBAL_MODEL = "global_model"  # register_client_state(init=GLOBAL_MODEL): one copy of w^0 per client


@dataclass(frozen=True)
class ClientStateSpec:
    """One declared piece of per-client state: (K, *per_client_shape) filled with ``fill`` in
    ``dtype`` (None: the parameters' dtype when it is created), or ``init(K)``."""

    name: str
    per_client_shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    fill: float = 0.0
    init: Callable[[int], torch.Tensor] | str | None = None  # or GLOBAL_MODEL
    offload: bool = False  # keep in host memory (pinned when a GPU is present)


class ClientStateMixin(nn.Module):
    """``register_client_state`` and the history helpers of ``FederatedModule``."""

    if TYPE_CHECKING:  # what FederatedModule provides, and the history's registered buffers
        from lightning.pytorch.utilities.parsing import AttributeDict

        from fl_lightning.core.round_engine import RoundEngine
        from fl_lightning.core.settings import HistorySettings

        round_engine: RoundEngine
        history_settings: HistorySettings
        history: torch.Tensor
        last_seen: torch.Tensor

        @property
        def hparams(self) -> AttributeDict: ...

        def history_rows_to_keep(self, next_round: Any) -> torch.Tensor: ...  # a hook

        def round_context(self, round_index: int) -> Any: ...

    def _declared_client_states(self) -> dict[str, ClientStateSpec]:
        if "_client_state_specs" not in self.__dict__:
            self.__dict__["_client_state_specs"] = {}
        return self.__dict__["_client_state_specs"]

    def register_client_state(
        self,
        name: str,
        per_client_shape: tuple[int, ...] = (),
        dtype: torch.dtype | None = None,
        fill: float = 0.0,
        init: Callable[[int], torch.Tensor] | str | None = None,
        offload: bool = False,
    ) -> None:
        """Declares the buffer ``name`` of shape (K, *per_client_shape) filled with ``fill``, or
        built by ``init(K)``, or with ``init=GLOBAL_MODEL`` one copy of the global model w^0 per
        client (K, d)."""
        if isinstance(init, str) and init != GLOBAL_MODEL:
            raise ValueError(f"register_client_state({name!r}, init={init!r}): init is a function of K or GLOBAL_MODEL")
        self._declared_client_states()[name] = ClientStateSpec(name, per_client_shape, dtype, fill, init, offload)

    def materialise_client_states(self, num_clients: int) -> None:
        """Creates every declared state that does not exist yet for these K clients."""
        for spec in self._declared_client_states().values():
            current = private_api.own_buffers(self).get(spec.name)
            if current is not None and current.shape[0] == num_clients:
                continue  # setup runs again for every fit/validate: keep the state
            if spec.init == GLOBAL_MODEL:
                value = self.round_engine.global_vector().repeat(num_clients, 1)
            elif spec.init is not None:
                assert not isinstance(spec.init, str)  # register_client_state refuses any other name
                value = spec.init(num_clients)
            else:
                dtype = spec.dtype or self._state_reference().dtype
                value = torch.full((num_clients, *spec.per_client_shape), spec.fill, dtype=dtype)
            self._register_state(spec, value)

    def _materialise_from_checkpoint(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Creates the declared states with the checkpoint's shapes, so ``load_state_dict``
        can fill them before any setup has told the module K."""
        for spec in self._declared_client_states().values():
            saved = state_dict.get(spec.name)
            if saved is not None and private_api.own_buffers(self).get(spec.name) is None:
                self._register_state(spec, torch.empty_like(saved, device="cpu"))

    def _register_state(self, spec: ClientStateSpec, value: torch.Tensor) -> None:
        device = torch.device("cpu") if spec.offload else self._state_reference().device
        value = value.to(device)
        if spec.offload and torch.cuda.is_available():
            value = value.pin_memory()  # asynchronous copies to and from the GPU
        self.register_buffer(spec.name, value)

    def _state_reference(self) -> torch.Tensor:
        """A parameter: where new state goes, and its default dtype."""
        first = next(self.parameters(), None)
        return first if first is not None else torch.zeros(())

    def _apply(self, fn: Callable, recurse: bool = True) -> Any:
        # ``.to(device)``/``.cuda()`` move every buffer; offloaded state stays on the host
        buffers = private_api.own_buffers(self)
        offloaded = {name: buffers.pop(name) for name, spec in self._declared_client_states().items()
                     if spec.offload and name in buffers}
        try:
            super()._apply(fn, recurse)
        finally:
            buffers.update(offloaded)
        return self

    # ----------------------------------------------------------- last upload per client
    def register_client_history(self, num_parameters: int | None = None) -> None:
        """Every client's last upload and the round it came in (−1 = never): the states
        ``history`` (K, d) and ``last_seen`` (K,) that FedFV, FedLF and FedMDFG keep, stored
        in the module's ``history_dtype`` and, with ``history_device="cpu"``, in host memory.
        Read and write them with ``history_rows`` and ``store_history``."""
        d = num_parameters or self.round_engine.num_parameters
        where = self.history_settings
        dtype = HISTORY_DTYPES.get(where.dtype or "")  # None: the parameters' dtype
        self.register_client_state("history", (d,), dtype=dtype, offload=where.device == "cpu")
        self.register_client_state("last_seen", dtype=torch.long, fill=-1)

    def history_rows(self, clients: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Rows of ``history`` for ``clients``, on ``like``'s device and in its dtype."""
        missing = self.__dict__.get("_history_missing")
        host = clients.cpu() if missing is not None else clients
        if missing is not None and bool(missing[host].any()):
            left_out = host[missing[host]].tolist()
            raise RuntimeError(
                f"the history rows of clients {left_out} were left out of the checkpoint this fit resumed from "
                f"(history_rows_to_keep of {type(self).__name__} said they would not be read before being written "
                "again), but they are read now, so the resumed run would not be exact; resume from a checkpoint "
                "holding them or start the fit again, and report this as a bug"
            )
        rows = self.history[clients.to(self.history.device)]
        return rows.to(device=like.device, dtype=like.dtype, non_blocking=True)

    def store_history(self, clients: torch.Tensor, updates: torch.Tensor, round_index: int) -> None:
        """history[clients] <- updates (in the storage dtype/device); last_seen[clients] <- round."""
        self.history[clients.to(self.history.device)] = updates.to(self.history.device, self.history.dtype)
        self.last_seen[clients.to(self.last_seen.device)] = round_index
        missing = self.__dict__.get("_history_missing")
        if missing is not None:
            missing[clients.cpu()] = False

    # ----------------------------------------------------------- compact checkpoints
    def compact_history(self, checkpoint: dict[str, Any]) -> None:
        """Replaces the checkpoint's (K, d) ``history`` by the rows ``history_rows_to_keep`` names
        (the rounds completed are the fit loop's, as the checkpoint records them)."""
        state = checkpoint.get("state_dict", {})
        history = state.get("history")
        if "history" not in self._declared_client_states() or history is None or "last_seen" not in state:
            return
        if self.__dict__.get("_compaction_deferred"):
            return  # a checkpoint kept in memory: compacted when it is written
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
        rounds_completed = progress.get("processed")
        next_round = None if rounds_completed is None else self.round_context(int(rounds_completed))
        rows = self.history_rows_to_keep(next_round).to(torch.long).cpu().sort().values
        if len(rows) == history.shape[0]:
            return  # every row is needed: the buffer as it is
        state["history"] = history[rows.to(history.device)].clone()
        checkpoint[COMPACT_HISTORY_KEY] = {"rows": rows, "num_clients": int(history.shape[0])}

    @contextlib.contextmanager
    def deferring_compaction(self) -> Iterator[None]:
        """Checkpoints dumped inside keep the whole history buffer (by reference, no copy);
        ``compact_history`` them before writing, while the buffer is unchanged."""
        self.__dict__["_compaction_deferred"] = True
        try:
            yield
        finally:
            self.__dict__["_compaction_deferred"] = False

    def _expand_history(self, checkpoint: dict[str, Any]) -> None:
        """Undoes ``compact_history`` on a loaded checkpoint: the (K, d) buffer with zeros in the
        rows left out, which ``history_rows`` refuses to read until they are written again."""
        compact = checkpoint.pop(COMPACT_HISTORY_KEY, None)
        state = checkpoint.get("state_dict", {})
        self.__dict__["_history_missing"] = None
        if compact is None or "history" not in state:
            return
        rows, kept = compact["rows"].to(torch.long).cpu(), state["history"]
        full = torch.zeros((compact["num_clients"], *kept.shape[1:]), dtype=kept.dtype)
        full[rows] = kept.cpu()
        state["history"] = full
        missing = torch.ones(compact["num_clients"], dtype=torch.bool)
        missing[rows] = False
        self.__dict__["_history_missing"] = missing
