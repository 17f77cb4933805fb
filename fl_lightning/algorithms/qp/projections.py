"""Euclidean projections onto the simplex and onto a box intersected with it (Duchi et al.,
ICML 2008, Fig. 1 for the simplex): the projected-gradient solver's step and AFL's lambda step."""

from __future__ import annotations

import math

import torch

# --------------------------------------------------------------------------- projections


def simplex_projection(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each vector along the last dim onto the probability simplex.

    Exact, sort-based (Held, Wolfe & Crowder 1974; Duchi et al. 2008): with u = v sorted
    descending, ρ = max{k : u_k − (Σ_{i≤k} u_i − 1)/k > 0}, θ = (Σ_{i≤ρ} u_i − 1)/ρ, the
    projection is max(v − θ, 0). Batched along leading dims, differentiable almost everywhere.
    """
    if v.shape[-1] == 0:
        raise ValueError("simplex_projection needs at least one coordinate in the last dim")
    if not torch.is_floating_point(v):
        v = v.to(torch.get_default_dtype())
    if not bool(torch.isfinite(v).all()):
        raise ValueError("simplex_projection got NaN or inf entries: filter them out first")
    n = v.shape[-1]
    sorted_desc = torch.sort(v, dim=-1, descending=True).values
    excess = sorted_desc.cumsum(dim=-1) - 1.0
    ranks = torch.arange(1, n + 1, dtype=v.dtype, device=v.device)
    # The condition holds on a prefix of the ranks, so counting gives ρ (always ≥ 1).
    rho = (sorted_desc - excess / ranks > 0).sum(dim=-1, keepdim=True).clamp(min=1)
    theta = excess.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp(min=0.0)


def _weighted_simplex_projection(v: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """Exact projection of rows v onto {x ≥ 0, Σ_j a_j x_j = 1} for positive coefficients a.

    x = max(v − θa, 0); with the coordinates sorted by v_j/a_j descending, θ is
    (Σ_{i≤ρ} a_i v_i − 1)/Σ_{i≤ρ} a_i² for the largest ρ whose v_ρ/a_ρ exceeds it.
    a = 1 is ``simplex_projection``.
    """
    order = torch.argsort(v / coefficients, dim=-1, descending=True)
    v_sorted, a_sorted = v.gather(-1, order), coefficients.gather(-1, order)
    thetas = ((a_sorted * v_sorted).cumsum(-1) - 1.0) / (a_sorted**2).cumsum(-1)
    rho = (v_sorted / a_sorted > thetas).sum(-1, keepdim=True).clamp(min=1)
    theta = thetas.gather(-1, rho - 1)
    return (v - theta * coefficients).clamp(min=0.0)


def _box_simplex_projection(
    v: torch.Tensor,
    lower: torch.Tensor,
    upper: torch.Tensor,
    coefficients: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact projection of rows v (B, n) onto {Σ_j a_j x_j = 1, lower ≤ x ≤ upper}, a = 1 by default.

    The projection is clamp(v − θa, lower, upper) with θ the root of the non-increasing,
    piecewise-linear s(θ) = Σ_j a_j clamp(v_j − θa_j, lower_j, upper_j) − 1. Its kinks are
    (v − upper)/a and (v − lower)/a: evaluate s at all 2n kinks (sorted), find the segment
    where s crosses 0 and interpolate linearly. O(B n²) work, no iteration. Needs
    Σ a·lower ≤ 1 ≤ Σ a·upper and lower ≤ upper (the callers check).
    """
    a = torch.ones_like(v) if coefficients is None else coefficients
    kinks = torch.sort(
        torch.cat([(v - upper) / a, (v - lower) / a], dim=-1), dim=-1
    ).values  # (B, 2n)
    clamped = torch.clamp(
        v.unsqueeze(-2) - kinks.unsqueeze(-1) * a.unsqueeze(-2),
        lower.unsqueeze(-2),
        upper.unsqueeze(-2),
    )
    total = (clamped * a.unsqueeze(-2)).sum(-1)  # s(kink) + 1, non-increasing along the kinks
    above = (total > 1.0).sum(-1, keepdim=True)  # kinks strictly left of the root
    right = above.clamp(max=kinks.shape[-1] - 1)
    left = (above - 1).clamp(min=0)
    k_left, k_right = kinks.gather(-1, left), kinks.gather(-1, right)
    s_left, s_right = total.gather(-1, left), total.gather(-1, right)
    drop = s_left - s_right
    safe_drop = torch.where(drop > 0, drop, torch.ones_like(drop))
    theta = torch.where(drop > 0, k_left + (s_left - 1.0) / safe_drop * (k_right - k_left), k_right)
    return torch.clamp(v - theta * a, lower, upper)


def _project(
    v: torch.Tensor, lower: torch.Tensor | None, upper: torch.Tensor | None
) -> torch.Tensor:
    """Exact projection of rows v onto the simplex, intersected with the box when given."""
    if lower is None or upper is None:  # a box's bounds come in pairs (``_effective_box``)
        return simplex_projection(v)
    return _box_simplex_projection(v, lower, upper)


def box_around(
    center: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Bounds of FedMGDA+'s box |λ − center|_∞ ≤ ε (Hu et al., IEEE TNSE 2022, eq. (25)) within [0, 1].

    Returns (max(0, center − ε), min(1, center + ε)). ε ≥ 1 constrains nothing on the
    simplex (the paper's "ε = 1 recovers MGDA"), so it returns (None, None); ε = 0 pins λ to
    the centre (FedAvg with weights λ0).
    """
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(
            f"epsilon must be a finite number >= 0 (the box half-width), got {epsilon}"
        )
    if epsilon >= 1:
        return None, None
    return (center - epsilon).clamp(min=0.0), (center + epsilon).clamp(max=1.0)
