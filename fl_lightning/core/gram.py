"""Inner products of client updates: every aggregation rule works in this m x m space.

With J the round's client updates (m x d), the Gram matrix G = J Jᵀ (and its per-layer
blocks G_l = J_l J_lᵀ) holds everything that projections, QPs and cosines need. They
cost O(m² d) once; the rules then work on m x m matrices and form the direction with a
single ``coefficients @ J`` (per layer: ``layer_combination``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _check_updates(updates: torch.Tensor, what: str = "updates") -> None:
    """J must be a floating (m, d) tensor: one flat update per client."""
    if not isinstance(updates, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor (m x d), got {type(updates).__name__}")
    if updates.ndim != 2:
        raise ValueError(
            f"{what} must be 2-D (m clients x d parameters), got shape {tuple(updates.shape)}; "
            "stack the flat client updates as rows (a single update: updates[None])"
        )
    if not updates.is_floating_point():
        raise TypeError(
            f"{what} must be floating point (client updates w - w_i), got dtype {updates.dtype}; "
            "convert with updates.float() (integer products overflow silently)"
        )


def _check_slices(slices: Sequence[slice], num_parameters: int) -> None:
    """Every layer slice lies inside the d columns of J."""
    for k, piece in enumerate(slices):
        start, stop = piece.start or 0, piece.stop
        if piece.step not in (None, 1) or stop is None or not 0 <= start <= stop <= num_parameters:
            raise ValueError(
                f"layer slice {k} = {piece} does not lie inside the {num_parameters} columns of "
                "updates: the slices must come from core.flat.layer_slices of the model the "
                "updates belong to"
            )


def gram(updates: torch.Tensor) -> torch.Tensor:
    """G = J Jᵀ (m x m), returned in float64 for the m x m work that follows.

    The product itself runs in J's dtype (one GEMM, the O(m² d) part): converting J to
    float64 first would copy it and halve the GEMM's speed, for no accuracy J has. Only
    when that leaves J's range is it recomputed in float64: on overflow (float32 ||g_i||²
    beyond 3.4e38, finite but huge updates, e.g. a diverging client), so a finite J gives a
    finite G; and when some ||g_i||² falls below the smallest normal float32 (1.2e-38,
    zero included), where underflow could leave G_ii = 0 beside G_ij != 0 (|g_i| ~ 1e-23):
    a G that breaks Cauchy-Schwarz sends projections such as FedFV's to infinity.
    """
    _check_updates(updates)
    return _finite_or_float64(updates @ updates.T, lambda wide: wide @ wide.T, updates)


def layer_grams(updates: torch.Tensor, slices: Sequence[slice]) -> torch.Tensor:
    """G_l = J_l J_lᵀ for every layer slice: (L, m, m), float64 (products in J's dtype)."""
    _check_updates(updates)
    _check_slices(slices, updates.shape[1])
    return _finite_or_float64(
        torch.stack([updates[:, s] @ updates[:, s].T for s in slices]),
        lambda wide: torch.stack([wide[:, s] @ wide[:, s].T for s in slices]),
        updates,
    )


def _finite_or_float64(product: torch.Tensor, recompute, updates: torch.Tensor) -> torch.Tensor:
    """``product`` (Gram matrices [..., m, m]) as float64, or ``recompute(updates in float64)``
    where it overflowed or a squared norm on its diagonal underflowed (see ``gram``)."""
    if updates.dtype == torch.float64 or product.numel() == 0:
        return product.double()
    squared_norms = torch.diagonal(product, dim1=-2, dim2=-1)
    out_of_range = ~torch.isfinite(product).all() | (squared_norms < torch.finfo(product.dtype).tiny).any()
    if bool(out_of_range):  # one host sync
        return recompute(updates.double())
    return product.double()


def combine(coefficients: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
    """Σ_i c_i g_i = c @ J, in the dtype of J."""
    _check_updates(updates)
    if coefficients.shape != updates.shape[:1]:
        raise ValueError(
            f"coefficients must have one entry per row of updates ({updates.shape[0]},), got "
            f"shape {tuple(coefficients.shape)}"
        )
    if _beyond_range(coefficients, updates.dtype):
        return (coefficients.double() @ updates.double()).to(updates.dtype)
    return coefficients.to(updates.dtype) @ updates


def layer_combination(coefficients: torch.Tensor, updates: torch.Tensor, slices: Sequence[slice]) -> torch.Tensor:
    """Per layer l: Σ_i c_{l,i} g_{i,l}; coefficients (L, m) -> a flat vector (d,)."""
    _check_updates(updates)
    _check_slices(slices, updates.shape[1])
    if coefficients.shape != (len(slices), updates.shape[0]):
        raise ValueError(
            f"coefficients must be (layers, clients) = ({len(slices)}, {updates.shape[0]}): one "
            f"row per layer slice and one column per row of updates, got shape "
            f"{tuple(coefficients.shape)}"
        )
    if _beyond_range(coefficients, updates.dtype):
        wide = coefficients.double()
        return torch.cat([wide[k] @ updates[:, s].double() for k, s in enumerate(slices)]).to(updates.dtype)
    coefficients = coefficients.to(updates.dtype)
    return torch.cat([coefficients[k] @ updates[:, s] for k, s in enumerate(slices)])


def _beyond_range(coefficients: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether finite coefficients would overflow in J's dtype: a projection coefficient is up
    to ||g_j|| / ||g_i||, beyond float32 for updates ~1e-20 beside ~1e19. Then the combination
    is formed in float64 (its result, a vector of update scale, fits J's dtype)."""
    if not coefficients.is_floating_point() or torch.finfo(coefficients.dtype).max <= torch.finfo(dtype).max:
        return False
    return bool((coefficients.abs() > torch.finfo(dtype).max).logical_and_(torch.isfinite(coefficients)).any())


def conflict_counts(
    updates: torch.Tensor, step: torch.Tensor, slices: list[slice] | None = None
) -> tuple[int, list[int]]:
    """How many clients' updates g_i conflict with the applied server step s.

    The server moves w by −s and client i's own descent move is −g_i, so they conflict
    when g_i · s < 0 (FedLF Table 4's MC). Per layer l: g_{i,l} · s_l < 0 (LC_l).
    Returns (model-level count, per-layer counts).
    """
    _check_updates(updates)
    if step.shape != updates.shape[1:]:
        raise ValueError(
            f"step must be a flat vector with one entry per column of updates "
            f"({updates.shape[1]},), got shape {tuple(step.shape)}"
        )
    step = step.to(updates.dtype)
    counts = [(updates @ step < 0).sum()] + [(updates[:, s] @ step[s] < 0).sum() for s in (slices or [])]
    model_level, *per_layer = torch.stack(counts).tolist()  # one device sync for all counts
    return model_level, per_layer
