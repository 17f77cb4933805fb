"""The QPs' shared pieces: the result, the solvers' budgets, and the checks of a Gram matrix and
its box (symmetric, positive semi-definite within rounding, a feasible box) before any solver runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fl_lightning.algorithms.qp.projections import _box_simplex_projection

# Bounds closer than this are one fixed value (a weight is a number in [0, 1]).
_FIXED_WIDTH = 1e-12
# Default budget and tolerance of the torch solver; the tolerance is on the certified
# suboptimality (Frank-Wolfe gap) relative to the problem's scale max|G|.
_DEFAULT_MAX_ITER = 2000
_DEFAULT_TOL = 1e-8
# The torch solver tests convergence every this many iterations (one host sync each time).
_CHECK_EVERY = 10


@dataclass
class QPResult:
    """Solution of one min-norm QP.

    weights: (n,) λ on the simplex (and in the box when one was given), same dtype/device as G.
    objective: λᵀ G λ, the squared norm of the min-norm point Σ λ_j v_j.
    status: "optimal", or what went wrong with the primary solver.
    fallback: None when the primary solver's answer is returned; otherwise the method that
        produced ``weights``: "projected_gradient" (the torch solver, see
        ``torch_solver._accelerated_projected_gradient``) or "centre" (the feasible point
        nearest the box's midpoint, uniform weights without a box).
    """

    weights: torch.Tensor
    objective: float
    status: str
    fallback: str | None = None


# --------------------------------------------------------------------------- input checks


# How far a Gram matrix may be from symmetric, or below zero on its diagonal, relative to
# max|G| before it is refused as "not a Gram matrix". Loose on purpose: callers build G
# from float32 products and rescale rows (FedLF's fair vector), which amplifies rounding;
# real mistakes (a transposed or one-sided matrix, negative "norms") are off by O(1).
_SYMMETRY_TOL = 1e-2
_DIAGONAL_TOL = 1e-2


def _as_gram_tensor(grams, what: str) -> torch.Tensor:
    """``grams`` as a real tensor (array-likes are converted); complex or bool is a TypeError."""
    if not isinstance(grams, torch.Tensor):
        try:
            grams = torch.as_tensor(np.asarray(grams))
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"{what} must be a real tensor (n x n), got {type(grams).__name__}: {error}"
            ) from error
    if grams.is_complex() or grams.dtype == torch.bool:
        raise TypeError(
            f"{what} must hold real numbers (a Gram matrix of real vectors), got dtype {grams.dtype}"
        )
    return grams


def _check_grams(grams: torch.Tensor, what: str) -> None:
    """Square, non-empty, finite, symmetric with a non-negative diagonal (up to rounding)."""
    if grams.ndim < 2 or grams.shape[-1] != grams.shape[-2]:
        raise ValueError(
            f"{what} must be square (n x n), got shape {tuple(grams.shape)}: pass the Gram "
            "matrix G = J Jᵀ of the vectors (core.gram.gram), not the vectors themselves"
        )
    if grams.shape[-1] == 0:
        raise ValueError(f"{what} is empty (n = 0): there must be at least one vector to weight")
    if not bool(torch.isfinite(grams).all()):
        raise ValueError(
            f"{what} has NaN or inf entries: drop the clients whose updates are not finite "
            "before building the Gram matrix"
        )
    if grams.numel() == 0:
        return
    g = grams.detach().to(_work_dtype(grams.device))
    scale = g.abs().amax(dim=(-2, -1), keepdim=True)
    g = g / torch.where(scale > 0, scale, torch.ones_like(scale))  # max|G| = 1: no overflow
    asymmetry = float((g - g.transpose(-1, -2)).abs().max())
    if asymmetry > _SYMMETRY_TOL:
        raise ValueError(
            f"{what} is not symmetric (max |G - Gᵀ| = {asymmetry:.3g} of max|G|): a Gram matrix "
            "has G_ij = v_i · v_j = G_ji; build it with core.gram.gram(J) = J @ J.T"
        )
    lowest = float(torch.diagonal(g, dim1=-2, dim2=-1).min())
    if lowest < -_DIAGONAL_TOL:
        raise ValueError(
            f"{what} has a negative diagonal entry ({lowest:.3g} of max|G|): a Gram matrix holds "
            "the squared norms ||v_i||² >= 0 on its diagonal; pass inner products of vectors "
            "(core.gram.gram), not scores or distances"
        )


def _feasibility_slack(n: int, dtype: torch.dtype) -> float:
    """How far bounds may miss feasibility by rounding (e.g. λ0 computed in float32)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps
    return max(1e-12, 8 * n * eps)


def _effective_box(
    lower: torch.Tensor | None, upper: torch.Tensor | None, n: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Validate the box, intersect it with [0, 1] and return float64 CPU bounds, or (None, None).

    Bounds that miss feasibility only by rounding are nudged onto it (lower scaled down so it
    sums to 1, or upper scaled up); anything more is a ValueError saying which bound to change.
    """
    if lower is None and upper is None:
        return None, None
    given = lower if lower is not None else upper
    assert given is not None
    bound_dtype = given.dtype
    slack = _feasibility_slack(n, bound_dtype)
    checked = []
    for name, bound, default in (("lower", lower, 0.0), ("upper", upper, 1.0)):
        if bound is None:
            bound = torch.full((n,), default, dtype=torch.float64)
        bound = torch.as_tensor(bound).detach().to("cpu", torch.float64).reshape(-1)
        if bound.numel() != n:
            raise ValueError(f"{name} must have one entry per vector ({n}), got {bound.numel()}")
        if bool(torch.isnan(bound).any()):
            raise ValueError(f"{name} has NaN entries: pass finite bounds (or None for no bound)")
        checked.append(bound)
    low, high = checked[0].clamp(min=0.0), checked[1].clamp(max=1.0)
    crossed = torch.nonzero(low > high + slack).flatten().tolist()
    if crossed:
        raise ValueError(
            f"lower > upper (after intersecting with [0, 1]) for weights {crossed}: "
            "make every lower bound at most its upper bound, and upper bounds non-negative"
        )
    high = torch.maximum(high, low)
    if low.sum() > 1 + slack:
        raise ValueError(
            f"the lower bounds sum to {low.sum().item():.6g} > 1, so no weights on the simplex satisfy "
            "them: decrease the lower bounds (with box_around: check that the centre sums to 1)"
        )
    if high.sum() < 1 - slack:
        raise ValueError(
            f"the upper bounds sum to {high.sum().item():.6g} < 1, so no weights on the simplex satisfy "
            "them: increase the upper bounds (with box_around: increase epsilon, or check that "
            "the centre sums to 1)"
        )
    if low.sum() > 1:
        low = low / low.sum()
    if high.sum() < 1:
        high = (high / high.sum()).clamp(max=1.0)
    return low, high


def _unique_feasible_point(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor | None:
    """The single feasible point when the box pins λ (all fixed, or Σlower = 1, or Σupper = 1)."""
    n = low.numel()
    free = int(((high - low) > _FIXED_WIDTH).sum())
    pinned = free <= 1 or low.sum() >= 1 - _FIXED_WIDTH * n or high.sum() <= 1 + _FIXED_WIDTH * n
    if not pinned:
        return None
    return _box_simplex_projection(low[None], low[None], high[None])[0]


def _centre(n: int, low: torch.Tensor | None, high: torch.Tensor | None) -> torch.Tensor:
    """The feasible point nearest the box's midpoint (uniform weights without a box), float64."""
    if low is None or high is None:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    return _box_simplex_projection(((low + high) / 2)[None], low[None], high[None])[0]

def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _scaled_grams(grams: torch.Tensor) -> torch.Tensor:
    """Each Gram symmetrised and divided by its max|G| (the minimiser does not change, so
    tolerances and gaps become relative), in the work dtype of its device."""
    gram = grams.detach().to(_work_dtype(grams.device))
    gram = (gram + gram.transpose(-1, -2)) / 2
    scale = gram.abs().amax(dim=(-1, -2))
    return gram / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None, None]
