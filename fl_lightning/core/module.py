"""``FederatedModule``: a LightningModule whose every training step is one communication round.

A round (design.md, "How a round flows"):
 1. sample S_t (a fraction of the K clients, uniformly without replacement) and drop
    each sampled client with the simulated dropout probability;
 2. measure every answering client's training loss and accuracy at the global w;
 3. local training of all of them at once (``core.local``), giving updates
    g_i = w - w_i as the rows of J (m x d);
 4. leave out clients whose update is not finite (logged);
 5. ``aggregate(payload)`` -> the server step d (an algorithm's hook); w <- w - d,
    applied through the server optimizer so ``global_step`` counts applied rounds;
 6. ``on_round_end(payload, step)`` for the algorithm's bookkeeping.
Evaluation of every client (Lightning's validation loop) runs every ``eval_every``
rounds and after the last round. One Lightning epoch is one round, so the number of
rounds is exact (``num_rounds`` sets the fit loop's ``max_epochs``) and every metric is
logged with step = number of completed rounds.

Randomness is a pure function of (seed, round, purpose): sampling, dropout and the
local shuffles of round t are the same whether the run was resumed or not.
"""

from __future__ import annotations

import copy
import inspect
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import lightning.pytorch as pl
import torch

from fl_lightning.core.evaluation import evaluate_clients, evaluate_clients_stacked, label_matched
from fl_lightning.core.flat import (
    ParameterLayout,
    assign_model_vector,
    layer_names,
    layer_slices,
    model_vector,
)
from fl_lightning.core.gram import conflict_counts
from fl_lightning.core.local import (
    AUTOCAST_DTYPES,
    ClientShards,
    LocalSGD,
    batch_order,
    check_clients_per_chunk,
    choose_engine,
    is_stacked_start,
    masked_cross_entropy,
)
from fl_lightning.metrics import fairness_summary
from fl_lightning.models import create_fl_model
from fl_lightning.seeding import run_seed

_STREAMS = {"sampling": 1, "dropout": 2, "shuffle": 3}
_HISTORY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def round_generator(seed: int, round_index: int, stream: str) -> torch.Generator:
    """A CPU generator for one purpose in one round, independent of everything before."""
    mixed = (seed * 1_000_003 + round_index * 7_919 + _STREAMS[stream] * 104_729) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def finite_rows(updates: torch.Tensor) -> torch.Tensor:
    """Which rows hold only finite numbers, (m,) bool.

    A row's sum is finite when all its entries are (one read of J, no m x d mask); the few
    rows whose sum is not are checked entry by entry (a finite row can overflow its sum).
    """
    finite = torch.isfinite(updates.sum(dim=1))
    if not bool(finite.all()):
        suspects = (~finite).nonzero().flatten()
        finite[suspects] = torch.isfinite(updates[suspects]).all(dim=1)
    return finite


@dataclass
class RoundPayload:
    """What the answering clients of round t upload (rows aligned across fields)."""

    round: int
    clients: torch.Tensor  # (m,) client ids
    updates: torch.Tensor  # (m, d) g_i = w - w_i
    losses: torch.Tensor  # (m,) training loss at w, before local training
    accuracies: torch.Tensor  # (m,) training accuracy at w, before local training
    num_samples: torch.Tensor  # (m,) n_i
    shards: ClientShards | None = None  # the clients' training data (for extra evaluations)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return int(self.clients.shape[0])

    def select(self, keep: torch.Tensor) -> RoundPayload:
        """The payload of a subset of the clients (boolean mask over the rows)."""
        return RoundPayload(
            self.round,
            self.clients[keep],
            self.updates[keep],
            self.losses[keep],
            self.accuracies[keep],
            self.num_samples[keep],
            None if self.shards is None else self.shards.select(keep),
            dict(self.extras),
        )


