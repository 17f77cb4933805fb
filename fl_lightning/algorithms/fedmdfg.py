"""FedMDFG (Pan et al., AAAI 2023): multiple gradient descent with fair guidance and a
step-size line search, as the FedLF paper's appendix describes it (Pan et al., AAAI 2024, App. A.3, problem (35))."""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.client_signal import GradientSignal, full_batch_gradients
from fl_lightning.algorithms.qp import min_norm_simplex
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.evaluation import evaluate_clients
from fl_lightning.core.flat import assign_model_vector
from fl_lightning.core.gram import combine, gram
from fl_lightning.core.local import ClientShards
from fl_lightning.core.module import FederatedModule, RoundContext, RoundPayload, ServerStep

ZERO_SIGNAL = 1e-6  # ||g_i|| at most this: a zero update, left out (the reference's defence)
ZERO_DIRECTION = 1e-3  # ||Σλ_j V_j|| ≤ this · max_j ||V_j||: Pareto-stationary, no step
ARMIJO_BETA = 1e-4  # sufficient-decrease constant of the line search (the reference code's)


def cosine_with_ones(losses: torch.Tensor) -> torch.Tensor:
    """cos(F, 1), FedMDFG's fairness measure (1 = every client has the same loss)."""
    F = losses.double()
    norm = F.norm() * math.sqrt(F.numel())
    return F.sum() / norm if norm > 0 else torch.ones((), dtype=F.dtype, device=F.device)


def fairness_angle(losses: torch.Tensor) -> float:
    """The angle between F and 1 in degrees (0 = perfectly fair)."""
    return math.degrees(math.acos(min(1.0, float(cosine_with_ones(losses)))))


def fair_guidance(losses: torch.Tensor) -> torch.Tensor:
    """h_t: the opposite normalised projection of 1 on the normal plane of F (A.3).
    Descending on Fᵀh rotates F towards 1."""
    F = losses.double() / losses.double().norm()
    ones = torch.ones_like(F) / math.sqrt(F.numel())
    h = (ones @ F) * F - ones  # −(1̂ − (1̂·F̂) F̂)
    return h / h.norm()


