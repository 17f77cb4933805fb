"""CGSV's fair gradient reward mechanism (Xu et al., NeurIPS 2021, Sec. 3.4) and its baselines.

Round t, every agent i of N (Sec. 3.4, server and agent pseudo-code):
  1. agent i trains E local epochs from its OWN model w_i and uploads Δw_i. Its model then
     changes only through what it downloads (agent line 3, w_i ← w_i + v_i); the authors'
     code restores w_i after local training to the same effect;
  2. eq. (1): u_i = Γ Δw_i / (||Δw_i|| + 1e-7), u_N = Σ_i r_{i,t-1} u_i (r_{i,0} = 0, so the
     first round weighs agents by their data-size shares, as the authors' code does);
  3. eq. (3)-(4): ψ_i = cos(u_i, u_N); r_i ← α r_i + (1 − α) ψ_i, clamped at 1e-3 (authors'
     code: r stays positive) and normalised to sum 1;
  4. eq. (5): q_i = ⌊D tanh(β r_i) / max_j tanh(β r_j)⌋; agent i downloads v_i = u_N with all
     but its q_i largest-magnitude entries zeroed, and w_i ← w_i + v_i.

The module's own model is the server's, which moves by the full u_N: w ← w + u_N, so the
server step is −u_N in FederatedModule's convention (w ← w − step). The uploads are kept as
g_i = −Δw_i (rows of J); every cosine comes from the Gram matrix of J, and one ranking of
|u_N| gives every agent's mask at once.

The paper's baselines (Sec. 4.1) change one step each: :class:`Standalone` (no
collaboration), :class:`DW` (q_i ∝ data size), :class:`RR` (round-robin downloads),
:class:`EU` (Euclidean distance instead of the cosine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

import torch
from pydantic import Field

from fl_lightning.algorithms.agents import (
    AgentModels,
    rank_by_magnitude,
    top_magnitude_mask,
)
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.federation_evaluation import client_test_sets
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.gram import combine, gram
from fl_lightning.core.module import GLOBAL_MODEL, RoundContext, RoundPayload, ServerStep
from fl_lightning.core.simulation import round_generator
from fl_lightning.metrics import pearson
from fl_lightning.metrics.shapley import (
    FIG1_PERMUTATIONS,
    MAX_EXACT_AGENTS,
    approximate_cgsv,
    exact_cgsv,
    fig1_errors,
    sampled_cgsv,
)
from fl_lightning.records.vocabulary import SHAPLEY_ERRORS, ClientMetrics, Metric, shapley_error, shapley_gap

Sparsify = Literal["per_tensor", "model"]
Result = TypeVar("Result")


@register_algorithm
class Standalone(AgentModels):
    """Every agent trains alone on its own data (CGSV Sec. 4.1, the "standalone" baseline):
    w_i ← w_i − g_i after each round, nothing is aggregated (the server model stays w_0)."""

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        return torch.zeros_like(payload.updates[0])

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        self.agent_models[payload.clients] -= payload.updates  # keep the local training


@register_algorithm
class CGSV(AgentModels):
    """Fair gradient rewards by the approximate cosine gradient Shapley value (Sec. 3.4).

    Args:
        gamma: Γ of eq. (1), the norm of every normalised upload (paper: 0.5 on MNIST, 0.15 on
            CIFAR-10, 1 on text).
        alpha: α of eq. (4), the weight on the previous importance r_{i,t-1} (paper: 0.95).
        beta: β of eq. (5), the degree of altruism (paper's grid 1, 1.2, 1.5, 2);
            ``float("inf")`` gives vanilla FL: every agent downloads all of u_N.
        sparsify: how q_i is applied. ``"per_tensor"`` (authors' code, default): each
            parameter tensor of n_l entries keeps its ⌈n_l q_i / D⌉ largest-magnitude
            entries; ``"model"`` (eq. (5) read literally): the q_i largest over the whole
            vector. (The authors' code also never keeps the smallest entry of a tensor, so even
            the top agent misses part of u_N; we do not copy that: the top agent gets all of
            u_N, as Sec. 3.4 says.)
        track_standalone: also train every agent's standalone model in the same run (another
            (N, d) buffer, local training only, on the same minibatches) and log the fairness
            ρ = 100 · pearson(standalone accuracies, final accuracies) (Sec. 4.1).
        shapley_check_every: every k-th round (k = this; 0, the default, never) measure how well
            the round's ψ (eq. 3) approximates the exact CGSV φ (eq. 2), against the sampling
            baseline, as the paper's Fig. 1 (Sec. 3.3) does on random vectors: see
            :meth:`shapley_check` for the metrics. Opt-in: it adds its own time to the round's
            ``server_time_s``.
        shapley_permutations: random orders of the check's sampled Shapley values φ̄ (the paper's
            (ε, δ) = (0.1, 0.1)-approximation after Maleki et al. 2013: 150).

    Logged every round: ``cgsv_r/<i>`` and ``cgsv_density/<i>`` (q_i / D, the share of u_N
    agent i downloads) for N ≤ 20, and their min / mean / max. Logged at every evaluation
    (so also after the last round): ``cgsv_rho_r`` = 100 · pearson(r_i, accuracies) (App. B.3)
    and, with ``track_standalone``, ``cgsv_rho`` and ``standalone_test_acc_mean``.
    """

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    r: torch.Tensor
    standalone_models: torch.Tensor

    def __init__(
        self,
        *args: Any,
        gamma: Annotated[settings.Scale, Field(description="> 0 (Γ, the norm of each normalised upload)")] = 0.5,
        alpha: Annotated[settings.Probability, Field(
            description="in [0, 1) (the paper uses 0.95; 1 would never update r)")] = 0.95,
        beta: Annotated[float, Field(gt=0, description="> 0 (paper: 1 to 2; inf = vanilla FL)")] = 1.0,
        sparsify: Sparsify = "per_tensor",
        track_standalone: bool = False,
        shapley_check_every: Annotated[settings.CountOrZero, Field(
            description="an integer >= 0 (every k-th round; 0 = never)")] = 0,
        shapley_permutations: Annotated[settings.Count, Field(
            description=">= 1 (random orders; the paper's (0.1, 0.1)-approximation: 150)")] = FIG1_PERMUTATIONS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_client_state("r", dtype=torch.float64)  # r_i, the agents' importance
        if track_standalone:
            self.register_client_state("standalone_models", init=GLOBAL_MODEL)
        self.rho: float | None = None  # ρ and ρ_r of the latest evaluation
        self.rho_r: float | None = None

    def train_clients(self, context: RoundContext, shards: Any) -> torch.Tensor:
        agents = shards.clients
        if self.hparams.track_standalone:  # the same agents alone, same minibatches
            self.standalone_models[agents] -= self.train_from(context, shards, self.standalone_models[agents])
        return self.train_from(context, shards, self.agent_models[agents])  # g_i = −Δw_i; w_i unchanged

    # ------------------------------------------------------------- gradient aggregation step
    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """Eq. (1), (3) and (4) of Xu et al. (NeurIPS 2021): the server step −u_N = Σ_i a_i c_i g_i,
        the agents' new r (moving average of ψ_i, clamped at 1e-3, normalised), and ψ_i as metrics
        (with the Fig. 1 check every ``shapley_check_every`` rounds)."""
        G = gram(payload.updates)  # <g_i, g_j>, g_i = −Δw_i
        c = self.hparams.gamma / (G.diagonal().sqrt() + 1e-7)  # u_i = −c_i g_i   (1)
        a = self.aggregation_weights(payload)  # u_N = Σ a_i u_i
        psi = self.contributions(G, c, a)  # ψ_i                                 (3)
        r = self.r.clone()
        r[payload.clients] = self.hparams.alpha * r[payload.clients] + (1 - self.hparams.alpha) * psi  # (4)
        r = r.clamp(min=1e-3)
        metrics: dict[str, float | torch.Tensor] = {
            **self.agent_metrics(Metric.CGSV_PSI, psi, payload.clients.tolist())}
        every = self.hparams.shapley_check_every
        if every and (payload.round + 1) % every == 0:
            metrics |= self.shapley_check(c.unsqueeze(1) * payload.updates, a, payload)
        return ServerStep(combine(a * c, payload.updates), new_state={"r": r / r.sum()},  # −u_N = Σ_i a_i c_i g_i
                          metrics=metrics)

    def aggregation_weights(self, payload: RoundPayload) -> torch.Tensor:
        """r_{i,t-1}; in the first round (r = 0) the data-size shares n_i / Σ n_j."""
        if not bool(self.r.any()):
            n = payload.num_samples.double()
            return n / n.sum()
        return self.r[payload.clients]

    def contributions(self, G: torch.Tensor, c: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """ψ_i = cos(u_i, u_N), eq. (3), from G_u = diag(c) G diag(c) = <u_i, u_j>."""
        G_u = c.unsqueeze(1) * G * c.unsqueeze(0)
        norm_u = G_u.diagonal().sqrt()
        norm_N = (a @ G_u @ a).sqrt()
        return (G_u @ a) / (norm_u * norm_N).clamp(min=1e-10)

    # ------------------------------------------------------------ the Fig. 1 check (opt-in)
    def shapley_check(self, uploads: torch.Tensor, weights: torch.Tensor,
                      payload: RoundPayload) -> dict[str, float | torch.Tensor]:
        """How well this round's ψ approximates the exact CGSV, measured as in the paper's Fig. 1
        (Xu et al., NeurIPS 2021, Sec. 3.3), on the agents' real uploads instead of random vectors.

        ``uploads`` (m, D) holds the round's normalised uploads (up to their common sign, which no
        cosine sees), ``weights`` the r_{i,t-1} they are aggregated with (eq. 1); a coalition S is
        worth ν(S) = cos(u_S, u_N), u_S = Σ_{i∈S} r_i u_i (Definition 1). Each value is computed
        from the uploads and timed alone: ψ_i = cos(u_i, u_N) (eq. 3), the Monte-Carlo φ̄ over
        ``shapley_permutations`` random orders (the paper's sampling baseline, Maleki et al. 2013;
        orders drawn from the run's seed and the round), and, for m ≤ 10 agents, the exact φ of
        eq. (2) over the 2^m coalitions. Logged at the round's step:

        - ``cgsv_shapley_l1`` / ``_l2``: ℓ1 / ℓ2 error of ψ from φ, each normalised to sum 1
          (Fig. 1's solid lines), ``cgsv_shapley_sampled_l1`` / ``_l2`` those of φ̄ (dashed), and
          ``cgsv_shapley_l1_gap`` / ``_l2_gap``: φ̄'s error minus ψ's (> 0: ψ is closer to φ);
        - ``cgsv_shapley_pearson``: Pearson correlation of ψ and φ, and
          ``cgsv_shapley_sampled_pearson`` of φ̄ and φ (the correlations the authors' Fig. 1
          script also reports);
        - ``cgsv_shapley/<i>`` and ``cgsv_shapley_sampled/<i>`` (N ≤ 20 agents; and their min /
          mean / max): every agent's φ_i and φ̄_i, beside ``cgsv_psi/<i>``;
        - ``cgsv_time_s``, ``cgsv_shapley_time_s`` and ``cgsv_shapley_exact_time_s``: the seconds
          ψ, φ̄ and φ took (Fig. 1's "incurred time"), and ``cgsv_shapley_time_ratio`` = φ̄'s / ψ's;
          CPU seconds of the process on a CPU (the clock of the authors' Fig. 1 script, which
          other processes sharing the cores do not inflate), wall seconds with the device
          synchronised on an accelerator. ψ costs O(m D) (u_N and m inner products); φ̄ and φ
          share one O(m² D) Gram matrix, then O(m²) per coalition: far cheaper than valuing every
          coalition on D-vectors, as the authors' script does, so the ratio is smaller than theirs;
        - ``cgsv_shapley_psi_sampled_pearson``: Pearson correlation of ψ and φ̄ (also for m > 10,
          where φ is not computed and the metrics against it are not logged).
        """
        agents = payload.clients.tolist()
        generator = round_generator(self.hparams.seed, payload.round, "shapley_orders")
        psi, psi_time = self._timed(payload.context, lambda: approximate_cgsv(uploads, weights))
        sampled, sampled_time = self._timed(
            payload.context, lambda: sampled_cgsv(uploads, self.hparams.shapley_permutations, generator, weights))
        psi, sampled = psi.double().cpu(), sampled.double().cpu()
        metrics: dict[str, float | torch.Tensor] = {
            Metric.CGSV_TIME_S: psi_time, Metric.CGSV_SHAPLEY_TIME_S: sampled_time,
            Metric.CGSV_SHAPLEY_TIME_RATIO: sampled_time / max(psi_time, 1e-9),
            Metric.CGSV_SHAPLEY_PSI_SAMPLED_PEARSON: float(pearson(psi, sampled)),
        }
        metrics |= self.agent_metrics(Metric.CGSV_SHAPLEY_SAMPLED, sampled, agents)
        if len(agents) > MAX_EXACT_AGENTS:
            return metrics
        exact, exact_time = self._timed(payload.context, lambda: exact_cgsv(uploads, weights))
        exact = exact.double().cpu()
        for name, estimate in ((Metric.CGSV_SHAPLEY, psi), (Metric.CGSV_SHAPLEY_SAMPLED, sampled)):
            l1, l2 = fig1_errors(estimate, exact)
            metrics |= {shapley_error(name, "l1"): l1, shapley_error(name, "l2"): l2,
                        shapley_error(name, "pearson"): float(pearson(estimate, exact))}
        gaps = {shapley_gap(e): metrics[shapley_error(Metric.CGSV_SHAPLEY_SAMPLED, e)]
                - metrics[shapley_error(Metric.CGSV_SHAPLEY, e)] for e in SHAPLEY_ERRORS}
        return (metrics | gaps | self.agent_metrics(Metric.CGSV_SHAPLEY, exact, agents)
                | {Metric.CGSV_SHAPLEY_EXACT_TIME_S: exact_time})

    def _timed(self, context: RoundContext, compute: Callable[[], Result]) -> tuple[Result, float]:
        """``compute()`` and the seconds it took: the process's CPU seconds on a CPU, else the wall
        seconds with the device synchronised around it."""
        clock = time.process_time if self.device.type == "cpu" else time.perf_counter
        context.synchronize()
        started = clock()
        result = compute()
        context.synchronize()
        return result, clock() - started

    # ---------------------------------------------------------------- gradient download step
    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> dict[str, float]:
        keep = self.mask(-server_step, self.download_ratios(payload), payload.context.layout)  # (m, D)
        self.agent_models[payload.clients] += -server_step * keep  # w_i ← w_i + v_i, v_i = mask(u_N, q_i)  (5)
        return self.agent_series(keep.double().mean(dim=1), payload)

    def download_ratios(self, payload: RoundPayload) -> torch.Tensor:
        """q_i / D = tanh(β r_i) / max_j tanh(β r_j), eq. (5) (β = ∞: 1 for everyone)."""
        altruism = torch.tanh(self.hparams.beta * self.r)
        return (altruism / altruism.max())[payload.clients]

    def mask(self, u_N: torch.Tensor, ratio: torch.Tensor, layout: ParameterLayout) -> torch.Tensor:
        """Which entries of u_N every agent downloads, (m, D) booleans: one ranking of |u_N|
        (per tensor in ``"per_tensor"`` mode), and agent i keeps the ranks below its quota."""
        if self.hparams.sparsify == "model":
            return top_magnitude_mask(u_N, ratio)  # q_i = ⌊D tanh(βr_i) / max_j tanh(βr_j)⌋
        rank = torch.cat([rank_by_magnitude(u_N[s]) for s in layout.slices().values()])
        numels = torch.tensor(layout.numels, device=u_N.device)
        quota = torch.ceil(numels * ratio.unsqueeze(1)).repeat_interleave(numels, dim=1)  # ⌈n_l q_i/D⌉
        return rank.unsqueeze(0) < quota

    # ----------------------------------------------------------------------------- reporting
    def agent_series(self, density: torch.Tensor, payload: RoundPayload) -> dict[str, float]:
        """Every r_i, download density q_i / D and distance ||w_i − w|| of the agent's model to
        the server's after the round (per agent for N ≤ 20, and summaries): CGSV Fig. 2's curves
        (ψ_i, eq. 3, comes with the round's step: ``agent_metrics``)."""
        distance = (self.agent_models - payload.context.global_vector).norm(dim=1)
        series = {Metric.CGSV_R: (self.r, range(len(self.r))), Metric.CGSV_DENSITY: (density, payload.clients.tolist()),
                  Metric.CGSV_DISTANCE: (distance, range(len(self.r)))}
        return self.per_agent_metrics(series)

    def evaluation_metrics(self, context: RoundContext, client_metrics: Mapping[str, list[float]]) -> dict[str, float]:
        """ρ_r (App. B.3), and ρ with standalone models (Sec. 4.1), against the agents' accuracies
        just evaluated, also kept as ``rho_r`` / ``rho``; none before r is known or without every
        agent's accuracy."""
        metrics: dict[str, float] = {}
        final = torch.tensor(client_metrics.get(ClientMetrics.TEST_ACCURACY, []), dtype=torch.float64)
        if final.numel() != len(self.r) or not bool(self.r.any()):
            return metrics
        tested = torch.isfinite(final)  # agents with a test set
        self.rho_r = 100 * float(pearson(self.r.cpu()[tested], final[tested]))  # App. B.3
        metrics[Metric.CGSV_RHO_R] = self.rho_r
        if self.hparams.track_standalone:
            standalone = self.agent_accuracies(context, self.standalone_models).double().cpu()
            self.rho = 100 * float(pearson(standalone[tested], final[tested]))  # Sec. 4.1
            metrics |= {Metric.CGSV_RHO: self.rho, Metric.STANDALONE_TEST_ACC_MEAN: float(standalone[tested].mean())}
        return metrics

    @staticmethod
    def agent_accuracies(context: RoundContext, params: torch.Tensor) -> torch.Tensor:
        """Test accuracy of one model per agent, on the sets the core evaluates agents on."""
        sets = client_test_sets(context.data, params.shape[0])  # own test sets, else the shared one
        if sets is None:
            raise RuntimeError(
                "CGSV evaluates its agents, but the data has no test set: give clients a local or a shared test"
            )
        return context.evaluator.stacked(params, sets)[1]


@register_algorithm
class DW(CGSV):
    """Dataset-weighted downloads (CGSV Sec. 4.1): q_i in eq. (5) proportional to the agent's
    data size, q_i = ⌊D n_i / max_j n_j⌋. Only the download step changes (the paper's words);
    aggregation still weighs agents by r from ψ, which is also logged."""

    def download_ratios(self, payload: RoundPayload) -> torch.Tensor:
        n = payload.num_samples.double()
        return n / n.max()


@register_algorithm
class EU(CGSV):
    """CGSV with the Euclidean distance instead of the cosine (CGSV Sec. 4.1, "Ours (EU)").

    The paper sets q_i "proportional to the negative Euclidean distance of their unnormalized
    parameter updates from that of the server", which cannot be used as written (shares must
    be positive). Our reading: d_i = ||Δw_i − Δw_N||, with Δw_N = Σ_j a_j Δw_j the server's
    unnormalised update under the round's weights, replaces the cosine as the value through
    ψ_i = 1 − d_i / Σ_j d_j (the negative distance, shifted and scaled to [0, 1], so equally
    distant agents are worth the same), which then drives r (4), the aggregation (1) and q (5)
    exactly as the cosine does.
    """

    def contributions(self, G: torch.Tensor, c: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        # d_i² = ||g_i||² − 2 <g_i, Σ a_j g_j> + ||Σ a_j g_j||²  (unnormalised, g = −Δw)
        d = (G.diagonal() - 2 * (G @ a) + a @ G @ a).clamp(min=0).sqrt()
        return 1 - d / d.sum().clamp(min=1e-12)


@register_algorithm
class RR(CGSV):
    """Round-robin downloads (CGSV Sec. 4.1, after Shokri & Shmatikov 2015 and Chen et al.
    2019: round robin schedules the gradient downloads).

    The paper gives no formula. Our reading: the agents take turns, one per round in id order
    (agent t mod N in round t); the agent whose turn it is downloads everything the server
    aggregated since its last turn (Σ u_N since then = w − w_i, as w_i changes only by
    downloads), so it leaves its turn holding the server model; the others download nothing.
    Every agent gets the same reward whatever it uploads (egalitarian, as the paper notes).
    Aggregation is CGSV's (r from ψ, also logged).
    """

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> dict[str, float]:
        turn = payload.clients == payload.round % len(self.agent_models)
        agent = payload.clients[turn]
        self.agent_models[agent] += payload.context.global_vector - self.agent_models[agent]  # v_i = w − w_i
        return self.agent_series(turn.double(), payload)
