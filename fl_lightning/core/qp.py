"""Min-norm points of convex hulls: quadratic programs over the simplex, in coefficient space.

FedMGDA+ (Hu et al., IEEE TNSE 2022, eq. (23) and (25), Alg. 1 line 5), FedLF (Pan et al.,
AAAI 2024, App. A.1, Problem (3)) and FedMDFG all need convex weights over vectors v_1..v_n with

    λ* = argmin_λ ||Σ_j λ_j v_j||² = argmin_λ λᵀ G λ   s.t.  Σ_j λ_j = 1,  λ ≥ 0
                                                         (and lower ≤ λ ≤ upper for FedMGDA+'s box),

where G = V Vᵀ is the Gram matrix of the vectors. Nothing here sees the vectors: callers
build G once (``fl_lightning.core.flat``) and form the direction as ``weights @ V``.

- ``min_norm_simplex``: one QP with cvxopt's interior-point solver (the papers' choice),
  falling back to a torch solver, with a warning, when cvxopt fails.
- ``batched_min_norm_simplex``: many independent small QPs at once in torch (FedLF's
  per-layer QPs), with a certified stopping rule.
- ``simplex_projection`` and ``box_around``: the pieces, also used on their own (AFL's λ step).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from cvxopt import matrix as cvxopt_matrix
from cvxopt import solvers as cvxopt_solvers

__all__ = [
    "QPResult",
    "batched_min_norm_simplex",
    "box_around",
    "min_norm_simplex",
    "simplex_projection",
]

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
        ``batched_min_norm_simplex``) or "centre" (the feasible point nearest the box's
        midpoint, uniform weights without a box).
    """

    weights: torch.Tensor
    objective: float
    status: str
    fallback: str | None = None


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


# --------------------------------------------------------------------------- torch solver


def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _frank_wolfe_gap(
    gram: torch.Tensor,
    weights: torch.Tensor,
    lower: torch.Tensor | None,
    upper: torch.Tensor | None,
) -> torch.Tensor:
    """max_{s feasible} ∇f(λ)ᵀ(λ − s) for f = λᵀGλ: an upper bound on f(λ) − f(λ*), zero at λ*.

    Without a box the best vertex is e_j with j = argmin (Gλ)_j, so gap = 2(λᵀGλ − min_j (Gλ)_j);
    with a box, s starts at lower and fills the remaining mass 1 − Σ lower up to upper in
    order of increasing gradient.
    """
    grad = 2 * (gram @ weights.unsqueeze(-1)).squeeze(-1)
    at_weights = (grad * weights).sum(-1)
    if lower is None or upper is None:
        return at_weights - grad.min(-1).values
    order = torch.argsort(grad, dim=-1)
    room = (upper - lower).gather(-1, order)
    budget = (1.0 - lower.sum(-1, keepdim=True)).clamp(min=0.0)
    filled = torch.minimum((budget - (room.cumsum(-1) - room)).clamp(min=0.0), room)
    at_vertex = (grad * lower).sum(-1) + (grad.gather(-1, order) * filled).sum(-1)
    return at_weights - at_vertex


def _suboptimality_bound(
    gram: torch.Tensor,
    weights: torch.Tensor,
    lower: torch.Tensor | None,
    upper: torch.Tensor | None,
) -> torch.Tensor:
    """A certified bound on f(λ) − f(λ*): the Frank-Wolfe gap, or f(λ) itself since f* ≥ 0.

    The second matters when the hull contains 0 (Pareto-stationary, f* = 0): there the gap
    shrinks only like sqrt(f(λ)), so it alone would demand ||Σλv|| below the tolerance.
    """
    objective = (weights * (gram @ weights.unsqueeze(-1)).squeeze(-1)).sum(-1)
    return torch.minimum(_frank_wolfe_gap(gram, weights, lower, upper), objective)


