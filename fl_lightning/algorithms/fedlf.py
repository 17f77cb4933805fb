"""FedLF (Pan et al., AAAI 2024): layer-wise fair directions (App. A.1, Problems (3) and (8)).

Every layer l gets its own min-norm direction over the clients' layer slices, the slice of
the fair-driven gradient g_P and the last gradients of recently absent clients, so the
update conflicts with no online client at any layer (hence none at model level either).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fl_lightning.algorithms.client_signal import GradientSignal, full_batch_gradients
from fl_lightning.algorithms.qp import min_norm_simplex, solve_min_norm_batch
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.gram import layer_combination, layer_grams
from fl_lightning.core.local import ClientShards
from fl_lightning.core.module import FederatedModule, RoundContext, RoundPayload, ServerStep

QPSolver = Literal["batched", "cvxopt"]
FairGradient = Literal["paper", "reference"]


def fair_coefficients(losses: torch.Tensor) -> torch.Tensor | None:
    """q of eq. (7), g_P = Σ_i q_i g_i = −∇cos(1, F):
    q = (1/||F||) ((Fᵀ1 / (||1|| ||F||²)) F − 1/||1||).

    None when all losses are equal (to float64 rounding): then q = 0, and a zero vector
    in the hull would make every min-norm direction 0 (the reference code divides by 0).
    """
    F = losses.double()
    if F.max() - F.min() <= 1e-12 * F.abs().max():
        return None
    ones = torch.ones_like(F)
    return ((F @ ones) / (ones.norm() * F.norm() ** 2) * F - ones / ones.norm()) / F.norm()


@register_algorithm
class FedLF(FederatedModule):
    """FedLF, App. A.1. Per round t, with X = [g_1..g_m; H_1..H_a]:

    1. g_i = (w − w_i)/η_t after E local epochs (``gradient="update"``, A.4), or the full
       local gradient at w (``"full_batch"``, the authors' code); F = losses at w.
    2. g_P = Σ q_i g_i, the gradient of P(w) = −cos(1, F(w)) (eq. (7); left out when q = 0).
    3. Absent clients (Problem (8)): with M clients seen before this round, if M > m,
       τ = ⌊M/m⌋ and every absent client last online in rounds t−τ..t−1 adds its last g, H_k
       (kept in a (K, d) buffer: K model copies of memory, as FedFV's history).
    4. Per layer l, V = {g_{i,l}} ∪ {g_{P,l}} ∪ {H_{k,l}}, each rescaled to the mean norm of
       the online clients' slices (reference code), λ = argmin ||Σλ_j V_j||² on the simplex
       (Problem (3)), d_l = −Σλ_j V_j. All layers in one batched QP (or cvxopt per layer).
    5. Combine layers: while some d_l ≈ 0 (||d_l|| ≤ ``zero_tol`` · max_j ||V_{j,l}||), merge
       that layer with the next (the previous for the last) and re-solve; a merged group
       is one "layer" whose raw Gram is the sum of its layers' Grams (rescaling is then done
       on the whole group, which keeps the model-level guarantee).
    6. d = concat(d_l) rescaled to ||(1/m) Σ g_i||; w ← w + η_t d.

    Everything is in Gram space: each V_{j,l} is a combination of rows of X, so the QP
    Grams are C_l G_l C_lᵀ with G_l = X_l X_lᵀ, and d is one ``layer_combination``.

    Logged per round: ``fedlf_fair_used`` (g_P in the QP), ``fedlf_absent_added``,
    ``fedlf_tau``, ``fedlf_layers_merged`` (layers inside merged groups),
    ``fedlf_zero_layers`` (layers left with d_l = 0), ``fedlf_qp_fallbacks`` (QPs whose solver
    failed: cvxopt's, answered by the torch solver, or the batched solver's stopped at ``max_iter``
    above its tolerance, answered with feasible but uncertified weights).
    The final layer groups, with whether their d_l is 0, are the step's ``details["groups"]``.

    Args:
        gradient: the client signal, ``"update"`` (paper) or ``"full_batch"`` (authors' code).
        server_lr: η as a multiple of the clients' ``lr`` (as FedAvg's ``server_lr``): η_t =
            server_lr · lr · server_lr_decay^t. 1.0 is the paper's setting (the server uses the
            clients' learning rate, so the step has the size of the averaged update).
        server_lr_decay: the paper's 0.999 per round.
        qp_solver: ``"batched"`` (every layer at once in torch) or ``"cvxopt"`` (one QP per
            layer, the paper's solver, reltol 1e-6).
        combine_layers: step 5 (the paper; the reference code does not combine layers).
        zero_tol: d_l counts as 0 when ||d_l|| ≤ zero_tol · max_j ||V_{j,l}||. It must stay
            well above the QP's accuracy (√1e-8 for the batched solver), so that a layer
            counted as non-zero really has d_l · V_{j,l} < 0 for every j.
        fair_gradient: ``"paper"`` (g_{P,l} is the slice of Σ q_i g_i) or ``"reference"``
            (g_{P,l} = Σ q_i V_{i,l}, from the rescaled slices, as the authors' code).
    """

    reads_training_losses = True  # the clients' losses at w before local training

    def __init__(
        self,
        *args: Any,
        gradient: GradientSignal = "update",
        server_lr: Annotated[settings.StepSize, Field(description="> 0 (a multiple of lr; 1.0 = the paper)")] = 1.0,
        server_lr_decay: Annotated[settings.Decay, Field(description="in (0, 1] (the paper: 0.999)")] = 0.999,
        qp_solver: QPSolver = "batched",
        combine_layers: bool = True,
        zero_tol: Annotated[float, Field(gt=0, lt=1, description="in (0, 1) (default 1e-3)")] = 1e-3,
        fair_gradient: FairGradient = "paper",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_client_history()  # H_k: every client's last g, and the round it came in

    # ------------------------------------------------------------------------- client side
    def train_clients(self, context: RoundContext, shards: ClientShards) -> torch.Tensor:
        if self.hparams.gradient == "full_batch":
            return full_batch_gradients(context, shards)
        return super().train_clients(context, shards)

    def client_gradients(self, payload: RoundPayload) -> torch.Tensor:
        """g_i (m, d): w − w_i divided by the round's local lr η_t (A.4), or the gradient itself."""
        if self.hparams.gradient == "update":
            return payload.updates / payload.context.lr
        return payload.updates

    def server_step_size(self, round_index: int) -> float:
        """η_t = server_lr · lr · server_lr_decay^t."""
        return self.hparams.server_lr * self.hparams.lr * self.hparams.server_lr_decay**round_index

    # ------------------------------------------------------------------------- server side
    def absent_clients(self, payload: RoundPayload) -> tuple[torch.Tensor, int]:
        """Step 3: ids of the absent clients last online in rounds t−τ..t−1, and τ (0 = none)."""
        t, m = payload.round, payload.num_clients
        seen = self.last_seen >= 0
        M = int(seen.sum())
        if M <= m:
            return self.last_seen.new_zeros(0), 0
        tau = M // m
        recent = seen & (t - self.last_seen <= tau)
        recent[payload.clients.to(recent.device)] = False
        return recent.nonzero().flatten(), tau

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """Steps 1-6 of the class docstring (Pan et al., AAAI 2024, App. A.1): the layer-wise
        min-norm direction d rescaled to ||(1/m) Σ g_i||, as the server step −η_t d (0 when
        every layer group is Pareto-stationary), with the ``fedlf_*`` metrics."""
        t, m = payload.round, payload.num_clients
        g = self.client_gradients(payload)  # step 1
        q = fair_coefficients(payload.training_losses())  # step 2
        absent, tau = self.absent_clients(payload)  # step 3
        X = torch.cat([g, self.history_rows(absent, g)])  # raw vectors [g_i; H_k]
        grams = layer_grams(X, payload.context.layer_slices)
        coefficients, groups, fallbacks = self.layerwise_min_norm(grams, m, q, torch.finfo(X.dtype).eps)
        u = layer_combination(coefficients, X, payload.context.layer_slices)  # Σ_j λ_j V_j per layer = −d
        u64 = u.double()  # norms in float64: float32 ones overflow for finite updates beyond ~1e19
        if u64.norm() == 0:  # Pareto-stationary at every layer group: d = 0
            step = torch.zeros_like(u)
        else:  # step 6: ||d|| = ||(1/m) Σ g_i||, w ← w + η_t d, i.e. the server step is −η_t d
            step = (self.server_step_size(t) * g.double().mean(dim=0).norm() * u64 / u64.norm()).to(u.dtype)
        return ServerStep(step, qp_fallbacks=fallbacks, details={"groups": groups}, metrics={
            "fedlf_fair_used": float(q is not None),
            "fedlf_absent_added": float(len(absent)),
            "fedlf_tau": float(tau),
            "fedlf_layers_merged": float(sum(len(group) for group, _ in groups if len(group) > 1)),
            "fedlf_zero_layers": float(sum(len(group) for group, zero in groups if zero)),
            "fedlf_qp_fallbacks": float(fallbacks),
        })

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        self.store_history(payload.clients, self.client_gradients(payload), payload.round)

    # ------------------------------------------------------------------ steps 4 and 5
    def layerwise_min_norm(
        self, grams: torch.Tensor, m: int, q: torch.Tensor | None, eps: float = torch.finfo(torch.float32).eps
    ) -> tuple[torch.Tensor, list[tuple[list[int], bool]], int]:
        """Per-layer coefficients (L, n_X) over the rows of X with Σ_j λ_j V_j = coeffs_l @ X_l,
        the final layer groups with whether their direction is 0, and the QP fallback count.
        ``eps``: the machine epsilon of the vectors the Grams were multiplied from."""
        groups = [[layer] for layer in range(grams.shape[0])]
        solved: dict[tuple[int, ...], tuple[torch.Tensor, bool]] = {}
        fallbacks = 0
        while True:
            todo = [group for group in groups if tuple(group) not in solved]
            if todo:
                raw = torch.stack([grams[group].sum(dim=0) for group in todo])  # merged = summed Grams
                C = self.qp_vectors(raw, m, q, eps)  # (B, n_V, n_X)
                vector_grams = C @ raw @ C.transpose(1, 2)  # V Vᵀ per group
                vector_grams = (vector_grams + vector_grams.transpose(1, 2)) / 2  # exactly symmetric
                weights, failed = self.solve(vector_grams)
                fallbacks += failed
                coefficients = (weights.unsqueeze(1) @ C).squeeze(1)  # λ C: (B, n_X)
                squared_norm = torch.einsum("bi,bij,bj->b", coefficients, raw, coefficients)
                largest = vector_grams.diagonal(dim1=1, dim2=2).amax(dim=1)
                zero = squared_norm <= self.hparams.zero_tol**2 * largest
                for group, row, is_zero in zip(todo, coefficients, zero.tolist()):
                    solved[tuple(group)] = (torch.zeros_like(row) if is_zero else row, is_zero)
            zeros = [solved[tuple(group)][1] for group in groups]
            if not (self.hparams.combine_layers and any(zeros) and len(groups) > 1):
                break
            groups = merge_zero_groups(groups, zeros)
        rows = torch.zeros(grams.shape[0], grams.shape[1], dtype=grams.dtype, device=grams.device)
        for group in groups:
            rows[group] = solved[tuple(group)][0]
        return rows, [(group, solved[tuple(group)][1]) for group in groups], fallbacks

    def qp_vectors(
        self, raw: torch.Tensor, m: int, q: torch.Tensor | None, eps: float = torch.finfo(torch.float32).eps
    ) -> torch.Tensor:
        """C (B, n_V, n_X): the QP's vectors as combinations of X's rows, for B layer groups
        with raw Grams ``raw`` (B, n_X, n_X). Rows: the m online clients, g_P (if q), the
        absent clients; each rescaled to μ = mean_i ||g_{i,l}|| over the online clients
        (a zero client vector stays zero).

        g_P = Σ_i q_i g_{i,l} has no direction when its norm is below what its Gram form can
        resolve, √eps · Σ_i |q_i| ||g_{i,l}|| (the q_i have both signs, so the sum can cancel):
        there it is left out of the group's QP, as for equal losses, by repeating the first
        client's row (a repeated vector leaves the convex hull unchanged)."""
        norms = raw.diagonal(dim1=1, dim2=2).clamp(min=0).sqrt()  # ||X_{j,l}||
        mu = norms[:, :m].mean(dim=1, keepdim=True)
        scale = torch.where(norms > 0, mu / norms, 0.0)
        C = torch.diag_embed(scale)
        if q is None:
            return C
        fair = torch.zeros_like(scale)
        fair[:, :m] = q.to(raw) if self.hparams.fair_gradient == "paper" else q.to(raw) * scale[:, :m]
        fair_norm = torch.einsum("bi,bij,bj->b", fair, raw, fair).clamp(min=0).sqrt().unsqueeze(1)
        resolvable = fair_norm > eps**0.5 * (fair.abs() * norms).sum(dim=1, keepdim=True)
        fair = torch.where(resolvable, fair * mu / torch.where(resolvable, fair_norm, 1.0), C[:, 0])
        return torch.cat([C[:, :m], fair.unsqueeze(1), C[:, m:]], dim=1)

    def solve(self, grams: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Problem (3) for every gram in (B, n, n): λ (B, n) and the number of QP fallbacks."""
        if self.hparams.qp_solver == "batched":  # a QP stopped at max_iter uncertified counts as a fallback
            batch = solve_min_norm_batch(grams)
            return batch.weights, batch.unconverged
        results = [min_norm_simplex(gram, solver="cvxopt", reltol=1e-6) for gram in grams]
        return torch.stack([r.weights for r in results]), sum(r.fallback is not None for r in results)


def merge_zero_groups(groups: list[list[int]], zero: list[bool]) -> list[list[int]]:
    """Step 5, one pass: every group whose direction is 0 joins the next group (the last one
    joins the previous); the merged groups are then solved again."""
    merged: list[list[int]] = []
    i = 0
    while i < len(groups):
        if zero[i] and i + 1 < len(groups):
            merged.append(groups[i] + groups[i + 1])
            i += 2
        elif zero[i] and merged:
            merged[-1] = merged[-1] + groups[i]
            i += 1
        else:
            merged.append(groups[i])
            i += 1
    return merged
