"""Local training engines: every sampled client runs E epochs of SGD from the global model.

Two engines compute the same thing:

* ``VectorisedEngine`` trains all clients of a round in lockstep: parameters are stacked
  into tensors [m, ...], one forward pass evaluates every client's minibatch loss under
  its own parameters, and one backward pass gives every client's gradient. The forward
  pass is the model's stacked form (``fl_lightning.models.stacked``: batched matmuls and
  grouped convolutions, plain autograd) when every submodule has a stacked rule, and
  ``torch.func.vmap`` over ``functional_call`` otherwise; fully connected nets under the
  plain mean cross-entropy skip autograd with hand-derived gradients (``core.fused``).
  Clients are ordered by their number of steps so that, at step s, the clients that still
  have a batch form a prefix of the stack: later steps only touch that prefix (slices are
  views, updates are in place), so a client with 3 batches costs 3 steps of work, not
  ``max_steps``.
* ``SequentialEngine`` loops over clients with an ordinary module and ``torch.optim.SGD``.
  It serves models or memory sizes that vmap cannot and is the reference the tests hold
  the vectorised engine to.

Both engines draw their minibatches from the same ``batch_order`` (``core.local``) so they
agree to float rounding. Each client does exactly E passes over its own n_i samples with batch
size B (the last batch of an epoch may be smaller; ``batch_size=None`` is full batch).
``core.engine_runner`` picks one for a round and runs it across DDP ranks, halving the clients
stacked at once after an out-of-memory error and remembering the size that fitted.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn
from torch.func import functional_call, vmap

from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.fused import FeedForwardGradients, feedforward_gradients, mean_weights
from fl_lightning.core.local import ClientObjective, ClientShards, LocalSGD, steps_per_epoch
from fl_lightning.core.settings import (
    ChunkSize,
    OptionalAutocast,
    check_setting,
)
from fl_lightning.models.stacked import StackedForward, stacked_forward


def stack_for_clients(params: dict[str, torch.Tensor], m: int) -> dict[str, torch.Tensor]:
    """Broadcast the global parameters into independent stacked copies [m, ...]."""
    return {name: p.detach().unsqueeze(0).repeat(m, *([1] * p.dim())) for name, p in params.items()}


def is_stacked_start(start: dict[str, torch.Tensor], layout: ParameterLayout) -> bool:
    """Does ``start`` hold one model per client ([m, ...] tensors) rather than a shared one?"""
    return start[layout.names[0]].dim() == len(layout.shapes[0]) + 1


def resolve_start(
    start: dict[str, torch.Tensor],
    anchor: dict[str, torch.Tensor] | None,
    m: int,
    layout: ParameterLayout,
) -> tuple[bool, dict[str, torch.Tensor]]:
    """Is ``start`` stacked per client ([m, ...]) or shared? And the detached anchor."""
    first = layout.names[0]
    is_stacked = is_stacked_start(start, layout)
    if is_stacked and start[first].shape[0] != m:
        raise ValueError(f"stacked start has {start[first].shape[0]} clients, the shards have {m}")
    if anchor is None:
        if is_stacked:
            raise ValueError("a stacked (per-client) start needs an explicit anchor (the global model)")
        anchor = start
    return is_stacked, {n: anchor[n].detach() for n in layout.names}


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_context(device: torch.device, autocast: str | None) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass and the loss (``None``: full precision).

    Parameters, gradients and the SGD update stay in the parameters' dtype; only the
    matmuls/convolutions run in bf16 (or fp16 on a GPU)."""
    if autocast is None:
        return contextlib.nullcontext()
    check_setting("local_autocast", autocast, OptionalAutocast)
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[autocast])


