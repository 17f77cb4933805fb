"""Min-norm QPs over the simplex (∩ a box) in torch, by accelerated projected gradient: FedMGDA+'s
and FedMDFG's fallback and ``min_norm_simplex(solver="torch")``, and the batched interior-point
method's fallback (:mod:`.interior_point`). Also the pieces both share: the certified stopping rule
(the Frank-Wolfe gap bounds the suboptimality) and the polish on the active face."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fl_lightning.algorithms.qp.problem import (
    _CHECK_EVERY,
    _DEFAULT_MAX_ITER,
    _DEFAULT_TOL,
    _scaled_grams,
)
from fl_lightning.algorithms.qp.projections import (
    _box_simplex_projection,
    _project,
    _weighted_simplex_projection,
)

# --------------------------------------------------------------------------- torch solver



def _frank_wolfe_gap(
    gram: torch.Tensor,
    weights: torch.Tensor,
    lower: torch.Tensor | None,
    upper: torch.Tensor | None,
    product: torch.Tensor | None = None,
) -> torch.Tensor:
    """max_{s feasible} ∇f(λ)ᵀ(λ − s) for f = λᵀGλ: an upper bound on f(λ) − f(λ*), zero at λ*.

    Without a box the best vertex is e_j with j = argmin (Gλ)_j, so gap = 2(λᵀGλ − min_j (Gλ)_j);
    with a box, s starts at lower and fills the remaining mass 1 − Σ lower up to upper in
    order of increasing gradient. ``product``: Gλ where the caller has it.
    """
    if product is None:
        product = (gram @ weights.unsqueeze(-1)).squeeze(-1)
    grad = 2 * product
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
    product = (gram @ weights.unsqueeze(-1)).squeeze(-1)
    objective = (weights * product).sum(-1)
    return torch.minimum(_frank_wolfe_gap(gram, weights, lower, upper, product), objective)


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


def _solve_with_factor(right: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """(L Lᵀ)⁻¹ right for a batch of lower Cholesky factors L: two triangular solves (on the
    CPU 20x faster than ``torch.cholesky_solve`` for (50, 101, 101), which copies the factors)."""
    lower = torch.linalg.solve_triangular(factor, right, upper=False)
    return torch.linalg.solve_triangular(factor.mT, lower, upper=True)


def _face_minimiser(
    gram: torch.Tensor,
    weights: torch.Tensor,
    free: torch.Tensor,
    slots: _Slots | None = None,
    refinements: int = 3,
) -> torch.Tensor:
    """Minimiser of λᵀGλ over the affine hull of a face: free coordinates move, others stay.

    KKT on the face: G_FF λ_F + (G λ_held)_F = ν1 and Σλ = 1. One batched Cholesky factor of
    H = G_FF + 1e-12·diag(G_FF) (so a rank-deficient G_FF still factors) solves it; the ridge
    alone would move the answer by up to 1e-12/κ, κ the face's smallest eigenvalue relative to
    its diagonal (1.8e-5 for κ = 2.9e-9). So ``refinements`` steps of iterative refinement
    follow (Golub & Van Loan, Matrix Computations, 4th ed., §3.5.3): the residual of the
    unridged KKT system, solved with the same factor, corrects λ_F and ν; each step contracts
    the ridge's error by about 1e-12/(κ + 1e-12). A step is kept only for a problem whose
    residual (max over the face) it lowers, so a singular G_FF, where refinement would not
    converge, keeps the ridged answer. The weights are then exact on the face to the
    rounding of a solve with condition ~1/κ (about 1e-16/κ).

    Returns ``weights`` where the factorisation fails. The result may leave the box; see
    ``_polish_on_face``. ``slots``: where these problems sat in the batch they came from
    (see ``_Slots``).
    """
    mask = free.to(weights.dtype)
    held = weights * (1 - mask)
    ridge = 1e-12 * torch.diagonal(gram, dim1=-2, dim2=-1) + 1e-200
    hessian = gram * (mask.unsqueeze(-1) * mask.unsqueeze(-2))
    hessian.diagonal(dim1=-2, dim2=-1).add_(1 - mask + ridge)
    factor, info = torch.linalg.cholesky_ex(hessian)

    def solve(right: torch.Tensor) -> torch.Tensor:
        return _solve_with_factor(right, factor) if slots is None else slots.cholesky_solve(right, factor)

    def matvec(vector: torch.Tensor) -> torch.Tensor:
        return (gram @ vector.unsqueeze(-1)).squeeze(-1)

    solved = solve(torch.stack([mask, -mask * matvec(held)], dim=-1))
    towards_one, offset = solved[..., 0], solved[..., 1]
    mass = towards_one.sum(-1, keepdim=True)
    mass = torch.where(mass > 0, mass, torch.ones_like(mass))
    # λ_F = offset + ν·towards_one, with ν such that Σλ = 1
    multiplier = (1 - held.sum(-1, keepdim=True) - offset.sum(-1, keepdim=True)) / mass
    minimiser = held + mask * (offset + multiplier * towards_one)

    def residual(point: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
        return mask * (matvec(point) - nu)  # the unridged face KKT rows; Σλ = 1 holds by ν

    rows = residual(minimiser, multiplier)
    size = rows.abs().amax(-1)
    for _ in range(refinements):
        # the same system for the correction: H δ_F = −r + δν·1, Σδ_F = 1 − Σλ
        correction = solve(-rows.unsqueeze(-1)).squeeze(-1)
        shortfall = 1 - minimiser.sum(-1, keepdim=True)
        step_multiplier = (shortfall - correction.sum(-1, keepdim=True)) / mass
        refined = minimiser + mask * (correction + step_multiplier * towards_one)
        refined_multiplier = multiplier + step_multiplier
        refined_rows = residual(refined, refined_multiplier)
        refined_size = refined_rows.abs().amax(-1)
        better = (refined_size < size) & torch.isfinite(refined).all(-1)
        minimiser = torch.where(better[:, None], refined, minimiser)
        multiplier = torch.where(better[:, None], refined_multiplier, multiplier)
        rows = torch.where(better[:, None], refined_rows, rows)
        size = torch.where(better, refined_size, size)
        if not bool(better.any()):  # a problem that did not improve would not on a repeat
            break
    usable = (info == 0) & (towards_one.sum(-1) > 0) & torch.isfinite(minimiser).all(-1)
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
    where it certifies a smaller suboptimality. A problem that arrives (no weight blocked)
    stays: its face, and so its minimiser, would not change; the steps end when all have.
    """
    low = torch.zeros_like(weights) if lower is None else lower
    high = torch.ones_like(weights) if upper is None else upper
    arrived = torch.zeros(weights.shape[:-1], dtype=torch.bool, device=weights.device)
    for _ in range(steps):
        free = (weights > low) & (weights < high)
        direction = _face_minimiser(gram, weights, free, slots) - weights
        room = torch.where(direction < 0, weights - low, high - weights)
        ratio = torch.where(free & (direction != 0), room / direction.abs(), torch.inf)
        step = ratio.amin(-1, keepdim=True).clamp(max=1.0)
        moved = weights + step * direction
        blocked = free & (ratio <= step)
        moved = torch.where(blocked & (direction < 0), low, moved)
        moved = torch.where(blocked & (direction > 0), high, moved)
        weights = torch.where(arrived[:, None], weights, moved)
        arrived = arrived | ~blocked.any(-1)
        if bool(arrived.all()):
            break
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
    start: torch.Tensor | None = None,
) -> _TorchSolve:
    """Jacobi-preconditioned FISTA with adaptive restart on min λᵀGλ over the simplex (∩ box).

    grams (B, n, n) finite; lower/upper (B, n) feasible bounds or None; ``start`` (B, n): where
    to begin (projected onto the feasible set; uniform weights by default). Each problem is
    scaled by its max|G| (the minimiser does not change), so ``tol`` and the returned gaps are
    relative. ``drop_finished``: a problem leaves the batch once certified. On the CPU (the
    default there) this gives the same answers to the bit with less work per iteration (4x on
    FedLF's NF-ResNet-18 layers). On a GPU (off by default) an iteration costs its kernel
    launches whatever the batch, so it saves nothing, and CUDA's batched kernels round by
    batch layout: answers would change.

    Method: accelerated projected gradient (FISTA) with gradient-based adaptive restart
    (O'Donoghue & Candès, Found. Comput. Math. 2015), in the Jacobi-scaled variables
    μ_j = ||v_j|| λ_j (so vectors of very different norms do not make it ill-conditioned),
    step 1/L with L = 2 λ_max of the scaled Gram restricted to the constraint hyperplane, and
    an exact sort-based projection onto the (scaled) simplex ∩ box: per iteration one batched
    mat-vec and one sort. Every 10 iterations, six active-set steps from the current iterate
    (``_polish_on_face``) are kept where they certify better: once the optimal face is in
    sight this finishes exactly instead of converging. Each check certifies every problem
    by ``_suboptimality_bound``; a problem stops once that is ≤ ``tol``. Why not Frank-Wolfe:
    its rate is sublinear (linear only with away steps, at a rate set by the simplex's
    pyramidal width, poor for n ≈ 50); a convex quadratic over a polytope grows quadratically
    away from its solutions, where restarted FISTA converges linearly. Measured on random
    problems (n = 2..100, rank-deficient, near-parallel, norms spread over 10^±1.5): 10-250
    iterations to tol = 1e-8; on FedLF's NF-ResNet-18 layer QPs 10-980
    (``benchmarks/perf/layer_qps.py``), which is why FedLF's batches now use the
    interior-point method of ``batched_min_norm_simplex``.
    """
    if drop_finished is None:
        drop_finished = grams.device.type == "cpu"
    batch, n = grams.shape[0], grams.shape[-1]
    gram = _scaled_grams(grams)
    dtype = gram.dtype
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

    if start is None:
        start = torch.full((batch, n), 1.0 / n, dtype=dtype, device=gram.device)
    problem = _Problems(gram, norms, inverse_norms, correlation, unit_normal, lipschitz, lower, upper)
    mu = problem.project(start.to(gram) * norms)
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
