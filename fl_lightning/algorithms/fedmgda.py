"""FedMGDA+ (Hu et al. 2022, "Federated learning meets multi-objective optimization"), Alg. 1,
and the variants the paper compares: FedMGDA, FedAvg-n and MGDA-Prox.

The QP of line 5 only needs the Gram matrix of the normalised updates,
Ĝ = D G D with G = J Jᵀ and D = diag(1 / (||g_i|| + 1e-8)); the direction is one
combination (λ ⊙ diag D) @ J, so no normalised copy of J is ever formed.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.qp import box_around, min_norm_simplex
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.gram import combine, gram
from fl_lightning.core.local import with_proximal_term
from fl_lightning.core.module import FederatedModule, RoundContext, RoundPayload, ServerStep

# the settings the variants below declare again with their own defaults, checked as FedMGDA+'s are
BoxHalfWidth = Annotated[float, Field(ge=0, allow_inf_nan=False, description=(
    "a finite number >= 0 (0 = FedAvg weights, >= 1 = MGDA)"))]
ProximalWeight = Annotated[settings.Penalty, Field(description=">= 0 (0 = no proximal term)")]


@register_algorithm
class FedMGDAPlus(FederatedModule):
    """FedMGDA+: the min-norm convex combination of the (normalised) updates, near λ0.

    Per round t (Alg. 1):
      line 4: ĝ_i = g_i / (||g_i|| + 1e-8)                      (``normalize``)
      line 5: λ* = argmin_{λ ∈ Δ, ||λ - λ0||_∞ <= ε} ||Σ_i λ_i ĝ_i||², λ0_i = n_i / Σ_j n_j (eq. 25)
      line 6: d_t = Σ_i λ*_i ĝ_i
      line 9: w <- w - η_t d_t, η_t = η · β^⌊t/100⌋ with β = decay^(100/T) (Sec. 6.1; t counts
              rounds from 0, T = ``num_rounds``).
    ε = 0 is FedAvg with weights λ0 (FedAvg-n when normalised); ε >= 1 is MGDA (eq. 23).
    The round's λ* and the QP's status are in its step's ``details`` (``lambda``, ``qp_status``).
    Logged per round: ``qp_fallback`` (1 when cvxopt failed and a fallback solver answered),
    ``qp_fallbacks_total`` and ``global_lr``. The share of participants whose training loss
    did not increase (footnote 6) is logged as ``improved_fraction`` (``track_improvement``
    defaults to True here).

    Args:
        epsilon: ε >= 0, half-width of the box around λ0 (default 0.1; FedFV's Table 1 runs
            FedMGDA+ at {0.01, 0.05, 0.1, 0.5, 1}).
        normalize: normalise every update to unit length before the QP (FedMGDA+: True).
        global_lr: η > 0, the server step size (default 1.0), or None for this round's
            local lr (the FedLF repository's FedMGDA+ steps w <- w - lr·d).
        decay: the total decay of η over the run, in (0, 1]; 1.0 = constant η (the
            paper's "decay 0" setting); the paper uses 1/10 and 1/40.
        mu: μ >= 0, FedProx's proximal term (μ/2)||w_i - w||² in every client's local
            objective; μ > 0 is MGDA-Prox (the paper: μ = 0.1).
    """

    def __init__(
        self,
        *args: Any,
        epsilon: BoxHalfWidth = 0.1,
        normalize: bool = True,
        global_lr: Annotated[settings.StepSize | None, Field(
            description="> 0, or null for the local learning rate")] = 1.0,
        decay: Annotated[settings.Decay, Field(
            description="in (0, 1] (1.0 = no decay; the paper uses 1/10 or 1/40)")] = 1.0,
        mu: ProximalWeight = 0.0,
        track_improvement: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs["track_improvement"] = track_improvement
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def global_lr_at(self, context: RoundContext) -> float:
        """η_t = η · β^⌊t/100⌋ with β = decay^(100/T) (Sec. 6.1); η = the round's local lr
        when ``global_lr`` is None."""
        beta = self.hparams.decay ** (100 / self.hparams.num_rounds)
        eta = context.lr if self.hparams.global_lr is None else self.hparams.global_lr
        return eta * beta ** (context.round // 100)

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """Alg. 1 of Hu et al. (2022), lines 4-9: λ* of the QP over the box around λ0 and
        the server step η_t Σ_i λ*_i ĝ_i, with λ* and the QP's status in ``details``."""
        updates = payload.updates
        G = gram(updates)  # g_i · g_j
        if self.hparams.normalize:  # line 4: ĝ_i = g_i / (||g_i|| + 1e-8)
            scale = 1.0 / (G.diagonal().clamp(min=0).sqrt() + 1e-8)
        else:
            scale = torch.ones_like(G.diagonal())
        G_hat = scale[:, None] * G * scale[None, :]  # ĝ_i · ĝ_j
        lambda0 = payload.num_samples.to(G.dtype) / payload.num_samples.sum()  # λ0_i = n_i / n
        qp = min_norm_simplex(G_hat, *box_around(lambda0, self.hparams.epsilon))  # line 5
        eta = self.global_lr_at(payload.context)
        fallback = qp.fallback is not None
        return ServerStep(eta * combine(qp.weights * scale, updates),  # lines 6 and 9: η_t Σ_i λ*_i ĝ_i
                          metrics={"qp_fallback": float(fallback), "global_lr": eta}, qp_fallbacks=int(fallback),
                          details={"lambda": qp.weights, "qp_status": qp.status})

    def client_objective(self, logits, targets, mask, local_params, global_params) -> torch.Tensor:
        loss = super().client_objective(logits, targets, mask, local_params, global_params)
        return with_proximal_term(loss, self.hparams.mu, local_params, global_params, tuple(global_params))  # MGDA-Prox


@register_algorithm
class FedMGDA(FedMGDAPlus):
    """FedMGDA, the vanilla extension of MGDA to FL: ε = 1 (no box) and no normalisation.

    Args:
        epsilon: ε >= 0, half-width of the box around λ0 (default 1.0: no box).
        normalize: normalise every update to unit length before the QP (default False).
    """

    def __init__(self, *args: Any, epsilon: BoxHalfWidth = 1.0, normalize: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, epsilon=epsilon, normalize=normalize, **kwargs)


@register_algorithm
class FedAvgN(FedMGDAPlus):
    """FedAvg-n: FedAvg with weights λ0 = n_i / n on the normalised updates (ε = 0).

    Args:
        epsilon: ε >= 0, half-width of the box around λ0 (default 0.0: the weights λ0).
        normalize: normalise every update to unit length before the QP (default True).
    """

    def __init__(self, *args: Any, epsilon: BoxHalfWidth = 0.0, normalize: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, epsilon=epsilon, normalize=normalize, **kwargs)


@register_algorithm
class MGDAProx(FedMGDAPlus):
    """MGDA-Prox: FedMGDA+ whose clients add FedProx's (μ/2)||w_i - w||² (μ = 0.1, Table 5).

    Args:
        mu: μ >= 0, the proximal weight (default 0.1).
    """

    def __init__(self, *args: Any, mu: ProximalWeight = 0.1, **kwargs: Any) -> None:
        super().__init__(*args, mu=mu, **kwargs)
