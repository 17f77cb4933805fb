"""``FederatedModule``: a LightningModule whose every training step is one communication round.

A round: sample S_t and simulate dropout (``core.simulation``); measure each answering client's
training loss and accuracy at w; train them all at once (``core.engines``) into J (m x d), rows
g_i = w - w_i, leaving out non-finite rows; ``aggregate(payload)`` -> the step d; if d is finite,
w <- w - d through the server optimizer (``global_step`` counts applied rounds), commit the
state ``aggregate`` proposed and call ``on_round_end``, else keep model and state. Every client
is evaluated every ``eval_every`` rounds and after the last; one Lightning epoch is one round,
and every metric is logged with step = rounds completed: a round's metrics are collected
(``log_round``) and reach the loggers in one call, as Lightning's epoch metrics would.

The algorithm contract (what a subclass may override, and when state may change). An
algorithm reaches the engine through one door, the round's ``RoundContext`` (``payload.context``
or the ``context`` argument), which wraps the engine the module holds (``round_engine``,
``core.round_engine.RoundEngine``); an algorithm never reads the engine itself:
 - ``__init__``: validate its hyper-parameters, ``save_hyperparameters()``, declare per-client
   state with ``register_client_state`` (created once K is known, checkpointed).
 - ``client_objective``: every client's minibatch loss (default: cross-entropy).
 - ``train_clients(context, shards)``: local training -> J; client-side state (a client's own
   model) may change.
 - ``aggregate(payload) -> ServerStep | Tensor``: changes no state and logs nothing; new values
   of the algorithm's state go in ``ServerStep.new_state``, committed with the step, and what
   it logs about the round in ``ServerStep.metrics``, logged with the round's metrics.
 - ``on_round_end(payload, step)``: bookkeeping after an applied step (histories); returns what
   it measures of the new state, logged with the round (it logs nothing itself).
 - ``evaluation_params``: what evaluation tests (the global model by default).
 - ``sample_clients(context)``: who is asked each round (``fraction`` uniformly by default).
 - ``training_samples(data)``: which samples the clients train on (all by default).
 - ``evaluation_metrics(context, client_metrics)``: metrics added to every evaluation.
 - ``history_rows_to_keep(next_round)``: the ``history`` rows a checkpoint must hold.
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.parsing import AttributeDict

from fl_lightning import private_api
from fl_lightning.core import settings, simulation
from fl_lightning.core.data_link import FederatedDataLink
from fl_lightning.core.diagnostics import ConflictCounts, ImprovementShare, QPFallbackTotal
from fl_lightning.core.distributed import check_trainer_length
from fl_lightning.core.engine_runner import EngineRunner
from fl_lightning.core.flat import ParameterLayout, layer_names, layer_slices
from fl_lightning.core.fused import mean_cross_entropy_objective
from fl_lightning.core.local import ClientShards, LocalSGD, masked_cross_entropy
from fl_lightning.core.payload import (
    RoundContext,
    RoundOutcome,
    RoundPayload,
    ServerStep,
    as_server_step,
    finite_rows,
)
from fl_lightning.core.progress import console_callbacks
from fl_lightning.core.round_engine import RoundEngine
from fl_lightning.core.round_log import RoundLog, RoundLogging
from fl_lightning.core.simulation import round_generator
from fl_lightning.core.state import GLOBAL_MODEL, ClientStateMixin
from fl_lightning.core.threads import FitThreads
from fl_lightning.models import create_fl_model
from fl_lightning.records.vocabulary import (
    DEFAULT_BACKBONE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_EVAL_EVERY,
    DEFAULT_FRACTION,
    DEFAULT_LOCAL_EPOCHS,
    DEFAULT_LR,
    DEFAULT_NUM_ROUNDS,
    FULL_PARTICIPATION,
    Metric,
)
from fl_lightning.seeding import global_generator_states, restore_global_generators, run_seed

__all__ = ["GLOBAL_MODEL", "FederatedModule", "RoundContext", "RoundOutcome", "RoundPayload", "ServerStep",
           "round_generator"]


class FederatedModule(RoundLogging, ClientStateMixin, FederatedDataLink, pl.LightningModule):
    """Base class of every federated algorithm; subclasses implement ``aggregate``.

    Args:
        backbone: a registered model name (``fl_lightning.models.list_fl_models()``).
        backbone_kwargs: extra keyword arguments for the backbone.
        num_classes: filled in from the data module by the CLI.
        input_shape: filled in from the data module by the CLI.
        num_rounds: communication rounds T.
        fraction: share of the K clients sampled per round (1.0 = full participation).
        dropout_prob: chance that a sampled client does not answer in a round.
        local_epochs: local SGD epochs E per round.
        batch_size: local SGD minibatch size B (None = full batch).
        lr: local SGD learning rate (default 0.05, as the CLI's).
        momentum: local SGD momentum.
        weight_decay: local SGD weight decay.
        engine: the local training engine; ``"auto"`` picks the vectorised one when a chunk
            of stacked clients fits in ``engine_memory_budget_gb``.
        eval_every: evaluate every client every this many rounds (and after the last); default
            5, as the CLI's (``eval_every=1`` logs the client accuracies every round).
        seed: seeds the model's initialisation and every per-round random stream; ``None``
            (the default) takes the run's seed (``--seed_everything N``), else 0.
        engine_memory_budget_gb: what ``engine="auto"`` may spend on stacked clients.
        clients_per_chunk: clients trained together by the vectorised engine (None = all,
            ``"auto"``, the default = sized from the free GPU memory, or on a CPU to stay
            within its cache, ``core.engines.auto_chunk_size``); the size used is logged as
            ``chunk_size``, and a chunk that runs out of memory is retried in halves.
        lr_decay: the local learning rate of round t is ``lr * lr_decay**t``.
        layer_grouping: a "layer" of per-layer conflicts and aggregation: a ``"tensor"`` or ``"module"``.
        track_improvement: log ``improved_fraction`` (``core.diagnostics.ImprovementShare``).
        local_autocast: mixed precision for local training's forward passes (``"fp16"`` on
            a GPU only); parameters and updates stay float32.
        history_dtype: storage dtype of per-client histories (K x d; FedFV, FedLF, FedMDFG);
            ``None`` = the parameters' dtype.
        history_device: ``"model"`` (with the model) or ``"cpu"`` (pinned host memory).
        attack: one malicious client that takes part in every round (``core.simulation``).
        attack_client: the malicious client's id.
        attack_strength: the bias it adds or the factor it applies.
        threads: the fit's intra-op CPU threads (``core.threads``). Part of the run's numbers
            (MKL's products round differently at another count), so a setting of the run: fixed
            when the module is built, logged as a number, kept by a resume, taken by a replay.
            ``"auto"`` (the default): the cores the fit is given (its CPU affinity, or
            ``OMP_NUM_THREADS``, which the benchmark runner sets to each job's share).

    Declared requirements (class attributes an algorithm sets instead of overriding the engine):
        needs_every_client: the algorithm treats each client as a domain and needs all of them
            in every round (AFL); a ``fraction`` below 1 is refused when the module is built.
        reads_training_losses: ``aggregate`` reads the clients' training losses at the global
            model before local training (``payload.losses``: q-FFL's F_k(w), FedFV's order,
            ...), so every round computes them. Otherwise they are computed only in the rounds
            that evaluate (and logged there as ``train_loss`` / ``train_acc``), and
            ``payload.losses`` / ``payload.accuracies`` are None in the others.
    """

    needs_every_client: ClassVar[bool] = False
    reads_training_losses: ClassVar[bool] = False

    def __init__(
        self,
        backbone: str = DEFAULT_BACKBONE,
        backbone_kwargs: dict[str, Any] | None = None,
        num_classes: int = 10,
        input_shape: tuple[int, ...] = (1, 28, 28),
        num_rounds: settings.Count = DEFAULT_NUM_ROUNDS,
        fraction: settings.Participation = DEFAULT_FRACTION,
        dropout_prob: settings.Probability = 0.0,
        local_epochs: settings.Count = DEFAULT_LOCAL_EPOCHS,
        batch_size: settings.BatchSize = DEFAULT_BATCH_SIZE,
        lr: settings.StepSize = DEFAULT_LR,
        momentum: settings.Probability = 0.0,
        weight_decay: settings.Penalty = 0.0,
        engine: settings.EngineName = "auto",
        eval_every: settings.Count = DEFAULT_EVAL_EVERY,
        seed: int | None = None,
        engine_memory_budget_gb: settings.Gigabytes = 4.0,
        clients_per_chunk: settings.ChunkSize = "auto",
        lr_decay: settings.Decay = 1.0,
        layer_grouping: settings.LayerGrouping = "tensor",
        track_improvement: bool = False,
        local_autocast: settings.OptionalAutocast = None,
        history_dtype: settings.OptionalHistoryDtype = None,
        history_device: settings.HistoryDevice = "model",
        attack: settings.OptionalAttack = None,
        attack_client: settings.ClientId = 0,
        attack_strength: settings.FiniteNumber = 10.0,
        threads: settings.Threads = "auto",
    ) -> None:
        super().__init__()
        self._resolved_seed = run_seed(seed, "model.seed")  # hparams.seed: the seed's one home, from here on
        self.fit_threads = FitThreads(threads)  # checks the count and resolves "auto" now, before anything is built
        self.save_hyperparameters()
        # the settings in groups, each checked by its fields' types (``core.settings``); the
        # federation's are read from ``hparams`` (Lightning's home for them, saved in checkpoints)
        settings.Federation(num_rounds, fraction, dropout_prob, eval_every)
        if self.needs_every_client and fraction < FULL_PARTICIPATION:
            raise ValueError(f"{type(self).__name__} needs every client in every round, but fraction = {fraction}: "
                             "set fraction: 1.0")
        local_sgd = LocalSGD(lr, momentum, weight_decay, local_epochs, batch_size, lr_decay)
        self.engine_settings = settings.EngineSettings(engine, engine_memory_budget_gb, clients_per_chunk,
                                                       local_autocast)
        self.history_settings = settings.HistorySettings(history_dtype, history_device)
        attacker = simulation.MaliciousClient(attack, attack_client, attack_strength)
        self.attacker = None if attack is None else attacker
        torch.manual_seed(self.hparams.seed)
        self.model = create_fl_model(backbone, num_classes, tuple(input_shape), **(backbone_kwargs or {}))
        layout = ParameterLayout.of(self.model)
        self.automatic_optimization = False
        # the engine of the rounds, held (RoundContext wraps it); the objective is the class's hook
        self.round_engine = RoundEngine(
            self.model, layout, layer_slices(self.model, layout, layer_grouping), layer_names(layout, layer_grouping),
            local_sgd, EngineRunner(self.engine_settings), int(self.hparams.seed), float(dropout_prob),
            self.client_objective, self.attached_trainer)
        self.last_client_metrics: dict[str, list[float]] = {}
        self.round_log = RoundLog()

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyper-parameters (Lightning's), typed as the ``AttributeDict`` that
        ``save_hyperparameters()`` makes, so ``self.hparams.alpha`` type-checks."""
        return cast(AttributeDict, super().hparams)

    def save_hyperparameters(self, *args: Any, ignore: Any = None, frame: Any = None, logger: bool = True) -> None:
        """Lightning's, with ``seed`` recorded as the seed used (the run's, when None was
        given); subclasses save again after this class, so every save records it. Every saved
        setting whose annotation constrains it (``core.settings``: ``Probability``, a
        ``Literal``, ...) is checked here, so an algorithm declares a range once, in its
        signature, and the CLI refuses the same values while parsing."""
        if frame is None:  # the caller's frame, as Lightning's own default takes it
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        super().save_hyperparameters(*args, ignore=ignore, frame=frame, logger=logger)
        # the seed used and the thread count resolved: what the run logs and a replay takes
        private_api.record_hparams(self, {"seed": self._resolved_seed, "threads": self.fit_threads.threads})
        settings.check_settings(type(self), self.hparams, base=FederatedModule)  # the base's: by its groups

    # ----------------------------------------------------------------- hooks to override
    @mean_cross_entropy_objective  # the engine may use hand-derived gradients (an override is unmarked)
    def client_objective(self, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                         local_params: dict[str, torch.Tensor], global_params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Every training client's minibatch loss, shape (m,).

        ``logits`` (m, B, C), ``targets`` and ``mask`` (m, B) (mask 0 = padding), and
        ``local_params`` stacked [m, ...]: one row per client; ``global_params`` is what a
        proximal term pulls towards. The default is the mean cross-entropy over each
        client's valid samples.
        """
        return masked_cross_entropy(logits, targets, mask)

    def train_clients(self, context: RoundContext, shards: ClientShards) -> torch.Tensor:
        """Local training from the global model; returns J (m, d) with g_i = w - w_i."""
        trained = context.local_train(shards)
        return context.layout.flatten_stacked(trained).neg_().add_(context.global_vector)  # w − w_i, in place

    def aggregate(self, payload: RoundPayload) -> ServerStep | torch.Tensor:
        """The server step d (d,) from the round's uploads (the server applies w <- w - d),
        with the algorithm's new state and metrics; must not change any state or log itself.
        What it needs of the engine it reads from ``payload.context`` (``RoundContext``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate(payload)")

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> Mapping[str, float] | None:
        """Algorithm bookkeeping after the step is applied (histories, downloads, ...);
        ``payload.context`` as in ``aggregate``. Returns what it measures of the state after the
        round (CGSV's r_i and download densities), logged with the round's metrics; logs nothing."""
        return None

    def evaluation_params(self) -> torch.Tensor | None:
        """The parameters evaluation uses: ``None`` for the global model, a flat (d,)
        vector for another shared model (e.g. AFL's averaged iterate), or (K, d) with
        one model per client (Ditto's personal models, CGSV's agent models)."""
        return None

    def sample_clients(self, context: RoundContext) -> torch.Tensor:
        """S_t, sorted ids: ``fraction`` of the K clients uniformly without replacement."""
        return simulation.sample_uniformly(self.hparams.seed, context.round, context.num_clients_total,
                                           self.hparams.fraction)

    def training_samples(self, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples every client trains on, for all K clients at once: from the data's
        (K, n) ``train_index`` (row k: client k's positions in ``train_x``, padded beyond
        ``train_sizes[k]``) and (K,) ``train_sizes``, the (K, n') index and sizes of the
        training shards. Asked once per data tensors (again if the data moves). Default:
        every sample; ``ValidatedAgents`` (CFFL, ECI) hold out the server's validation set."""
        return data.train_index, data.train_sizes

    def evaluation_metrics(self, context: RoundContext, client_metrics: Mapping[str, list[float]]) -> dict[str, float]:
        """Metrics the algorithm adds to every evaluation, from the per-client values just
        evaluated (``last_client_metrics``: ``test_accuracy``, ``test_loss``, ...; empty without
        test data); a name the evaluation logs itself is refused. Default: none; CGSV adds its
        fairness correlations ρ_r and ρ."""
        return {}

    def history_rows_to_keep(self, next_round: RoundContext | None) -> torch.Tensor:
        """Ids of the ``history`` rows (``register_client_history``) a checkpoint must hold, taken
        before ``next_round`` (None: not known): those a later round may read before writing
        them again; the rest are left out (``core.state``). Default: every client ever seen
        (FedLF and FedMDFG read any absent client's last upload); FedFV keeps fewer."""
        return torch.nonzero(self.last_seen >= 0).flatten()

    @property
    def num_parameters(self) -> int:
        """d, the number of trainable parameters (the length of w and of every update)."""
        return self.round_engine.num_parameters

    def attached_trainer(self) -> pl.Trainer | None:
        """The Trainer this module is attached to, None outside one (a test, a notebook)."""
        return private_api.attached_trainer(self)

    @property
    def _round_index(self) -> int:
        """0-based index of the round being run (= the Lightning epoch)."""
        return int(self.current_epoch)

    # ------------------------------------------------------------ the engine's door and helpers
    def round_context(self, round_index: int) -> RoundContext:
        """The read-only view of the engine that round ``round_index``'s hooks receive."""
        return RoundContext(self.round_engine, self, round_index)

    def with_round_context(self, payload: RoundPayload) -> RoundPayload:
        """``payload``, with the context of its round when it has none (a new payload)."""
        return payload if payload._context is not None else replace(payload, _context=self.round_context(payload.round))

    def predictable_answering(self, round_index: int) -> torch.Tensor | None:
        """Who answers round ``round_index`` when it is a pure function of (seed, round): the
        default sampler and no attacker (``RoundContext.answering_clients``)."""
        if self.attacker is not None or type(self).sample_clients is not FederatedModule.sample_clients:
            return None
        return self.round_engine.drop_clients(round_index, self.sample_clients(self.round_context(round_index)))

    # ------------------------------------------------------------------ lightning wiring
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # The server optimizer applies w <- w - d with d placed in .grad (lr 1, plain SGD).
        return torch.optim.SGD(self.model.parameters(), lr=1.0)

    def configure_callbacks(self) -> list[Callback]:
        """The fit's CPU threads (``core.threads``: part of its numbers), the diagnostics every
        run logs (``core.diagnostics``) and what the CLI prints (``core.progress``): in place of
        Lightning's default per-epoch bar, one bar over the rounds and the closing line; in place
        of its default model table, none. A bar or summary the user chose (another class, or
        ``enable_progress_bar=False``) is left alone."""
        return ([self.fit_threads, ConflictCounts(), QPFallbackTotal()]
                + ([ImprovementShare()] if self.hparams.track_improvement else [])
                + console_callbacks(self.attached_trainer()))

    def setup(self, stage: str) -> None:
        self.materialise_client_states(self.num_clients_total)

    def on_fit_start(self) -> None:
        """Sets the fit's length to ``num_rounds`` (a trainer length that says otherwise is refused), checks
        the data, and says how many clients a round ``fraction`` gives where that changes the participation."""
        check_trainer_length(self.trainer, int(self.hparams.num_rounds))
        self.trainer.fit_loop.max_epochs = self.hparams.num_rounds
        self._check_data()
        asked, num_clients = float(self.hparams.fraction), self.num_clients_total
        if simulation.participation_that_runs(num_clients, asked) != asked:
            ran = simulation.clients_per_round(num_clients, asked)
            self.print(f"fraction {asked:g} of {num_clients} clients is {ran} client{'s' * (ran != 1)} a round: "
                       f"participation {ran / num_clients:.3g} runs and is what the run logs")
        if self.round_engine.world_size > 1:
            # every rank logs the same all-gathered values: nothing to reduce across ranks
            warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\(", category=UserWarning)

    def on_validation_start(self) -> None:
        self._check_data()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also keep the global generators: the per-round streams are pure functions of
        (seed, round), but stochastic layers (dropout, drop-path) draw from the global one."""
        checkpoint["fl_rng"] = global_generator_states()
        self.compact_history(checkpoint)  # only the history rows still to be read (core.state)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Creates the declared per-client state with the checkpoint's shapes (``load_from_checkpoint``
        restores before any setup) and restores the global generators."""
        state = checkpoint.get("state_dict", {})
        self._expand_history(checkpoint)
        self._materialise_from_checkpoint(state)
        if checkpoint.get("fl_rng") is not None:
            restore_global_generators(checkpoint["fl_rng"])

    # --------------------------------------------------------------------------- a round
    def training_step(self, batch: Any, batch_idx: int) -> dict[str, RoundOutcome]:
        """One round; returns ``{"outcome": RoundOutcome}`` for the callbacks (``on_train_batch_end``;
        Lightning's manual optimisation passes a step's output on as a mapping)."""
        return {"outcome": self._run_round(self._round_index)}

    def _run_round(self, t: int) -> RoundOutcome:
        context = self.round_context(t)
        outcome = RoundOutcome(t, self._evaluates_after(t + 1))
        sampled = self.sample_clients(context)
        if self.attacker is not None:
            sampled = self.attacker.joins(sampled)
        engine = self.round_engine
        answered = engine.drop_clients(t, sampled)
        metrics: dict[str, float | torch.Tensor] = {"clients_sampled": float(len(sampled)),
                                                    "clients_answered": float(len(answered))}
        if len(answered) == 0:
            self.print(f"round {t + 1}: no sampled client answered; the global model is kept")
            self.log_round(metrics | {"clients_aggregated": 0.0})
            return outcome

        engine.synchronize()
        started = time.perf_counter()
        shards = self.client_shards(answered)
        losses, accuracies = (
            engine.evaluator.shared(self.model, (shards.x, shards.y, shards.index, shards.sizes))
            if self._computes_training_losses(t) else (None, None)
        )
        updates = self.train_clients(context, shards)
        engine.synchronize()
        client_time = time.perf_counter() - started

        payload = RoundPayload(t, answered.to(self.device), updates, losses, accuracies, shards.sizes, shards, context)
        if self.attacker is not None:
            payload = self.attacker.corrupt(payload)
        finite = finite_rows(payload.updates)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            self.print(
                f"round {t + 1}: left out clients {payload.clients[~finite].tolist()}: their updates hold NaN or inf"
            )
            payload = payload.select(finite)
        metrics |= {
            "clients_nonfinite": float(num_nonfinite),
            # kept, but algorithms must not divide by their norm (tests/fl_lightning/core/test_client_faults.py)
            "clients_zero_update": (payload.updates.abs().amax(dim=1) == 0).sum() if payload.num_clients else 0.0,
            "clients_aggregated": float(payload.num_clients),
            Metric.CLIENT_TIME_S: client_time,
            "engine_vectorised": float(engine.runner.engine_used == "vectorised"),
            "chunk_size": float(engine.runner.last_chunk_size or 0),
            "oom_retries": float(engine.runner.oom_retries),
        }
        if losses is not None and accuracies is not None:
            metrics |= {Metric.TRAIN_LOSS: losses.mean(), Metric.TRAIN_ACC: accuracies.mean()}
        if payload.num_clients == 0:
            self.log_round(metrics)
            return outcome

        started = time.perf_counter()
        step = as_server_step(self.aggregate(payload))
        engine.synchronize()
        metrics[Metric.SERVER_TIME_S] = time.perf_counter() - started
        metrics = self._joined("aggregate", step.metrics, metrics, ("server_step_norm", "server_step_nonfinite"))
        outcome = replace(outcome, payload=payload, qp_fallbacks=step.qp_fallbacks, details=step.details)
        if not torch.isfinite(step.direction).all():
            self.print(f"round {t + 1}: the server step is not finite; the global model and the state are kept")
            self.log_round(metrics | {"server_step_nonfinite": 1.0})
            return outcome
        self._apply_server_step(step.direction)
        after = self._commit_round(payload, step)
        self.log_round(self._joined("on_round_end", after, metrics | {"server_step_norm": step.direction.norm()}))
        return replace(outcome, direction=step.direction)

    def _computes_training_losses(self, t: int) -> bool:
        """Whether round t computes its clients' training losses before local training: every
        round where the algorithm (``reads_training_losses``) or a callback of the fit reads them
        (one with that attribute set, e.g. ``ImprovementShare``, or one that monitors
        ``train_loss`` / ``train_acc``, e.g. an ``EarlyStopping``), else the rounds that evaluate.
        The losses cost a forward pass over every sampled client's data (a fifth of a FedAvg
        round of logistic regression)."""
        if self.reads_training_losses or self._evaluates_after(t + 1):
            return True
        callbacks = getattr(self.attached_trainer(), "callbacks", None) or []
        return any(getattr(callback, "reads_training_losses", False)
                   or getattr(callback, "monitor", None) in (Metric.TRAIN_LOSS, Metric.TRAIN_ACC)
                   for callback in callbacks)

    def _joined(self, hook: str, added: Mapping[str, Any], metrics: Mapping[str, Any],
                reserved: tuple[str, ...] = ()) -> dict[str, Any]:
        """``metrics`` with what the algorithm's ``hook`` adds; a name both use is refused."""
        clash = sorted(added.keys() & (metrics.keys() | set(reserved)))
        if clash:
            raise ValueError(f"{type(self).__name__}.{hook} adds {clash}, which the module logs itself: "
                             "give the algorithm's metrics other names (e.g. prefixed with the algorithm's)")
        return dict(added) | dict(metrics)

    def _commit_round(self, payload: RoundPayload, step: ServerStep) -> Mapping[str, float]:
        """After an applied step: the state ``aggregate`` proposed, then ``on_round_end`` (its metrics)."""
        for name, value in step.new_state.items():
            getattr(self, name).copy_(value)
        return self.on_round_end(payload, step.direction) or {}

    def propose(self, payload: RoundPayload) -> ServerStep | torch.Tensor:
        """What ``aggregate`` answers to ``payload``, a payload built by hand (a test, a notebook)
        given its round's context first; changes nothing."""
        return self.aggregate(self.with_round_context(payload))

    def server_round(self, payload: RoundPayload) -> torch.Tensor:
        """``aggregate`` and the commit of its state, then ``on_round_end``, without moving the
        model (outside a Trainer there is no server optimizer): the server side of a round for
        notebooks, tests and benchmarks."""
        payload = self.with_round_context(payload)
        step = as_server_step(self.aggregate(payload))
        self._commit_round(payload, step)
        return step.direction

    def _apply_server_step(self, server_step: torch.Tensor) -> None:
        """w <- w - d, through the server optimizer (so global_step counts applied rounds)."""
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list), "FederatedModule configures one server optimizer"
        params = dict(self.model.named_parameters())
        for name, piece in self.round_engine.layout.unflatten(server_step).items():
            params[name].grad = piece.detach().to(params[name].dtype).clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------------ evaluation
    def _rounds_completed(self) -> int:
        """Rounds done when evaluating: inside fit the current round has just finished."""
        fitting = self.attached_trainer() is not None and self.trainer.state.fn == "fit"
        return self._round_index + 1 if fitting else self._round_index

    def _evaluates_now(self) -> bool:
        """Whether this validation pass evaluates: every ``eval_every`` rounds and after the last."""
        if self.trainer.sanity_checking:
            return False
        if self.trainer.state.fn != "fit":
            return True
        return self._evaluates_after(self._rounds_completed())

    def _evaluates_after(self, rounds_done: int) -> bool:
        """Whether a fit evaluates after ``rounds_done`` rounds: every ``eval_every`` and after the last."""
        return rounds_done % self.hparams.eval_every == 0 or rounds_done == self.hparams.num_rounds

    def evaluate_all_clients(self) -> dict[str, float]:
        """Every client's test loss/accuracy and their fairness summary (``last_client_metrics``
        keeps the per-client values), the shared test set under the shared model, and what the
        algorithm adds (``evaluation_metrics``)."""
        evaluator = self.round_engine.evaluator
        metrics, self.last_client_metrics = evaluator.evaluate(self.federated_data, self.evaluation_params())
        added = self.evaluation_metrics(self.round_context(self._rounds_completed()), self.last_client_metrics)
        return self._joined("evaluation_metrics", added, metrics)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """Evaluates every client when this pass evaluates (every ``eval_every`` rounds and after the last):
        in a fit the metrics go to the round's log, under ``validate`` to Lightning's results table."""
        if not self._evaluates_now():
            return
        metrics = self.evaluate_all_clients()
        shown = {f"{k}_now": metrics[k] for k in (Metric.TEST_ACC_MEAN, Metric.GLOBAL_TEST_ACC) if k in metrics}
        if self.trainer.state.fn != "fit":  # validate: Lightning's results table
            self.log_dict({**metrics, "step": float(self._rounds_completed())}, batch_size=1)
            self.log_dict(shown, prog_bar=True, logger=False, batch_size=1)
            return
        self.round_log.add_evaluation(metrics, self._rounds_completed())
        self.round_log.add_evaluation(shown, self._rounds_completed(), progress_bar=True)