class FederatedModule(pl.LightningModule):
    """Base class of every federated algorithm; subclasses implement ``aggregate``.

    Args:
        backbone: a registered model name (``fl_lightning.models.list_fl_models()``).
        backbone_kwargs: extra keyword arguments for the backbone.
        num_classes, input_shape: filled in from the data module by the CLI.
        num_rounds: communication rounds T.
        fraction: share of the K clients sampled per round (1.0 = full participation).
        dropout_prob: chance that a sampled client does not answer in a round.
        local_epochs, batch_size, lr, momentum, weight_decay: local SGD (batch_size
            None = full batch).
        engine: ``"auto"``, ``"vectorised"`` or ``"sequential"``.
        eval_every: evaluate every client every this many rounds (and after the last).
        seed: seeds the model's initialisation and every per-round random stream; ``None``
            (the default) takes the run's seed (``--seed_everything N``), else 0.
        engine_memory_budget_gb: what ``engine="auto"`` may spend on stacked clients.
        clients_per_chunk: clients trained together by the vectorised engine (None = all,
            ``"auto"`` = sized from the free memory, see ``core.local.auto_chunk_size``);
            the size used is logged as ``chunk_size``, and a chunk that runs out of
            memory is retried in halves (later rounds keep the smaller size).
        local_autocast: ``None``, ``"bf16"`` (or ``"fp16"`` on a GPU): mixed precision for
            local training's forward passes; parameters and updates stay float32.
        history_dtype: storage dtype of per-client histories (FedFV, FedLF, FedMDFG keep
            every client's last update, K x d): ``None`` (the parameters' dtype),
            ``"float32"``, ``"bfloat16"``, ``"float16"``.
        history_device: ``"model"`` (with the model) or ``"cpu"`` (offloaded to host
            memory, pinned when a GPU is present): 100 clients of NF-ResNet-18 or CCT fit.
        attack: simulate one malicious client (FedMGDA+ Sec. 6.2.2) that takes part in
            every round: ``"bias"`` adds ``attack_strength`` to the loss it reports;
            ``"scaling"`` multiplies its loss, and so its update, by ``attack_strength``.
        attack_client: the malicious client's id.
        attack_strength: the bias added or the factor applied.
        lr_decay: the local learning rate of round t is ``lr * lr_decay**t`` (FedLF uses
            0.999, CGSV 0.977).
        layer_grouping: ``"tensor"`` or ``"module"``: what a "layer" is for per-layer
            conflict counts and layer-wise aggregation (``core.flat.layer_slices``).
        track_improvement: measure, after every round, the share of participants whose
            training loss did not increase (FedMGDA+ footnote 6); costs one more
            evaluation of their training data.
    """

    def __init__(
        self,
        backbone: str = "fl_mlp",
        backbone_kwargs: dict[str, Any] | None = None,
        num_classes: int = 10,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_rounds: int = 100,
        fraction: float = 0.1,
        dropout_prob: float = 0.0,
        local_epochs: int = 1,
        batch_size: int | None = 10,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        engine: str = "auto",
        eval_every: int = 1,
        seed: int | None = None,
        engine_memory_budget_gb: float = 4.0,
        clients_per_chunk: int | str | None = None,
        lr_decay: float = 1.0,
        layer_grouping: str = "tensor",
        track_improvement: bool = False,
        local_autocast: str | None = None,
        history_dtype: str | None = None,
        history_device: str = "model",
        attack: str | None = None,
        attack_client: int = 0,
        attack_strength: float = 10.0,
    ) -> None:
        super().__init__()
        self.run_seed = run_seed(seed, "model.seed")
        self.save_hyperparameters()
        seed = self.run_seed
        if num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1] (1.0 = full participation), got {fraction}")
        if not 0 <= dropout_prob < 1:
            raise ValueError(f"dropout_prob must be in [0, 1), got {dropout_prob}")
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        if engine not in ("auto", "vectorised", "sequential"):
            raise ValueError(f"unknown engine {engine!r}; valid: 'auto', 'vectorised', 'sequential'")
        check_clients_per_chunk(clients_per_chunk)
        if local_autocast not in (None, *AUTOCAST_DTYPES):
            raise ValueError(
                f"unknown local_autocast {local_autocast!r}; valid: null (full precision), "
                + ", ".join(repr(k) for k in AUTOCAST_DTYPES)
            )
        if history_dtype is not None and history_dtype not in _HISTORY_DTYPES:
            raise ValueError(f"unknown history_dtype {history_dtype!r}; valid: {', '.join(_HISTORY_DTYPES)}")
        if history_device not in ("model", "cpu"):
            raise ValueError(f"unknown history_device {history_device!r}; valid: 'model', 'cpu' (offloaded)")
        if attack not in (None, "bias", "scaling"):
            raise ValueError(f"unknown attack {attack!r}; valid: null (no attacker), 'bias', 'scaling'")
        if attack is not None and not (math.isfinite(attack_strength) and attack_client >= 0):
            raise ValueError(
                f"attack_strength must be finite and attack_client a client id >= 0, got "
                f"{attack_strength} and {attack_client}"
            )
        if not 0 < lr_decay <= 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay}")
        self.local_sgd = LocalSGD(lr, momentum, weight_decay, local_epochs, batch_size)
        torch.manual_seed(seed)
        self.model = create_fl_model(backbone, num_classes, tuple(input_shape), **(backbone_kwargs or {}))
        self.layout = ParameterLayout.of(self.model)
        self.layer_slices = layer_slices(self.model, self.layout, layer_grouping)
        self.layer_names = layer_names(self.layout, layer_grouping)
        self.automatic_optimization = False
        # per-layer conflict counts summed between evaluations (buffers: a resumed run
        # reports the same per-layer means as an uninterrupted one)
        self.register_buffer("layer_conflict_sums", torch.zeros(len(self.layer_slices)))
        self.register_buffer("conflict_rounds", torch.zeros((), dtype=torch.long))
        # QPs that the primary solver could not solve (a fallback answered), over the run
        self.register_buffer("qp_fallbacks", torch.zeros((), dtype=torch.long))
        self.last_client_metrics: dict[str, list[float]] = {}
        self._attached_data: Any = None
        self.engine_used: str | None = None
        self.last_chunk_size: int | None = None
        self._chunk_cap: int | None = None  # a chunk size that ran out of memory, halved
        self._host_sizes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # split -> (sizes, CPU copy)
        self.oom_retries = 0

    def save_hyperparameters(self, *args: Any, ignore: Any = None, frame: Any = None, logger: bool = True) -> None:
        """Lightning's, with ``seed`` recorded as the seed used (the run's, when None was
        given); subclasses save again after this class, so every save records it."""
        super().save_hyperparameters(*args, ignore=ignore, frame=frame or inspect.currentframe().f_back,
                                     logger=logger)
        for hparams in (self._hparams, self._hparams_initial):
            hparams["seed"] = self.run_seed

    # ----------------------------------------------------------------- hooks to override
    def client_objective(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        mask: torch.Tensor,
        local_params: dict[str, torch.Tensor],
        global_params: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """Every training client's minibatch loss, shape (m,).

        ``logits`` (m, B, C), ``targets`` and ``mask`` (m, B) (mask 0 = padding), and
        ``local_params`` stacked [m, ...]: one row per client. The default is the mean
        cross-entropy over each client's valid samples.
        """
        return masked_cross_entropy(logits, targets, mask)

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        """The server step d (d,) from the round's uploads; the server applies w <- w - d."""
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate(payload)")

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        """Algorithm bookkeeping after the step is applied (histories, weights, ...)."""

    def evaluation_params(self) -> torch.Tensor | None:
        """The parameters evaluation uses: ``None`` for the global model, a flat (d,)
        vector for another shared model (e.g. AFL's averaged iterate), or (K, d) with
        one model per client (Ditto's personal models, CGSV's agent models)."""
        return None

    # ---------------------------------------------------------------- helpers for hooks
    @property
    def num_clients_total(self) -> int:
        """K, every client of the federation (known once the data module is attached)."""
        return int(self.federated_data.num_clients)

    def register_client_history(self, num_clients: int | None = None, num_parameters: int | None = None) -> None:
        """Every client's last upload and the round it came in (−1 = never): the buffers
        ``history`` (K, d) and ``last_seen`` (K,) that FedFV, FedLF and FedMDFG keep.
        Registered once (``setup`` runs again for every fit/validate/test). ``history``
        is stored in ``history_dtype`` and, with ``history_device="cpu"``, stays in host
        memory when the module moves to a GPU; read and write it with ``history_rows``
        and ``store_history``."""
        if hasattr(self, "history"):
            return
        k = self.num_clients_total if num_clients is None else num_clients
        d = num_parameters or self.layout.num_parameters
        dtype = _HISTORY_DTYPES.get(self.hparams.history_dtype or "", self.dtype)
        offload = self.hparams.history_device == "cpu"
        history = torch.zeros(k, d, dtype=dtype, device="cpu" if offload else self.device)
        if offload and torch.cuda.is_available():
            history = history.pin_memory()  # asynchronous copies to and from the GPU
        self.register_buffer("history", history)
        self.register_buffer("last_seen", torch.full((k,), -1, dtype=torch.long, device=self.device))

    def history_rows(self, clients: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Rows of ``history`` for ``clients``, on ``like``'s device and in its dtype."""
        rows = self.history[clients.to(self.history.device)]
        return rows.to(device=like.device, dtype=like.dtype, non_blocking=True)

    def store_history(self, clients: torch.Tensor, updates: torch.Tensor, round_index: int) -> None:
        """history[clients] <- updates (in the storage dtype/device); last_seen[clients] <- round."""
        self.history[clients.to(self.history.device)] = updates.to(self.history.device, self.history.dtype)
        self.last_seen[clients] = round_index

    def _apply(self, fn: Callable, recurse: bool = True) -> FederatedModule:
        # ``.to(device)``/``.cuda()`` move every buffer; an offloaded history stays on the host
        offloaded = self.hparams.get("history_device") == "cpu" and "history" in self._buffers
        history = self._buffers.pop("history") if offloaded else None
        try:
            super()._apply(fn, recurse)
        finally:
            if offloaded:
                self._buffers["history"] = history
        return self

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also keep the global generators: the per-round streams are pure functions of
        (seed, round), but stochastic layers (dropout, drop-path) draw from the global one."""
        checkpoint["fl_rng"] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["fl_rng"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Per-client state is registered in ``setup`` (it needs K), but ``load_from_checkpoint``
        restores before any setup: register every such buffer with the checkpoint's shape.
        Restores the global generators saved by ``on_save_checkpoint``."""
        for name, value in checkpoint.get("state_dict", {}).items():
            if "." not in name and not hasattr(self, name):
                self.register_buffer(name, torch.empty_like(value, device=self.device))
        rng = checkpoint.get("fl_rng")
        if rng is not None:
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def count_qp_fallbacks(self, count: int) -> None:
        """Record QPs of this round answered by a fallback (``core.qp``: warned, never fatal);
        the run's total is logged every round as ``qp_fallbacks_total``."""
        self.qp_fallbacks += int(count)

    def global_vector(self) -> torch.Tensor:
        """The global model w as a flat vector (d,)."""
        return model_vector(self.model, self.layout)

    def round_lr(self, round_index: int | None = None) -> float:
        """The local learning rate of a round: lr * lr_decay^t."""
        t = self.round_index if round_index is None else round_index
        return self.hparams.lr * self.hparams.lr_decay**t

    # ------------------------------------------------------------------ lightning wiring
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # The server optimizer applies w <- w - d with d placed in .grad (lr 1, plain SGD).
        return torch.optim.SGD(self.model.parameters(), lr=1.0)

    def on_fit_start(self) -> None:
        self.trainer.fit_loop.max_epochs = self.hparams.num_rounds
        self._check_data()
        if self.world_size > 1:
            # every rank logs the same all-gathered values: nothing to reduce across ranks
            warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\(", category=UserWarning)

    def on_validation_start(self) -> None:
        self._check_data()

    def on_test_start(self) -> None:
        self._check_data()

    @property
    def federated_data(self) -> Any:
        """The FederatedDataModule: the trainer's, or one given to ``attach_data``."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        datamodule = datamodule if datamodule is not None else self._attached_data
        if datamodule is None or not hasattr(datamodule, "train_index"):
            raise RuntimeError(
                "FederatedModule needs a FederatedDataModule: call trainer.fit(module, datamodule=...)"
                " (or module.attach_data(datamodule) to use it without a Trainer)"
            )
        return datamodule

    def attach_data(self, datamodule: Any) -> None:
        """Use ``datamodule`` without a Trainer (notebooks, benchmarks of the server step)."""
        self._attached_data = datamodule

    def _check_data(self) -> None:
        data = self.federated_data
        if data.num_classes != self.hparams.num_classes:
            raise ValueError(
                f"the model has {self.hparams.num_classes} classes but the data has {data.num_classes}: "
                "set model.num_classes to match (the CLI links it automatically)"
            )
        if tuple(data.input_shape) != tuple(self.hparams.input_shape):
            raise ValueError(
                f"the model expects inputs {tuple(self.hparams.input_shape)} but the data has "
                f"{tuple(data.input_shape)}: set model.input_shape to match"
            )
        num_clients = int(data.train_sizes.shape[0])
        if self.hparams.attack is not None and self.hparams.attack_client >= num_clients:
            raise ValueError(
                f"attack_client {self.hparams.attack_client} is not a client: there are {num_clients} "
                f"(ids 0..{num_clients - 1}); set model.attack_client to one of them"
            )
        if data.train_x.device != self.device:
            data.to(self.device)

    # --------------------------------------------------------------------------- a round
    @property
    def round_index(self) -> int:
        """0-based index of the round being run (= the Lightning epoch)."""
        return int(self.current_epoch)

    def sample_clients(self, round_index: int, num_clients: int) -> torch.Tensor:
        """S_t: max(1, round(C*K)) clients uniformly without replacement, sorted."""
        m = max(1, round(self.hparams.fraction * num_clients))
        if m >= num_clients:
            return torch.arange(num_clients)
        chosen = torch.randperm(num_clients, generator=round_generator(self.hparams.seed, round_index, "sampling"))
        return chosen[:m].sort().values

    def with_attacker(self, sampled: torch.Tensor) -> torch.Tensor:
        """FedMGDA+ Sec. 6.2.2: the malicious client takes part in every round."""
        attacker = self.hparams.attack_client
        if self.hparams.attack is None or bool((sampled == attacker).any()):
            return sampled
        return torch.cat([sampled, torch.tensor([attacker])]).sort().values

    def attack_payload(self, payload: RoundPayload) -> RoundPayload:
        """The malicious client's report: its loss + b (bias), or its loss and update × s (scaling)."""
        if self.hparams.attack is None:
            return payload
        row = payload.clients == self.hparams.attack_client
        if not bool(row.any()):
            return payload
        strength = self.hparams.attack_strength
        losses = payload.losses.clone()
        if self.hparams.attack == "bias":
            losses[row] += strength
            return replace(payload, losses=losses)
        losses[row] *= strength
        updates = payload.updates
        updates[row] *= strength  # J is this round's own tensor: scaled in place
        return replace(payload, losses=losses, updates=updates)

    def drop_clients(self, round_index: int, sampled: torch.Tensor) -> torch.Tensor:
        """The sampled clients that answer; each fails with probability ``dropout_prob``."""
        if self.hparams.dropout_prob == 0:
            return sampled
        draws = torch.rand(len(sampled), generator=round_generator(self.hparams.seed, round_index, "dropout"))
        return sampled[draws >= self.hparams.dropout_prob]

    def client_shards(self, clients: torch.Tensor, split: str = "train") -> ClientShards:
        """The data of ``clients`` (ids on the CPU). Loop bounds come from a host copy of the
        client sizes, so building a round's shards never waits for the device."""
        data = self.federated_data
        all_sizes = getattr(data, f"{split}_sizes")
        cached = self._host_sizes.get(split)
        if cached is None or cached[0] is not all_sizes:
            cached = self._host_sizes[split] = (all_sizes, all_sizes.cpu())
        sizes_cpu = cached[1][clients.cpu()].tolist()
        on_device = clients.to(data.train_x.device)
        sizes = all_sizes[on_device]
        index = getattr(data, f"{split}_index")[on_device][:, : max(sizes_cpu)]
        return ClientShards(
            getattr(data, f"{split}_x"), getattr(data, f"{split}_y"), index, sizes, sizes_cpu,
            on_device,
        )

    def local_train(
        self,
        round_index: int,
        shards: ClientShards,
        start: dict[str, torch.Tensor] | None = None,
        anchor: dict[str, torch.Tensor] | None = None,
        sgd: LocalSGD | None = None,
    ) -> dict[str, torch.Tensor]:
        """Local SGD of the shards' clients, stacked [m, ...] results.

        ``start`` defaults to the global model (shared); pass stacked [m, ...] tensors
        to start every client from its own model (``anchor``, default the global model,
        is what proximal terms pull towards). ``sgd`` overrides the local SGD settings
        (its lr is used as given; by default the module's, with this round's lr).
        Under DDP every rank trains its own block of the clients and the results are
        all-gathered (``across_ranks``), so every rank returns all m clients.
        """
        sgd = sgd or replace(self.local_sgd, lr=self.round_lr(round_index))
        order = batch_order(
            shards.sizes, shards.index.shape[1], sgd.epochs,
            round_generator(self.hparams.seed, round_index, "shuffle"),
        )
        global_params = {n: p for n, p in self.model.named_parameters() if n in self.layout.names}
        start = global_params if start is None else start
        anchor = global_params if anchor is None else anchor
        if self.world_size == 1:
            return self._train_engine(shards, order, start, anchor, sgd)
        per_client_start = is_stacked_start(start, self.layout)

        def train_block(rows: slice) -> tuple[torch.Tensor]:
            block_start = {n: v[rows] for n, v in start.items()} if per_client_start else start
            trained = self._train_engine(shards.rows(rows), order[:, rows], block_start, anchor, sgd)
            return (self.layout.flatten_stacked(trained),)

        (flat,) = self.across_ranks(shards.num_clients, train_block)
        return self.layout.unflatten_stacked(flat)

    def _train_engine(
        self,
        shards: ClientShards,
        order: torch.Tensor,
        start: dict[str, torch.Tensor],
        anchor: dict[str, torch.Tensor],
        sgd: LocalSGD,
    ) -> dict[str, torch.Tensor]:
        """Runs the chosen engine on these shards (this process's share of the round)."""
        chunk = self.hparams.clients_per_chunk
        if self._chunk_cap is not None:
            chunk = self._chunk_cap if chunk in (None, "auto") else min(chunk, self._chunk_cap)
        engine = choose_engine(
            self.hparams.engine,
            shards.num_clients,
            self.layout.num_parameters,
            int(self.hparams.engine_memory_budget_gb * 2**30),
            chunk,
            self.hparams.local_autocast,
        )
        self.engine_used = engine.name
        trained = engine.train(self.model, self.layout, start, shards, order, sgd, self.client_objective, anchor=anchor)
        self.last_chunk_size = engine.chunk_size
        if engine.oom_retries:
            self.oom_retries += engine.oom_retries
            self._chunk_cap = engine.chunk_size
        return trained

    # ---------------------------------------------------------------- clients across ranks
    @property
    def world_size(self) -> int:
        """Processes sharing the clients of a round (Lightning's DDP world size)."""
        return int(self.trainer.world_size) if self._trainer is not None else 1

    @property
    def _ddp_params_and_buffers_to_ignore(self) -> list[str]:
        # Read by DistributedDataParallel when it wraps the module: every rank computes
        # the same buffers (the aggregation is deterministic), so DDP must not broadcast
        # them each step (K x d histories, possibly offloaded to host memory).
        return [name for name, _ in self.named_buffers()]

    def across_ranks(
        self, num_rows: int, work: Callable[[slice], tuple[torch.Tensor, ...]]
    ) -> tuple[torch.Tensor, ...]:
        """Runs ``work(rows)`` on this rank's contiguous block of ``num_rows`` clients and
        all-gathers the results (each with one leading row per client) in client order.

        Block r is rows [r*b, (r+1)*b) with b = ceil(num_rows / world_size), so ranks
        agree on the split without talking; a rank whose block is empty computes one row
        and drops it, so that every rank joins every all-gather with the same shape.
        """
        world = self.world_size
        if world == 1:
            return work(slice(0, num_rows))
        block = -(-num_rows // world)
        first = min(num_rows, self.trainer.global_rank * block)
        last = min(num_rows, first + block)
        results = work(slice(first, last)) if last > first else tuple(r[:0] for r in work(slice(0, 1)))
        gathered = []
        for rows in results:
            padded = rows.new_zeros((block, *rows.shape[1:]))
            padded[: rows.shape[0]] = rows
            stacked = self.trainer.strategy.all_gather(padded)  # (world, block, ...)
            gathered.append(stacked.reshape(world * block, *rows.shape[1:])[:num_rows])
        return tuple(gathered)

    def evaluate_shards(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                        index: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``evaluate_clients`` of a shared model, with the clients split across ranks."""
        def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            return evaluate_clients(model, x, y, index[rows], sizes[rows])
        losses, accuracies = self.across_ranks(int(sizes.shape[0]), block)
        return losses, accuracies

    def evaluate_stacked_shards(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                                index: torch.Tensor, sizes: torch.Tensor,
                                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``evaluate_clients_stacked`` (client k under its own model ``params[k]``), split across ranks."""
        def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            return evaluate_clients_stacked(self.model, self.layout, params[rows], x, y, index[rows], sizes[rows],
                                            weights=None if weights is None else weights[rows])
        losses, accuracies = self.across_ranks(int(sizes.shape[0]), block)
        return losses, accuracies

    def train_clients(self, round_index: int, shards: ClientShards) -> torch.Tensor:
        """Local training from the global model; returns J (m, d) with g_i = w - w_i."""
        trained = self.local_train(round_index, shards)
        return self.layout.flatten_stacked(trained).neg_().add_(self.global_vector())  # w − w_i, in place

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        t = self.round_index
        data = self.federated_data
        sampled = self.with_attacker(self.sample_clients(t, int(data.train_sizes.shape[0])))
        answered = self.drop_clients(t, sampled)
        metrics: dict[str, float] = {
            "clients_sampled": float(len(sampled)),
            "clients_answered": float(len(answered)),
        }
        if len(answered) == 0:
            self.print(f"round {t + 1}: no sampled client answered; the global model is kept")
            self.log_round(metrics | {"clients_aggregated": 0.0})
            return

        self._sync()
        started = time.perf_counter()
        shards = self.client_shards(answered)
        losses, accuracies = self.evaluate_shards(self.model, shards.x, shards.y, shards.index, shards.sizes)
        updates = self.train_clients(t, shards)
        self._sync()
        client_time = time.perf_counter() - started

        payload = RoundPayload(t, answered.to(self.device), updates, losses, accuracies, shards.sizes, shards)
        payload = self.attack_payload(payload)
        finite = finite_rows(payload.updates)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            bad = payload.clients[~finite].tolist()
            self.print(f"round {t + 1}: left out clients {bad}: their updates hold NaN or inf")
            payload = payload.select(finite)
        metrics |= {
            "clients_nonfinite": float(num_nonfinite),
            # kept, but algorithms must not divide by their norm (tests/test_faults.py)
            "clients_zero_update": float((payload.updates.abs().amax(dim=1) == 0).sum()) if payload.num_clients else 0.0,
            "clients_aggregated": float(payload.num_clients),
            "train_loss": float(losses.mean()),
            "train_acc": float(accuracies.mean()),
            "client_time_s": client_time,
            "engine_vectorised": float(self.engine_used == "vectorised"),
            "chunk_size": float(self.last_chunk_size or 0),
            "oom_retries": float(self.oom_retries),
        }
        if payload.num_clients == 0:
            self.log_round(metrics)
            return

        started = time.perf_counter()
        server_step = self.aggregate(payload)
        self._sync()
        metrics["server_time_s"] = time.perf_counter() - started
        metrics["qp_fallbacks_total"] = float(self.qp_fallbacks)
        if not torch.isfinite(server_step).all():
            self.print(f"round {t + 1}: the server step is not finite; the global model is kept")
            metrics["server_step_nonfinite"] = 1.0
            self.log_round(metrics)
            return
        metrics |= self._conflict_metrics(payload.updates, server_step)
        self.apply_server_step(server_step)
        self.on_round_end(payload, server_step)
        metrics["server_step_norm"] = float(server_step.norm())
        if self.hparams.track_improvement:
            metrics["improved_fraction"] = self._improved_fraction(payload)
        self.log_round(metrics)

    def _conflict_metrics(self, updates: torch.Tensor, server_step: torch.Tensor) -> dict[str, float]:
        """FedLF Table 4: clients whose update conflicts with the step, model and layers."""
        model_level, per_layer = conflict_counts(updates, server_step, self.layer_slices)
        self.layer_conflict_sums += torch.tensor(per_layer, dtype=self.layer_conflict_sums.dtype,
                                                 device=self.layer_conflict_sums.device)
        self.conflict_rounds += 1
        return {
            "conflicts_model": float(model_level),
            "conflicts_layer_mean": sum(per_layer) / max(1, len(per_layer)),
            "conflicts_layer_max": float(max(per_layer, default=0)),
        }

    def _improved_fraction(self, payload: RoundPayload) -> float:
        """FedMGDA+ footnote 6: share of participants whose training loss did not increase."""
        shards = payload.shards
        losses_after, _ = self.evaluate_shards(self.model, shards.x, shards.y, shards.index, shards.sizes)
        return float((losses_after <= payload.losses).float().mean())

    def apply_server_step(self, server_step: torch.Tensor) -> None:
        """w <- w - d, through the server optimizer (so global_step counts applied rounds)."""
        optimizer = self.optimizers()
        params = dict(self.model.named_parameters())
        for name, piece in self.layout.unflatten(server_step).items():
            params[name].grad = piece.detach().to(params[name].dtype).clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def log_round(self, metrics: dict[str, float]) -> None:
        """Log metrics of this round with step = rounds completed (algorithms may call it too)."""
        self.log_dict(
            {**metrics, "round": float(self.round_index + 1), "step": float(self.round_index + 1)},
            on_step=False,
            on_epoch=True,
            batch_size=1,
        )

    # ------------------------------------------------------------------------ evaluation
    def _rounds_completed(self) -> int:
        """Rounds done when evaluating: inside fit the current round has just finished."""
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        return self.round_index + 1 if fitting else self.round_index

    def _is_eval_round(self) -> bool:
        if self.trainer.sanity_checking:
            return False
        if self.trainer.state.fn != "fit":
            return True
        done = self._rounds_completed()
        return done % self.hparams.eval_every == 0 or done == self.hparams.num_rounds

    def evaluate_all_clients(self) -> dict[str, float]:
        """Every client's test loss/accuracy (local test sets, or the shared test set when
        clients have their own models and no local test), their fairness summary, and the
        shared test set under the shared model."""
        data = self.federated_data
        params = self.evaluation_params()
        per_client = params is not None and params.dim() == 2
        shared = self._shared_eval_model(None if per_client else params)
        metrics: dict[str, float] = {}
        client_sets = None
        if getattr(data, "test_class_weights", None) is not None:
            losses, accuracies, num_test = self._evaluate_label_matched(data, params if per_client else None, shared)
            metrics |= fairness_summary(accuracies, prefix="test_acc_")
            metrics["test_loss_mean"] = float(losses.mean())
            self.last_client_metrics = {
                "client": list(range(len(accuracies))),
                "test_accuracy": accuracies.tolist(),
                "test_loss": losses.tolist(),
                "num_train": data.train_sizes.tolist(),
                "num_test": num_test.tolist(),
            }
        elif int(data.test_sizes.sum()) > 0:
            client_sets = (data.test_x, data.test_y, data.test_index, data.test_sizes)
        elif per_client and data.global_test_x is not None:
            n = data.global_test_y.shape[0]
            everything = torch.arange(n, device=data.global_test_x.device).expand(params.shape[0], n)
            client_sets = (data.global_test_x, data.global_test_y, everything,
                           torch.full((params.shape[0],), n, device=everything.device))
        if client_sets is not None:
            if per_client:
                losses, accuracies = self.evaluate_stacked_shards(params, *client_sets)
            else:
                losses, accuracies = self.evaluate_shards(shared, *client_sets)
            has_test = client_sets[3] > 0
            metrics |= fairness_summary(accuracies[has_test], prefix="test_acc_")
            metrics["test_loss_mean"] = float(losses[has_test].mean())
            self.last_client_metrics = {
                "client": list(range(len(accuracies))),
                "test_accuracy": accuracies.tolist(),
                "test_loss": losses.tolist(),
                "num_train": data.train_sizes.tolist(),
                "num_test": client_sets[3].tolist(),
            }
        if data.global_test_x is not None:
            n = data.global_test_y.shape[0]
            everything = torch.arange(n, device=data.global_test_x.device).unsqueeze(0)
            loss, acc = evaluate_clients(
                shared, data.global_test_x, data.global_test_y, everything,
                torch.tensor([n], device=everything.device),
            )
            metrics |= {"global_test_acc": float(acc[0]), "global_test_loss": float(loss[0])}
        if int(self.conflict_rounds):
            means = (self.layer_conflict_sums / self.conflict_rounds).tolist()
            metrics |= {f"conflicts_layer/{name}": float(v) for name, v in zip(self.layer_names, means)}
            self.layer_conflict_sums.zero_()
            self.conflict_rounds.zero_()
        return metrics

    def _evaluate_label_matched(self, data: Any, params: torch.Tensor | None, shared: torch.nn.Module
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``test_mode="matched"``: client k's loss and accuracy are sum_c p_k(c) v_k(c), its model's
        class-wise values on the shared test set weighted by its own training labels; and the
        number of shared test samples in the classes it holds."""
        weights = data.test_class_weights
        class_sizes = data.global_test_class_sizes
        num_test = (weights > 0).to(class_sizes.dtype) @ class_sizes
        if params is None:  # one shared model: its class-wise values once, then weighted per client
            class_losses, class_accuracies = evaluate_clients(
                shared, data.global_test_x, data.global_test_y, data.global_test_class_index, class_sizes)
            return label_matched(class_losses, weights), label_matched(class_accuracies, weights), num_test
        n = data.global_test_y.shape[0]
        everything = torch.arange(n, device=data.global_test_x.device).expand(params.shape[0], n)
        per_sample = weights[:, data.global_test_y] / class_sizes[data.global_test_y].clamp_min(1)
        losses, accuracies = self.evaluate_stacked_shards(
            params, data.global_test_x, data.global_test_y, everything,
            torch.full((params.shape[0],), n, device=everything.device), weights=per_sample)
        return losses, accuracies, num_test

    def _shared_eval_model(self, flat: torch.Tensor | None) -> torch.nn.Module:
        """The global model, or a copy of it holding another shared parameter vector."""
        if flat is None:
            return self.model
        model = copy.deepcopy(self.model)
        assign_model_vector(model, self.layout, flat)
        return model

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self._is_eval_round():
            return
        metrics = self.evaluate_all_clients()
        self.log_dict({**metrics, "step": float(self._rounds_completed())}, batch_size=1)
        shown = {k: metrics[k] for k in ("test_acc_mean", "global_test_acc") if k in metrics}
        self.log_dict({f"{k}_now": v for k, v in shown.items()}, prog_bar=True, logger=False, batch_size=1)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log_dict(self.evaluate_all_clients(), batch_size=1)