def auto_chunk_size(num_clients: int, num_parameters: int, device: torch.device) -> int:
    """How many clients to stack at once when ``clients_per_chunk="auto"``.

    Each stacked client costs about 16 bytes per parameter (parameters, gradients,
    momentum, the copy into the result). On a GPU the chunk takes half the free memory
    (the rest is left to activations; an out-of-memory error halves it again, see
    ``VectorisedEngine``). On a CPU, stacks that stay within ~32 MB (a last-level cache)
    are faster than one huge stack: every step reads and writes every client's parameters
    (``fl_mlp``, 100 clients on 2 cores: 0.16 s a round at once, 0.074 s in chunks of 10).
    """
    per_client = 16 * num_parameters
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free // 2
    else:
        budget = 32 * 2**20
    return max(1, min(num_clients, budget // per_client))


def is_out_of_memory(error: BaseException) -> bool:
    """An allocation failure: ``torch.OutOfMemoryError``, the allocator's RuntimeError, or
    Python's MemoryError (host memory)."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


FORWARD_KINDS = ("auto", "stacked", "vmap")
# an epoch's minibatches are gathered at once (one copy of the inputs, in step order) when they
# take at most this much memory; larger ones are gathered step by step
EPOCH_GATHER_BYTES = 64 * 2**20


def lockstep_batches(x: torch.Tensor, y: torch.Tensor, samples: torch.Tensor, valid: torch.Tensor,
                     active: list[int], padded: list[bool], width: int, lone_unstacked: bool = False,
                     targets: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> Any:
    """Every lockstep step's minibatch of its active prefix of clients, in order:
    ``(xb [a, B, ...], yb [a, B], mask [a, B], None)``. With ``targets`` (for hand-derived
    gradients), ``(xb, targets(yb, weights), None, weights)``: ``weights`` [a, B, 1] is each
    client's mask over its number of valid samples in the batch (the mean's weights), and the
    targets carry the mask. With ``lone_unstacked``, a step of one client has no client
    dimension (``xb`` [B, ...]).

    ``samples`` (m, n): each client's shuffled sample ids, ``valid`` (m, n): 1 on the first n_i
    positions. A position past a client's n_i points at another client's sample: its inputs
    are blanked, so that a non-finite sample can only ever affect its own client. When the
    epoch fits in ``EPOCH_GATHER_BYTES``, its batches are gathered in one ``index_select``, in
    step order, and the steps are views of it, made a run of equal-sized steps at a time
    (per-step dispatch is what small models pay for); otherwise each step gathers its own."""
    m, steps = samples.shape[0], len(active)
    sample_bytes = x[0].numel() * x.element_size() if x.shape[0] else 0
    if sum(active) * width * sample_bytes > EPOCH_GATHER_BYTES:
        for s, a in enumerate(active):
            ids = samples[:a, s * width:(s + 1) * width]
            rows = ids.reshape(-1)  # index_select: much cheaper than x[ids] on a CPU
            xb = x.index_select(0, rows).view(*ids.shape, *x.shape[1:])
            yb, mask = y.index_select(0, rows).view(ids.shape), valid[:a, s * width:(s + 1) * width]
            if padded[s]:
                xb = torch.where(mask.view(*mask.shape, *[1] * (xb.dim() - 2)) > 0, xb, 0.0)
            if targets is None:
                yield xb, yb, mask, None
                continue
            step_weights = mean_weights(mask)
            step_targets = targets(yb, step_weights)
            if a == 1 and lone_unstacked:
                yield xb[0], step_targets[0], None, step_weights[0]
            else:
                yield xb, step_targets, None, step_weights
        return
    span = steps * width  # every step's columns, the last batch padded to a full width
    extra = span - samples.shape[1]
    if extra > 0:
        samples, valid = (torch.nn.functional.pad(samples, (0, extra)),
                          torch.nn.functional.pad(valid, (0, extra)))
    samples, valid = samples[:, :span], valid[:, :span]
    # live[s, i]: client i still has a batch at step s (a prefix of the clients)
    live = torch.arange(m, device=samples.device) < torch.tensor(active, device=samples.device).unsqueeze(1)
    step_ids = samples.reshape(m, steps, width).transpose(0, 1)[live]  # (sum of a, B), step by step
    step_mask = valid.reshape(m, steps, width).transpose(0, 1)[live]
    rows = step_ids.reshape(-1)
    xs, ys = x.index_select(0, rows), y.index_select(0, rows)
    if any(padded):  # blank the few padded positions (a partial last batch per client)
        xs.index_fill_(0, (step_mask.reshape(-1) == 0).nonzero().squeeze(1), 0.0)
    if targets is None:  # the objective masks its own mean: no weights
        columns: tuple[torch.Tensor | None, ...] = (ys.view(step_mask.shape), step_mask, None)
    else:  # the targets carry the mask: none is yielded
        weights = mean_weights(step_mask)
        columns = (targets(ys.view(step_mask.shape), weights), None, weights)
    first = 0
    for a, run in itertools.groupby(active):  # active descends: runs of steps with equal a
        count = len(list(run))
        last = first + count * a
        steps_shape: tuple[int, ...] = (count, width) if a == 1 and lone_unstacked else (count, a, width)
        yield from zip(xs[first * width:last * width].view(*steps_shape, *x.shape[1:]).unbind(0),
                       *(itertools.repeat(None) if column is None
                         else column[first:last].view(*steps_shape, *column.shape[2:]).unbind(0) for column in columns))
        first = last


StepForward = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


def sgd_step(
    params: list[torch.Tensor], grads: list[torch.Tensor], momentum: list[torch.Tensor] | None, sgd: LocalSGD
) -> None:
    """One in-place SGD step over tensor lists with ``torch._foreach_*`` (one fused kernel
    launch per operation instead of a Python loop over tensors), with
    ``torch.optim.SGD``'s semantics: d = g + λw; with momentum μ, b ← μb + d (dampening 0;
    b starts at 0, so the first step stores d as ``SGD`` does); w ← w − lr·(b or d)."""
    if sgd.weight_decay:
        grads = list(torch._foreach_add(grads, params, alpha=sgd.weight_decay))
    if momentum is not None:
        torch._foreach_mul_(momentum, sgd.momentum)
        torch._foreach_add_(momentum, grads)
        grads = momentum
    torch._foreach_add_(params, grads, alpha=-sgd.lr)


@torch.no_grad()
def fused_epoch(gradients: FeedForwardGradients, params: dict[str, torch.Tensor], momentum: list[torch.Tensor] | None,
                active: list[int], batches: Any, sgd: LocalSGD) -> None:
    """One epoch of lockstep steps with hand-derived gradients (``core.fused``), in place. The
    views of each prefix of clients are made once; a client left alone at the end of the epoch
    (the long tail of a skewed partition) steps with 2-D products on its own parameters."""
    prefixes: dict[int, tuple[list[torch.Tensor], list[torch.Tensor] | None, list]] = {}
    for a, (xb, negative_targets, _, weights) in zip(active, batches):
        if a not in prefixes:
            cut = 0 if a == 1 else slice(0, a)  # one client: its own parameters, no client dimension
            prefix = [p[cut] for p in params.values()]
            prefixes[a] = (prefix, None if momentum is None else [b[cut] for b in momentum],
                           gradients.layer_views(prefix))
        prefix, momentum_prefix, views = prefixes[a]
        sgd_step(prefix, gradients.step(prefix, xb, negative_targets, weights, views), momentum_prefix, sgd)


class LocalTrainingEngine(Protocol):
    """What the vectorised and the sequential engine share: ``train`` runs local SGD of a round's
    clients and returns their trained parameters stacked [m, ...]; ``name``, ``chunk_size`` and
    ``oom_retries`` say how (``core.engine_runner.EngineRunner`` logs them)."""

    @property
    def name(self) -> str: ...

    @property
    def chunk_size(self) -> int | None: ...

    @property
    def oom_retries(self) -> int: ...

    def train(self, model: nn.Module, layout: ParameterLayout, start: dict[str, torch.Tensor], shards: ClientShards,
              order: torch.Tensor, sgd: LocalSGD, objective: ClientObjective,
              anchor: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Local SGD of ``shards``' clients from ``start`` (shared, or stacked [m, ...] per client) in
        the batch ``order`` (epochs, m, n); ``anchor`` is what a proximal term pulls towards."""
        ...