@register_algorithm
class FedMDFG(FederatedModule):
    """FedMDFG: MGDA on (F_1, …, F_m, Fᵀh_t) (problem (35) of the FedLF appendix A.3).

    Per round t; every detail the appendix leaves open follows the FedMDFG authors' code
    (github.com/zibinpan/FedMDFG) unless said otherwise:

    1. g_i = (w − w_i)/η_t (``gradient="update"``, as FedLF A.4 says FedMDFG does) or the
       full local gradient at w (``"full_batch"``, the reference code); F = losses at w.
       Clients with ||g_i|| ≤ 1e-6 are left out (the reference's zero-update defence).
    2. ĝ_i = g_i · μ/||g_i||, μ = mean_i ||g_i|| (the reference's norm equalisation against
       extreme-norm clients); ĝ are "the clients' gradients" from here on.
    3. Fair guidance, only when the angle between F and 1 exceeds θ: the objective Fᵀh_t
       adds the vector g_h = Σ_i h_i ĝ_i.
    4. Absent clients: those of the previous aggregated round that are absent now add their
       ĝ from that round (A.3: "absent clients who were online at the last round").
    5. MGDA: λ = argmin ||Σ λ_j V_j||² over the simplex (cvxopt), d = −Σ λ_j V_j, rescaled to
       ||(1/m) Σ ĝ_i||; d = 0 when Pareto-stationary (||Σλ_j V_j|| ≤ 1e-3 · max_j ||V_j||).
    6. Line search along d, the extra communication A.3 charges it for: candidate steps
       η = η_t, η_t/2, …, η_t/2^s (η_t = the clients' lr of the round, ``round_lr``), largest
       first; the online clients evaluate F(w + ηd) on their training data and the first η
       with Armijo's decrease for every client, F_i(w) − F_i(w + ηd) ≥ β η (−ĝ_i·d) with
       β = 1e-4, and, when the guidance is active, a larger cos(F, 1), is taken. If none
       passes: the tried η with the lowest mean loss below the current one, else no step
       (the reference then takes its smallest or lowest-loss step even if the mean loss
       rises; we never accept a step that increases the mean loss).
       Without the clients' data (``payload.shards`` None) the step is η_t, with no search.
    w ← w + η d (the server step is −η d). Not taken from the code: its switching the
    guidance on whenever some client's loss rose above its running mean (the appendix
    names only the angle test).

    Logged per round: ``fedmdfg_guided``, ``fedmdfg_fairness_angle`` (degrees),
    ``fedmdfg_absent_added``, ``fedmdfg_zero_clients``, ``fedmdfg_line_search_evals``
    (candidate models the clients evaluated) and ``fedmdfg_step_size`` (η, 0 = no step).

    Args:
        theta_degrees: θ, the angle (degrees) between F and 1 above which the fair guidance
            is active (the paper's π/16 = 11.25°); in (0, 90).
        line_search_steps: s, the number of halvings of the step the line search may try
            (s + 1 candidates); 0 = no search below η_t.
        gradient: the client signal, ``"update"`` or ``"full_batch"``.
        larger_steps: the reference code's search also tries 2^s η_t, …, 2η_t first when no
            client of the previous round is absent (full participation); off = the paper's
            "search for a smaller step size".
    """

    reads_training_losses = True  # the clients' losses at w before local training

    def __init__(
        self,
        *args: Any,
        theta_degrees: Annotated[float, Field(gt=0, lt=90, description="in (0, 90) (the paper: 11.25)")] = 11.25,
        line_search_steps: Annotated[settings.CountOrZero, Field(description=">= 0 (the paper: s = 5)")] = 5,
        gradient: GradientSignal = "update",
        larger_steps: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_client_history()  # every client's last ĝ, and the round it came in

    # ------------------------------------------------------------------------- client side
    def train_clients(self, context: RoundContext, shards: ClientShards) -> torch.Tensor:
        if self.hparams.gradient == "full_batch":
            return full_batch_gradients(context, shards)
        return super().train_clients(context, shards)

    def equalised_gradients(self, payload: RoundPayload) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 1-2: which clients sent a non-zero g_i (mask (m,)), and their ĝ_i."""
        g = payload.updates
        if self.hparams.gradient == "update":
            g = g / payload.context.lr
        norms = g.norm(dim=1)
        live = norms > ZERO_SIGNAL
        mu = norms[live].mean()
        return live, g[live] * (mu / norms[live]).unsqueeze(1)

    # ------------------------------------------------------------------------- server side
    def absent_clients(self, online: torch.Tensor) -> torch.Tensor:
        """Step 4: ids of the previous aggregated round's clients that are not online now."""
        previous = self.last_seen.max()
        if previous < 0:
            return self.last_seen.new_zeros(0)
        absent = self.last_seen == previous
        absent[online.to(absent.device)] = False
        return absent.nonzero().flatten()

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """One round of the class docstring's steps: the MGDA direction d over the equalised
        gradients, fair guidance and absent clients, and the line search's η, as the server
        step −η d (0 when no client sent a non-zero update), with the ``fedmdfg_*`` metrics."""
        live, g_hat = self.equalised_gradients(payload)
        absent = self.absent_clients(payload.clients)
        stats: dict[str, float | torch.Tensor] = {"fedmdfg_zero_clients": float((~live).sum()),
                                                  "fedmdfg_absent_added": float(len(absent))}
        if not live.any():
            return ServerStep(torch.zeros_like(payload.updates[0]), metrics=stats)
        payload = payload.select(live)
        losses = payload.training_losses()
        d, guided, qp_fallbacks = self.descent_direction(g_hat, losses, self.history_rows(absent, g_hat))
        eta, evaluations = self.line_search(payload, g_hat, d, guided, same_clients=len(absent) == 0)
        return ServerStep(-eta * d, qp_fallbacks=qp_fallbacks, metrics=stats | {
            "fedmdfg_guided": float(guided),
            "fedmdfg_fairness_angle": fairness_angle(losses),
            "fedmdfg_line_search_evals": float(evaluations),
            "fedmdfg_step_size": eta,
        })

    def descent_direction(
        self, g_hat: torch.Tensor, losses: torch.Tensor, absent: torch.Tensor
    ) -> tuple[torch.Tensor, bool, int]:
        """Steps 3 and 5: d (d,), whether the fair guidance was active, and whether the QP
        fell back to another solver (0 or 1)."""
        m = g_hat.shape[0]
        X = torch.cat([g_hat, absent])  # [ĝ_1..ĝ_m; H_1..H_a]
        C = torch.eye(X.shape[0], dtype=torch.float64, device=X.device)  # V = C X
        guided = fairness_angle(losses) > self.hparams.theta_degrees
        if guided:  # g_h = Σ h_i ĝ_i, the gradient of Fᵀh_t
            fair = torch.zeros_like(C[0])
            fair[:m] = fair_guidance(losses).to(fair)
            C = torch.cat([C[:m], fair.unsqueeze(0), C[m:]])
        vector_gram = C @ gram(X) @ C.T
        qp = min_norm_simplex(vector_gram, solver="cvxopt")
        fallback = int(qp.fallback is not None)
        weights = qp.weights
        u = combine(weights @ C, X)  # Σ λ_j V_j = −d
        stationary = weights @ vector_gram @ weights <= ZERO_DIRECTION**2 * vector_gram.diagonal().max()
        if stationary:
            return torch.zeros_like(u), guided, fallback
        return -u * (g_hat.mean(dim=0).norm() / u.norm()), guided, fallback

    def line_search(
        self,
        payload: RoundPayload,
        g_hat: torch.Tensor,
        d: torch.Tensor,
        guided: bool,
        same_clients: bool,
    ) -> tuple[float, int]:
        """Step 6: the step size η and how many candidate models the clients evaluated."""
        base = payload.context.lr
        if payload.shards is None or not d.any():
            return (base if d.any() else 0.0), 0
        s = self.hparams.line_search_steps
        first = s if self.hparams.larger_steps and same_clients else 0
        candidates = [base * 2.0**k for k in range(first, -s - 1, -1)]
        shards, before = payload.shards, payload.training_losses()
        descent = -(g_hat @ d)  # −ĝ_i·d > 0: client i's first-order decrease per unit step
        w, model = payload.context.global_vector, copy.deepcopy(self.model)
        tried: list[tuple[float, float]] = []
        for eta in candidates:
            assign_model_vector(model, payload.context.layout, w + eta * d)
            after, _ = evaluate_clients(model, shards.x, shards.y, shards.index, shards.sizes)
            tried.append((float(after.mean()), eta))
            armijo = bool((before - after >= ARMIJO_BETA * eta * descent).all())
            if armijo and (not guided or cosine_with_ones(after) > cosine_with_ones(before)):
                return eta, len(tried)
        decreasing = [(mean, eta) for mean, eta in tried if mean < float(before.mean())]
        return (min(decreasing)[1] if decreasing else 0.0), len(tried)

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        live, g_hat = self.equalised_gradients(payload)
        clients = payload.clients[live]
        self.store_history(clients, g_hat, payload.round)
