"""One min-norm QP with cvxopt's interior-point solver, the papers' choice (FedMGDA+, Hu et al.,
IEEE TNSE 2022, eq. (23) and (25)), falling back to the torch solver, with a warning, when
cvxopt fails."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from cvxopt import matrix as cvxopt_matrix
from cvxopt import solvers as cvxopt_solvers

from fl_lightning.algorithms.qp.problem import (
    _DEFAULT_TOL,
    _FIXED_WIDTH,
    QPResult,
    _as_gram_tensor,
    _centre,
    _check_grams,
    _effective_box,
    _unique_feasible_point,
)
from fl_lightning.algorithms.qp.projections import _project
from fl_lightning.algorithms.qp.torch_solver import _accelerated_projected_gradient

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
    solver="torch": the accelerated projected-gradient solver of
    ``torch_solver._accelerated_projected_gradient`` for this one problem, with the box (its
    projection is exact for the box too); certified to 1e-8·max|G| and exact on the optimal
    face; ``reltol`` is not used. Prefer it when the weights themselves must be accurate.

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