class VectorisedEngine:
    """All clients of a round in lockstep (see module docstring).

    Args:
        clients_per_chunk: how many clients train together; ``None`` = all of the round's
            clients at once, ``"auto"`` = ``auto_chunk_size``. On a CPU, chunks whose
            stacked parameters fit in the cache are faster than one huge stack (each
            step reads and writes every client's parameters); on a GPU, larger is better
            until memory runs out. When a chunk runs out of memory it is retried in
            halves (``oom_retries`` counts them), down to one client at a time.
        autocast: ``None``, ``"bf16"`` or ``"fp16"``: mixed precision for the forward pass.
        forward: ``"auto"`` (hand-derived gradients for a feed-forward net under the plain
            mean cross-entropy, ``core.fused``; else the model's stacked form when it has one,
            else vmap), ``"stacked"`` (required: an error says which submodule has no rule) or
            ``"vmap"``.

    After ``train``, ``chunk_size`` is the chunk size that was used (the last one that
    fitted in memory), ``forward_kind`` is ``"fused"``, ``"stacked"`` or ``"vmap"`` and
    ``forward_reason`` says why vmap was used (None otherwise).
    """

    name = "vectorised"

    def __init__(
        self, clients_per_chunk: int | str | None = None, autocast: str | None = None, forward: str = "auto"
    ) -> None:
        check_setting("clients_per_chunk", clients_per_chunk, ChunkSize)
        autocast_context(torch.device("cpu"), autocast)  # validates the name
        if forward not in FORWARD_KINDS:
            raise ValueError(f"unknown forward {forward!r}; valid: {', '.join(map(repr, FORWARD_KINDS))}")
        self.clients_per_chunk = clients_per_chunk
        self.autocast = autocast
        self.forward = forward
        self.chunk_size: int | None = None
        self.oom_retries = 0
        self.forward_kind: str | None = None
        self.forward_reason: str | None = None

    def step_forward(self, model: nn.Module, names: list[str] | None = None,
                     objective: ClientObjective | None = None) -> StackedForward | FeedForwardGradients | None:
        """How a step computes every client's gradient: hand-derived gradients (``core.fused``,
        with ``forward="auto"`` where they apply to ``model`` and ``objective``), the stacked
        forward of ``model``, or None for vmap (``forward_kind``/``forward_reason`` record which
        and why)."""
        if self.forward == "auto" and names is not None and objective is not None:
            fused, _ = feedforward_gradients(model, names, objective, self.autocast)
            if fused is not None:
                self.forward_kind, self.forward_reason = "fused", None
                return fused
        stacked: StackedForward | None
        reason: str | None
        if self.forward == "vmap":
            stacked, reason = None, "forward='vmap' was asked for"
        else:
            stacked, reason = stacked_forward(model)
            if stacked is None and self.forward == "stacked":
                raise ValueError(f"forward='stacked' but the model has no stacked form: {reason}; "
                                 "register a rule (fl_lightning.models.stacked.register_stacked_rule) "
                                 "or use forward='auto' to fall back to vmap")
        self.forward_kind, self.forward_reason = ("vmap", reason) if stacked is None else ("stacked", None)
        return stacked

    def train(self, model: nn.Module, layout: ParameterLayout, start: dict[str, torch.Tensor], shards: ClientShards,
              order: torch.Tensor, sgd: LocalSGD, objective: ClientObjective,
              anchor: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Trains every client from ``start`` and returns their parameters, stacked [m, ...]
        in the input order.

        ``start`` holds either shared tensors (every client starts from the same model)
        or stacked [m, ...] tensors (each client from its own, e.g. personal models);
        ``anchor`` (default: a shared ``start``) is what the objective's proximal terms
        see as the global model.
        """
        m = shards.num_clients
        steps = steps_per_epoch(shards.sizes_cpu, sgd.batch_size)
        # Most steps first: chunks hold clients with similar step counts, and inside a
        # chunk the clients that still have a batch at step s are a prefix of the stack.
        by_steps = sorted(range(m), key=lambda k: -steps[k])
        if self.clients_per_chunk == "auto":
            chunk = auto_chunk_size(m, layout.num_parameters, shards.x.device)
        else:
            chunk = min(m, int(self.clients_per_chunk or m))
        is_stacked, anchor = resolve_start(start, anchor, m, layout)
        forward = self.step_forward(model, list(layout.names), objective)
        trained = {n: torch.empty(m, *p.shape, dtype=p.dtype, device=p.device) for n, p in anchor.items()}
        first = 0
        while first < m:
            members = by_steps[first : first + chunk]
            rows = torch.tensor(members, device=shards.index.device)
            order_rows = torch.tensor(members, device=order.device)
            # clients already in step order (e.g. equal shards) train in place in ``trained``
            in_place = members == list(range(first, first + len(members)))
            try:
                if in_place:
                    chunk_start = {n: trained[n][first : first + len(members)] for n in layout.names}
                    for n, p in chunk_start.items():
                        p.copy_(start[n].detach()[first : first + len(members)] if is_stacked else start[n].detach())
                elif is_stacked:  # indexing copies: the chunk owns its parameters
                    chunk_start = {n: start[n].detach()[rows.to(start[n].device)] for n in layout.names}
                else:
                    chunk_start = stack_for_clients({n: start[n] for n in layout.names}, len(members))
                chunk_params = self.train_lockstep(
                    model, chunk_start, anchor,
                    # index_select: advanced indexing (``index[rows]``) costs ~1 ms on a CPU here
                    shards.x, shards.y, shards.index.index_select(0, rows), shards.sizes.index_select(0, rows),
                    [shards.sizes_cpu[k] for k in members], [steps[k] for k in members],
                    order.index_select(1, order_rows), sgd, objective, self.autocast, forward,
                )
            except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
                if not is_out_of_memory(error) or chunk == 1:
                    raise
                chunk_start = {}  # free the failed chunk before retrying
                if shards.x.device.type == "cuda":
                    torch.cuda.empty_cache()
                chunk = max(1, chunk // 2)
                self.oom_retries += 1
                warnings.warn(f"out of memory training {len(members)} clients at once; retrying in chunks of {chunk}",
                              stacklevel=2)
                continue  # the same clients again, in smaller chunks (nothing of theirs was kept)
            for n, p in chunk_params.items():
                if not (in_place and p is chunk_start[n]):  # else: already in place
                    trained[n].index_copy_(0, rows.to(p.device), p)
            first += len(members)
        self.chunk_size = chunk
        return trained

    @staticmethod
    def train_lockstep(
        model: nn.Module,
        params: dict[str, torch.Tensor],
        anchor: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        index: torch.Tensor,
        sizes: torch.Tensor,
        sizes_cpu: list[int],
        steps: list[int],
        order: torch.Tensor,
        sgd: LocalSGD,
        objective: ClientObjective,
        autocast: str | None = None,
        stacked: StackedForward | FeedForwardGradients | None = None,
    ) -> dict[str, torch.Tensor]:
        """Local SGD of one chunk of clients sorted by descending ``steps``, all stacked together;
        ``params`` (stacked, owned by this call) are updated in place and returned. ``train`` calls it
        chunk by chunk and halves the chunk when it runs out of memory (wrap it to inject that fault).
        ``stacked``: the model's stacked forward (None: vmap over ``functional_call``), or
        hand-derived gradients (``core.fused``) that replace forward, objective and autograd."""
        device = x.device
        width = index.shape[1] if sgd.batch_size is None else min(sgd.batch_size, index.shape[1])
        # active[s]: clients that still have a batch at step s (a prefix, as steps descend);
        # padded[s]: step s holds some client's last, partial batch. Both are known on the
        # host, so full batches skip the masking work without waiting for the device.
        active, padded = [0] * steps[0], [False] * steps[0]
        for n, k in zip(sizes_cpu, steps):
            active[k - 1] += 1
            padded[k - 1] = padded[k - 1] or n % width != 0
        for s in reversed(range(len(active) - 1)):
            active[s] += active[s + 1]
        positions = torch.arange(index.shape[1], device=device)
        valid = (positions < sizes.unsqueeze(1)).to(x.dtype)  # (m, max_n): the first n_i positions
        names = list(params)
        momentum = [torch.zeros_like(p) for p in params.values()] if sgd.momentum else None

        # The forward pass runs every client under its own parameters; the objective sees
        # batched logits, and one backward pass of the summed losses gives every client's
        # own gradient (client i's loss depends on its parameters alone).
        forward: StepForward
        gradients: FeedForwardGradients | None = None  # set: no forward, no autograd (core.fused)
        if isinstance(stacked, FeedForwardGradients):
            gradients = stacked
        elif stacked is not None:
            forward = stacked
        else:
            buffers = dict(model.named_buffers())
            forward = vmap(
                lambda p, xb: functional_call(model, (p, buffers), (xb,)), randomness="different"
            )

        for epoch in range(sgd.epochs):
            samples = index.gather(1, order[epoch].to(device))  # (m, max_n) sample ids, shuffled
            if gradients is not None:
                batches = lockstep_batches(x.flatten(1), y, samples, valid, active, padded, width,
                                           lone_unstacked=True, targets=gradients.negative_targets)
                fused_epoch(gradients, params, momentum, active, batches, sgd)
                continue
            batches = lockstep_batches(x, y, samples, valid, active, padded, width)
            prefixes: dict[int, tuple[list[torch.Tensor], list[torch.Tensor] | None]] = {}
            for a, (xb, yb, mask, _) in zip(active, batches):
                if a not in prefixes:  # views: the update lands in params (a few sizes per epoch)
                    prefixes[a] = (
                        [params[n][:a] for n in names],
                        None if momentum is None else [b[:a] for b in momentum],
                    )
                prefix, momentum_prefix = prefixes[a]
                live = {n: p.detach().requires_grad_() for n, p in zip(names, prefix)}
                with autocast_context(device, autocast):
                    total = objective(forward(live, xb), yb, mask, live, anchor).sum()
                grads = list(torch.autograd.grad(total, list(live.values())))
                with torch.no_grad():
                    sgd_step(prefix, grads, momentum_prefix, sgd)
        return params


class SequentialEngine:
    """One client after another with an ordinary module and torch.optim.SGD."""

    name = "sequential"
    chunk_size = 1
    oom_retries = 0

    def __init__(self, autocast: str | None = None) -> None:
        autocast_context(torch.device("cpu"), autocast)  # validates the name
        self.autocast = autocast

    def train(self, model: nn.Module, layout: ParameterLayout, start: dict[str, torch.Tensor], shards: ClientShards,
              order: torch.Tensor, sgd: LocalSGD, objective: ClientObjective,
              anchor: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Same contract as ``VectorisedEngine.train``."""
        is_stacked, anchor = resolve_start(start, anchor, shards.num_clients, layout)
        local_model = copy.deepcopy(model)
        local_model.train(model.training)
        local_params = dict(local_model.named_parameters())
        trained: list[torch.Tensor] = []
        for k in range(shards.num_clients):
            n_k = shards.sizes_cpu[k]
            width = n_k if sgd.batch_size is None else sgd.batch_size
            with torch.no_grad():
                for name in layout.names:
                    local_params[name].copy_(start[name][k] if is_stacked else start[name])
            optimizer = torch.optim.SGD(
                [local_params[n] for n in layout.names],
                lr=sgd.lr,
                momentum=sgd.momentum,
                weight_decay=sgd.weight_decay,
            )
            for epoch in range(sgd.epochs):
                client_order = order[epoch, k, :n_k].to(shards.index.device)
                for first in range(0, n_k, width):
                    samples = shards.index[k, client_order[first : first + width]]
                    xb, yb = shards.x[samples], shards.y[samples]
                    optimizer.zero_grad(set_to_none=True)
                    mask = torch.ones(1, len(samples), device=xb.device, dtype=xb.dtype)
                    stacked = {n: p.unsqueeze(0) for n, p in local_params.items()}
                    with autocast_context(xb.device, self.autocast):
                        logits = local_model(xb).unsqueeze(0)
                        loss = objective(logits, yb.unsqueeze(0), mask, stacked, anchor)[0]
                    loss.backward()
                    optimizer.step()
            trained.append(layout.flatten({n: local_params[n].detach() for n in layout.names}).clone())
        return layout.unflatten_stacked(torch.stack(trained))