class _Slots:
    """Where the problems still iterating sat in the batch they were given in.

    MKL's batched triangular solves round differently with a matrix's offset in memory (seen
    with torch 2.14's ``cholesky_solve`` on CPU: a problem moved to another place in the batch
    gets answers that differ in the last bit; one moved by a multiple of 64 bytes does not).
    So that dropping finished problems changes no bit of the others, the solve puts each
    problem at a place of the same offset modulo 64 bytes as its original one, packed as
    tightly as that allows (the other places hold identity factors, and their answers are
    dropped).
    """

    def __init__(self, itemsize: int) -> None:
        self.period = max(1, 64 // itemsize)
        self.place: torch.Tensor | None = None  # where each active problem is solved; None: where it is
        self.size = 0

    def keep(self, index: torch.Tensor) -> None:
        """The active problems are now those at ``index`` of the original batch."""
        residue = index % self.period
        rank = torch.zeros_like(residue)  # the k-th active problem of residue r goes to r + period·k
        for value in residue.unique().tolist():
            members = residue == value
            rank[members] = torch.arange(int(members.sum()), device=residue.device)
        self.place = residue + self.period * rank
        self.size = int(self.place.max()) + 1 if self.place.numel() else 0

    def cholesky_solve(self, right: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        if self.place is None:
            return torch.cholesky_solve(right, factor)
        n = factor.shape[-1]
        packed_factor = torch.eye(n, dtype=factor.dtype, device=factor.device).repeat(self.size, 1, 1)
        packed_right = right.new_zeros((self.size, *right.shape[1:]))
        packed_factor[self.place], packed_right[self.place] = factor, right
        return torch.cholesky_solve(packed_right, packed_factor)[self.place]


def _face_minimiser(
    gram: torch.Tensor, weights: torch.Tensor, free: torch.Tensor, slots: _Slots | None = None
) -> torch.Tensor:
    """Minimiser of λᵀGλ over the affine hull of a face: free coordinates move, others stay.

    KKT on the face: G_FF λ_F + (G λ_held)_F = μ1 and Σλ = 1, one batched Cholesky solve with
    H = G_FF + 1e-12·diag(G_FF) (so a rank-deficient G_FF still factors). Returns ``weights``
    where the solve fails. The result may leave the box; see ``_polish_on_face``. ``slots``:
    where these problems sat in the batch they came from (see ``_Slots``).
    """
    mask = free.to(weights.dtype)
    held = weights * (1 - mask)
    ridge = 1e-12 * torch.diagonal(gram, dim1=-2, dim2=-1) + 1e-200
    hessian = gram * mask.unsqueeze(-1) * mask.unsqueeze(-2) + torch.diag_embed(1 - mask + ridge)
    factor, info = torch.linalg.cholesky_ex(hessian)
    right = torch.stack([mask, -mask * (gram @ held.unsqueeze(-1)).squeeze(-1)], dim=-1)
    solved = torch.cholesky_solve(right, factor) if slots is None else slots.cholesky_solve(right, factor)
    towards_one, offset = solved[..., 0], solved[..., 1]
    mass = towards_one.sum(-1, keepdim=True)
    multiplier = (1 - held.sum(-1, keepdim=True) - offset.sum(-1, keepdim=True)) / torch.where(
        mass > 0, mass, torch.ones_like(mass)
    )
    minimiser = held + mask * (offset + multiplier * towards_one)
    usable = (info == 0) & (mass.squeeze(-1) > 0) & torch.isfinite(minimiser).all(-1)
    return torch.where(usable[:, None], minimiser, weights)


def _polish_on_face(
    gram: torch.Tensor,
    weights: torch.Tensor,
    lower: torch.Tensor | None,
    upper: torch.Tensor | None,
    steps: int = 6,
    slots: _Slots | None = None,
) -> torch.Tensor:
    """A few active-set steps from ``weights``: move towards the face's exact minimiser.

    Each step computes the minimiser on the affine hull of the current face
    (``_face_minimiser``) and moves towards it until it arrives or a weight hits its bound
    (ratio test; that weight then leaves the face). The objective never increases and the
    weights stay feasible. Once the iterates are on the optimal face this lands on the
    solution in one step instead of converging to it; the caller keeps the result only
    where it certifies a smaller suboptimality.
    """
    low = torch.zeros_like(weights) if lower is None else lower
    high = torch.ones_like(weights) if upper is None else upper
    for _ in range(steps):
        free = (weights > low) & (weights < high)
        direction = _face_minimiser(gram, weights, free, slots) - weights
        room = torch.where(direction < 0, weights - low, high - weights)
        ratio = torch.where(free & (direction != 0), room / direction.abs(), torch.inf)
        step = ratio.amin(-1, keepdim=True).clamp(max=1.0)
        weights = weights + step * direction
        blocked = free & (ratio <= step)
        weights = torch.where(blocked & (direction < 0), low, weights)
        weights = torch.where(blocked & (direction > 0), high, weights)
    return _project(weights, lower, upper)


@dataclass
class _TorchSolve:
    weights: torch.Tensor  # (B, n), work dtype
    gap: torch.Tensor  # (B,) certified suboptimality f(λ) − f(λ*), relative to max|G|
    iterations: int


@dataclass
class _Problems:
    """The fixed data of the problems still in a batch (Jacobi-scaled, see below)."""

    gram: torch.Tensor  # (B, n, n) scaled by max|G|
    norms: torch.Tensor  # (B, n) sqrt(diag G)
    inverse_norms: torch.Tensor
    correlation: torch.Tensor  # D⁻¹ G D⁻¹
    unit_normal: torch.Tensor  # the constraint hyperplane's unit normal in μ-space
    lipschitz: torch.Tensor  # (B,)
    lower: torch.Tensor | None
    upper: torch.Tensor | None

    def project(self, mu: torch.Tensor) -> torch.Tensor:
        """Exact projection onto {Σ_j μ_j/norms_j = 1, norms∘lower ≤ μ ≤ norms∘upper}."""
        if self.lower is None or self.upper is None:
            return _weighted_simplex_projection(mu, self.inverse_norms)
        return _box_simplex_projection(mu, self.lower * self.norms, self.upper * self.norms, self.inverse_norms)

    def select(self, keep: torch.Tensor) -> _Problems:
        def pick(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[keep]
        return _Problems(self.gram[keep], self.norms[keep], self.inverse_norms[keep], self.correlation[keep],
                         self.unit_normal[keep], self.lipschitz[keep], pick(self.lower), pick(self.upper))


@dataclass
class _Iterates:
    """FISTA's state per problem, and the best certified weights so far."""

    mu: torch.Tensor
    extrapolated: torch.Tensor
    momentum: torch.Tensor
    best: torch.Tensor
    best_gap: torch.Tensor
    finished: torch.Tensor  # certified: best is final

    def select(self, keep: torch.Tensor) -> _Iterates:
        return _Iterates(*(value[keep] for value in vars(self).values()))


def _accelerated_projected_gradient(
    grams: torch.Tensor,
    lower: torch.Tensor | None = None,
    upper: torch.Tensor | None = None,
    max_iter: int = _DEFAULT_MAX_ITER,
    tol: float = _DEFAULT_TOL,
    drop_finished: bool | None = None,
) -> _TorchSolve:
    """Jacobi-preconditioned FISTA with adaptive restart on min λᵀGλ over the simplex (∩ box).

    grams (B, n, n) finite; lower/upper (B, n) feasible bounds or None. Each problem is scaled
    by its max|G| (the minimiser does not change), so ``tol`` and the returned gaps are
    relative. See ``batched_min_norm_simplex`` for the method. ``drop_finished``: a problem
    leaves the batch once certified. On the CPU (the default there) this gives the same
    answers to the bit with less work per iteration (4x on FedLF's NF-ResNet-18 layers). On a
    GPU (off by default) an iteration costs its kernel launches whatever the batch, so it
    saves nothing, and CUDA's batched kernels round by batch layout: answers would change.
    """
    if drop_finished is None:
        drop_finished = grams.device.type == "cpu"
    batch, n = grams.shape[0], grams.shape[-1]
    dtype = _work_dtype(grams.device)
    gram = grams.detach().to(dtype)
    gram = (gram + gram.transpose(-1, -2)) / 2
    scale = gram.abs().amax(dim=(-1, -2))
    gram = gram / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None, None]
    if lower is not None and upper is not None:
        lower, upper = lower.to(gram), upper.to(gram)

    # Iterate on μ = norms ∘ λ, where C = D⁻¹GD⁻¹ has a unit diagonal: vectors of very
    # different norms no longer make the problem ill-conditioned. The feasible set becomes
    # {Σ_j μ_j/norms_j = 1, norms∘lower ≤ μ ≤ norms∘upper}.
    norms = torch.diagonal(gram, dim1=-2, dim2=-1).clamp(min=1e-12).sqrt()
    inverse_norms = 1 / norms
    correlation = gram * inverse_norms.unsqueeze(-1) * inverse_norms.unsqueeze(-2)
    # Every iterate lies on the hyperplane aᵀμ = 1 (a = 1/norms), so the Lipschitz constant
    # that matters is 2 λ_max(P C P), P = I − aaᵀ/|a|² the projector onto its directions: much
    # smaller than 2 λ_max(C) when the vectors are nearly parallel (FedMGDA+'s normalised updates).
    unit_normal = inverse_norms / inverse_norms.norm(dim=-1, keepdim=True)
    along_normal = unit_normal.unsqueeze(-1) * unit_normal.unsqueeze(-2)
    tangent = torch.eye(n, dtype=dtype, device=gram.device) - along_normal
    lipschitz = 2 * torch.linalg.eigvalsh(tangent @ correlation @ tangent)[..., -1].clamp(min=1e-12)

    start = torch.full((batch, n), 1.0 / n, dtype=dtype, device=gram.device)
    problem = _Problems(gram, norms, inverse_norms, correlation, unit_normal, lipschitz, lower, upper)
    mu = problem.project(start * norms)
    state = _Iterates(
        mu=mu,
        extrapolated=mu.clone(),
        momentum=torch.ones(batch, dtype=dtype, device=gram.device),
        best=mu / norms,
        best_gap=torch.full((batch,), math.inf, dtype=dtype, device=gram.device),
        finished=torch.zeros(batch, dtype=torch.bool, device=gram.device),
    )
    # Problems leave the batch once certified; their answers wait here (index = problem number).
    answer, answer_gap = state.best.clone(), state.best_gap.clone()
    active = torch.arange(batch, device=gram.device)
    slots = _Slots(gram.element_size())
    iterations = 0
    for iterations in range(1, max_iter + 1):
        grad = 2 * (problem.correlation @ state.extrapolated.unsqueeze(-1)).squeeze(-1)
        # the projection ignores moves along the normal a, so drop that part of the gradient
        grad = grad - (grad * problem.unit_normal).sum(-1, keepdim=True) * problem.unit_normal
        stepped = problem.project(state.extrapolated - grad / problem.lipschitz[:, None])
        # Restart the momentum when it points against the gradient step (O'Donoghue & Candès 2015).
        restart = ((state.extrapolated - stepped) * (stepped - state.mu)).sum(-1) > 0
        next_momentum = (1 + torch.sqrt(1 + 4 * state.momentum**2)) / 2
        beta = torch.where(restart, torch.zeros_like(state.momentum), (state.momentum - 1) / next_momentum)
        state.momentum = torch.where(restart, torch.ones_like(state.momentum), next_momentum)
        state.extrapolated = stepped + beta[:, None] * (stepped - state.mu)
        state.mu = stepped
        if iterations % _CHECK_EVERY == 0 or iterations == max_iter:
            weights = _project(state.mu / problem.norms, problem.lower, problem.upper)  # exact feasibility in λ-space
            polished = _polish_on_face(problem.gram, weights, problem.lower, problem.upper, slots=slots)
            for candidate in (weights, polished):
                candidate_gap = _suboptimality_bound(problem.gram, candidate, problem.lower, problem.upper)
                better = (candidate_gap < state.best_gap) & ~state.finished
                state.best = torch.where(better[:, None], candidate, state.best)
                state.best_gap = torch.where(better, candidate_gap, state.best_gap)
            done = state.best_gap <= tol
            state.finished = done  # a certified answer is kept as it is
            if bool(done.all()) or (drop_finished and bool(done.any())):
                # A certified problem leaves the batch. Every operation is per problem (and the
                # solves keep their memory offsets, see _Slots), so the others' answers do not
                # change by a bit; only the finished ones' work is saved.
                answer[active[done]], answer_gap[active[done]] = state.best[done], state.best_gap[done]
                keep = ~done
                if int(keep.sum()) == 1 and batch > 1:
                    # torch computes a batch of one matrix-vector product another way (different
                    # rounding): a finished problem stays as company, its answer frozen
                    keep[torch.nonzero(done)[0]] = True
                active, problem, state = active[keep], problem.select(keep), state.select(keep)
                slots.keep(active)
                if active.numel() == 0:
                    break
    answer[active], answer_gap[active] = state.best, state.best_gap  # the last iteration was a check
    return _TorchSolve(weights=answer, gap=answer_gap, iterations=iterations)


def batched_min_norm_simplex(
    grams: torch.Tensor, max_iter: int = _DEFAULT_MAX_ITER, tol: float = _DEFAULT_TOL
) -> torch.Tensor:
    """Solve B independent QPs argmin_λ λᵀ G_b λ over the simplex at once: (B, n, n) -> (B, n).

    For FedLF's per-layer QPs (Pan et al., AAAI 2024, App. A.1 Problem (3), one per layer l). In torch, on
    the grams' device (float64 inside, MPS float32), no Python loop over B.

    Algorithm: accelerated projected gradient (FISTA) with gradient-based adaptive restart
    (O'Donoghue & Candès 2015), in the Jacobi-scaled variables μ_j = ||v_j|| λ_j (so vectors
    of very different norms do not make it ill-conditioned), step 1/L with L = 2 λ_max of the
    scaled Gram restricted to the constraint hyperplane, and an exact sort-based projection
    onto the (scaled) simplex: per iteration one batched mat-vec and one sort. Every 10
    iterations, six active-set steps from the current iterate (exact minimiser on the
    current face by a batched Cholesky solve, ratio test) are kept where they certify
    better: once the optimal face is in sight this finishes exactly instead of converging.
    Why not Frank-Wolfe: its rate is sublinear (linear only with away steps, at a rate set
    by the simplex's pyramidal width, poor for n ≈ 50), thousands of iterations for 1e-5;
    a convex quadratic over a polytope grows quadratically away from its solutions, where
    restarted FISTA converges linearly. Measured on random problems (n = 2..100,
    rank-deficient, near-parallel, norms spread over 10^±1.5): 10-250 iterations to
    tol = 1e-8, objective within 1e-7 · max|G| of cvxopt (tests/test_qp.py).

    Stopping rule, batched: every 10 iterations each problem's suboptimality is bounded by
    min(Frank-Wolfe gap, f(λ)) ≥ f(λ) − f(λ*), with gap = 2(λᵀGλ − min_j (Gλ)_j) (and
    f(λ) because f* ≥ 0, which is what certifies Pareto-stationary problems, where the hull
    contains 0); iteration stops when the bound is ≤ tol · max|G_b| for every b. Where the
    gap is the bound, it also certifies (Gλ)_j ≥ λᵀGλ − tol·max|G|/2 for all j: the min-norm
    point d = Σλ_j v_j has d·v_j ≥ ||d||² − that, FedLF's no-conflict guarantee. Problems
    still above tol after ``max_iter`` iterations are returned as they are, with a warning.

    All-zero grams give uniform weights; n = 1 gives [1.0]. Same dtype (floating) and
    device as ``grams``; no gradient flows through the solve.
    """
    grams = _as_gram_tensor(grams, "grams")
    if grams.ndim != 3:
        raise ValueError(f"grams must have shape (B, n, n), got {tuple(grams.shape)}")
    _check_grams(grams, "every gram in grams")
    out_dtype = grams.dtype if grams.dtype.is_floating_point else torch.get_default_dtype()
    if grams.shape[0] == 0:
        return torch.empty(grams.shape[:2], dtype=out_dtype, device=grams.device)
    if max_iter < 1 or not tol > 0:
        raise ValueError(f"max_iter must be >= 1 and tol > 0, got max_iter={max_iter}, tol={tol}")
    solve = _accelerated_projected_gradient(grams, max_iter=max_iter, tol=tol)
    unconverged = solve.gap > tol
    if bool(unconverged.any()):
        warnings.warn(
            f"batched_min_norm_simplex: {int(unconverged.sum())} of {grams.shape[0]} QPs did not reach "
            f"tol={tol:g} in {max_iter} iterations (largest suboptimality bound {solve.gap.max().item():.3g} of max|G|); "
            "their weights are feasible but not optimal: raise max_iter or tol",
            RuntimeWarning,
            stacklevel=2,
        )
    return solve.weights.to(out_dtype)


# --------------------------------------------------------------------------- cvxopt


class _SolverFailure(Exception):
    """cvxopt did not return an optimal, finite solution."""


def _solve_with_cvxopt(
    gram: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None, reltol: float
) -> torch.Tensor:
    """cvxopt.solvers.qp on min ½λᵀPλ, P = 2G/max|G| (float64, CPU), with Σλ = 1 and the bounds.

    Coordinates whose bounds coincide become equality rows; lower bounds (0 without a box)
    are inequality rows, upper bounds only where they are below 1. A ridge |μ_min|·I is added
    to P only when G's smallest eigenvalue μ_min is negative (rounding in a Gram matrix), which
    keeps the QP convex and moves the objective by at most |μ_min|.
    Progress printing is off via a per-call options dict: cvxopt's global options are read
    but never changed.
    """
    n = gram.shape[0]
    scale = gram.abs().max()
    scaled = gram / scale
    smallest_eigenvalue = float(torch.linalg.eigvalsh(scaled)[0])
    if smallest_eigenvalue < 0:
        scaled = scaled + (-smallest_eigenvalue) * torch.eye(n, dtype=torch.float64)
    if low is None or high is None:
        low, high = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    fixed = (high - low) <= _FIXED_WIDTH
    free = torch.nonzero(~fixed).flatten()
    capped = torch.nonzero(~fixed & (high < 1.0)).flatten()
    eye = np.eye(n)
    inequality = np.vstack([-eye[free.numpy()], eye[capped.numpy()]])
    bounds = np.concatenate([-low[free].numpy(), high[capped].numpy()])
    equality = np.vstack([np.ones((1, n)), eye[torch.nonzero(fixed).flatten().numpy()]])
    targets = np.concatenate([[1.0], low[fixed].numpy()])

    options = {**cvxopt_solvers.options, "show_progress": False, "reltol": float(reltol)}
    try:
        solution = cvxopt_solvers.qp(
            cvxopt_matrix(2 * scaled.numpy()),
            cvxopt_matrix(np.zeros(n)),
            cvxopt_matrix(inequality),
            cvxopt_matrix(bounds),
            cvxopt_matrix(equality),
            cvxopt_matrix(targets),
            options=options,
        )
    except (ArithmeticError, ValueError) as error:
        raise _SolverFailure(f"cvxopt raised {type(error).__name__}: {error}") from error
    if solution["status"] != "optimal":
        raise _SolverFailure(f"cvxopt returned status {solution['status']!r}")
    weights = torch.tensor(np.array(solution["x"]).reshape(-1), dtype=torch.float64)
    if weights.shape != (n,) or not bool(torch.isfinite(weights).all()):
        raise _SolverFailure("cvxopt returned a non-finite solution")
    return weights


# --------------------------------------------------------------------------- one QP


def min_norm_simplex(
    gram: torch.Tensor,
    lower: torch.Tensor | None = None,
    upper: torch.Tensor | None = None,
    solver: str = "cvxopt",
    reltol: float = 1e-6,
) -> QPResult:
    """argmin_λ λᵀ G λ  s.t.  Σλ = 1, λ ≥ 0, and lower ≤ λ ≤ upper when given.

    FedMGDA+ eq. (25): the box |λ − λ0|_∞ ≤ ε is passed as
    ``lower, upper = box_around(λ0, ε)``; ε = 0 returns λ0 exactly, ε ≥ 1 is the plain
    min-norm problem (23). FedLF Problem (3) (App. A.1) is the no-box case
    with reltol 1e-6.

    solver="cvxopt": ``cvxopt.solvers.qp`` with P = 2G (see ``_solve_with_cvxopt``) and
    ``reltol``, its answer projected exactly onto the feasible set. It is an interior-point
    method: the objective is accurate to about 1e-7·max|G| (cvxopt's abstol), but weights
    that should be 0 come out between 1e-7 and, near degenerate optima, 1e-3.
    solver="torch": the projected-gradient solver of ``batched_min_norm_simplex`` for this
    one problem, with the box (its projection is exact for the box too); certified to
    1e-8·max|G| and exact on the optimal face; ``reltol`` is not used. Prefer it when the
    weights themselves must be accurate.

    Fallbacks, each with a ``warnings.warn`` and recorded in ``status``/``fallback``:
    cvxopt failing (status not 'optimal', ArithmeticError/ValueError, non-finite answer)
    -> the torch solver ("projected_gradient") -> if that is non-finite too, the feasible
    point nearest the box's midpoint, uniform weights without a box ("centre").
    Solver failures never raise; the returned weights are always feasible and finite.

    Degenerate inputs: n = 1 gives [1.0]; an all-zero G makes every feasible point optimal and
    gives the "centre" point above (status "optimal"); a box that pins λ returns that point.
    Raises ValueError for a G that is not square, not symmetric or has a negative diagonal
    (beyond rounding: not a Gram matrix), NaN/inf entries, a malformed or infeasible box,
    or an unknown solver; TypeError for complex or boolean G.
    """
    gram = _as_gram_tensor(gram, "gram")
    if gram.ndim != 2:
        raise ValueError(f"gram must be a square matrix (n x n), got shape {tuple(gram.shape)}")
    _check_grams(gram, "gram")
    if solver not in ("cvxopt", "torch"):
        raise ValueError(f"solver must be 'cvxopt' or 'torch', got {solver!r}")
    if not reltol > 0:
        raise ValueError(f"reltol must be > 0, got {reltol}")
    n = gram.shape[0]
    out_dtype = gram.dtype if gram.dtype.is_floating_point else torch.get_default_dtype()
    gram64 = gram.detach().to("cpu", torch.float64)
    gram64 = (gram64 + gram64.T) / 2
    low, high = _effective_box(lower, upper, n)

    def result(
        weights: torch.Tensor, status: str = "optimal", fallback: str | None = None
    ) -> QPResult:
        objective = float(weights @ gram64 @ weights)
        return QPResult(weights.to(gram.device, out_dtype), objective, status, fallback)

    if n == 1:
        return result(torch.ones(1, dtype=torch.float64))
    if low is not None and high is not None:
        pinned = _unique_feasible_point(low, high)
        if pinned is not None:
            return result(pinned)
    if not bool((gram64 != 0).any()):
        return result(_centre(n, low, high))

    def feasible(weights: torch.Tensor) -> torch.Tensor:
        return _project(
            weights[None], None if low is None else low[None], None if high is None else high[None]
        )[0]

    status = "optimal"
    if solver == "cvxopt":
        try:
            return result(feasible(_solve_with_cvxopt(gram64, low, high, reltol)))
        except _SolverFailure as failure:
            status = str(failure)
            warnings.warn(
                f"min_norm_simplex: {status}; falling back to the torch projected-gradient solver",
                RuntimeWarning,
                stacklevel=2,
            )
    solve = _accelerated_projected_gradient(
        gram64[None], None if low is None else low[None], None if high is None else high[None]
    )
    weights, gap = solve.weights[0].cpu(), float(solve.gap[0])
    fallback = None if solver == "torch" else "projected_gradient"
    if bool(torch.isfinite(weights).all()) and math.isfinite(gap):
        if gap > _DEFAULT_TOL:
            note = (
                f"projected gradient stopped at suboptimality {gap:.3g} of max|G| "
                f"after {solve.iterations} iterations"
            )
            warnings.warn(
                f"min_norm_simplex: {note}; the weights are feasible but not optimal",
                RuntimeWarning,
                stacklevel=2,
            )
            status = note if status == "optimal" else f"{status}; {note}"
        return result(feasible(weights), status, fallback)
    note = "the projected-gradient solver produced non-finite weights"
    status = note if status == "optimal" else f"{status}; {note}"
    warnings.warn(
        f"min_norm_simplex: {status}; returning the feasible point nearest the centre",
        RuntimeWarning,
        stacklevel=2,
    )
    return result(_centre(n, low, high), status, "centre")
