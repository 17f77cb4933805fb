"""Min-norm points of convex hulls: quadratic programs over the simplex, in coefficient space.

FedMGDA+ (Hu et al., IEEE TNSE 2022, eq. (23) and (25), Alg. 1 line 5), FedLF (Pan et al.,
AAAI 2024, App. A.1, Problem (3)) and FedMDFG all need convex weights over vectors v_1..v_n with

    λ* = argmin_λ ||Σ_j λ_j v_j||² = argmin_λ λᵀ G λ   s.t.  Σ_j λ_j = 1,  λ ≥ 0
                                                         (and lower ≤ λ ≤ upper for FedMGDA+'s box),

where G = V Vᵀ is the Gram matrix of the vectors. Nothing here sees the vectors: callers
build G once (``fl_lightning.core.flat``) and form the direction as ``weights @ V``.

- ``min_norm_simplex``: one QP with cvxopt's interior-point solver (the papers' choice),
  falling back to a torch solver, with a warning, when cvxopt fails (:mod:`.min_norm`).
- ``batched_min_norm_simplex``: many independent small QPs at once in torch (FedLF's
  per-layer QPs): a batched interior-point method finished on the optimal face, with a
  certified stopping rule (:mod:`.interior_point`), falling back to accelerated projected
  gradient (:mod:`.torch_solver`); ``solve_min_norm_batch`` also says how many stopped at
  ``max_iter`` uncertified.
- ``simplex_projection`` and ``box_around``: the pieces, also used on their own (AFL's λ step;
  :mod:`.projections`).
"""

from fl_lightning.algorithms.qp.interior_point import BatchedQPResult, batched_min_norm_simplex, solve_min_norm_batch
from fl_lightning.algorithms.qp.min_norm import min_norm_simplex
from fl_lightning.algorithms.qp.problem import QPResult
from fl_lightning.algorithms.qp.projections import box_around, simplex_projection

__all__ = [
    "BatchedQPResult",
    "QPResult",
    "batched_min_norm_simplex",
    "box_around",
    "min_norm_simplex",
    "simplex_projection",
    "solve_min_norm_batch",
]
