"""Cosine gradient Shapley values (CGSV; Xu et al., NeurIPS 2021, Sec. 3.2-3.3).

Agents i = 1..N upload vectors u_i (in CGSV, u_i = Γ Δw_i / ||Δw_i||). A coalition S
aggregates u_S = Σ_{i∈S} r_i u_i and is worth its cosine to the grand coalition N
(Definition 1): ν(S) = cos(u_S, u_N). The empty coalition (u_∅ = 0, which has no
direction) is worth 0, like any coalition whose vectors cancel out; this is what the
authors' code gets from ``F.cosine_similarity`` with its small epsilon.

* :func:`exact_cgsv`: φ_i of eq. (2), the average marginal gain over all N! orders;
* :func:`sampled_cgsv`: the Monte-Carlo estimate of φ from random orders (the sampling
  baseline of the paper's Fig. 1, Maleki et al. 2013);
* :func:`approximate_cgsv`: ψ_i = cos(u_i, u_N), eq. (3), what the reward mechanism uses;
* :func:`fig1_errors`: the ℓ1 and ℓ2 errors of Fig. 1 between an estimate and the exact φ,
  each normalised to sum 1 (the factor L_i of Theorem 1 "normalised away").

Each value ν(S) needs only inner products, so φ and its estimate work on the Gram matrix
G = U Uᵀ (N x N, float64): one O(N² d) product, then O(N²) per coalition; ψ needs only
u_N and N inner products with it, O(N d). Pure tensor functions, no Lightning; results
come back in the dtype of ``updates`` (the default float dtype for integer updates).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["FIG1_PERMUTATIONS", "MAX_EXACT_AGENTS", "approximate_cgsv", "exact_cgsv", "exact_shapley", "fig1_errors",
           "sampled_cgsv", "sampled_shapley"]

# eq. (2) visits 2^N coalitions (each standing for the orders in which it precedes an agent).
MAX_EXACT_AGENTS = 10
# The paper's sampling baseline in Fig. 1 is an (ε, δ) = (0.1, 0.1)-approximation (Maleki et al.
# 2013): by Hoeffding, ⌈ln(2/δ) w² / (2ε²)⌉ random orders for marginal gains of range w; with the
# range w = 1 that the authors' script takes, 150 orders.
FIG1_PERMUTATIONS = math.ceil(math.log(2 / 0.1) / (2 * 0.1**2))
# Norms below this count as the zero vector (as the epsilon of F.cosine_similarity).
_ZERO_NORM = 1e-12


def _result_dtype(updates: torch.Tensor) -> torch.dtype:
    """Values come back in the dtype of floating ``updates`` (the default float otherwise)."""
    return updates.dtype if updates.is_floating_point() else torch.get_default_dtype()


def _gram_and_weights(updates: torch.Tensor, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    u, r = _vectors_and_weights(updates, weights)
    return u @ u.T, r


def _vectors_and_weights(updates: torch.Tensor, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``updates`` in float64 and the weights r (all ones for None), both checked."""
    if not isinstance(updates, torch.Tensor):
        raise TypeError(f"updates must be a torch.Tensor (N, d), got {type(updates).__name__}")
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be (N, d) with one row per agent, got shape {tuple(updates.shape)}")
    if updates.is_complex() or updates.dtype == torch.bool:
        raise TypeError(f"updates must hold real numbers, got dtype {updates.dtype}")
    u = updates.detach().double()
    if not bool(torch.isfinite(u).all()):
        bad = (~torch.isfinite(u).all(dim=1)).nonzero().flatten().tolist()
        raise ValueError(
            f"updates of agents {bad} hold NaN or inf: every cosine with them would be NaN; "
            "drop those agents (or their rounds) before computing CGSV"
        )
    r = (
        torch.ones(u.shape[0], dtype=u.dtype, device=u.device)
        if weights is None
        else torch.as_tensor(weights).detach().double()
    )
    if r.shape != (u.shape[0],):
        raise ValueError(f"weights must have one entry per agent ({u.shape[0]}), got shape {tuple(r.shape)}")
    if not bool(torch.isfinite(r).all()):
        raise ValueError("weights hold NaN or inf: pass finite weights r_i (None for all ones)")
    return u, r


def coalition_values(gram: torch.Tensor, weights: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
    """ν(S) = cos(u_S, u_N) for coalitions given as rows of a 0/1 ``members`` matrix (C, N).

    With coefficients c_S = members * r: <u_S, u_N> = c_S G r, ||u_S||² = c_S G c_Sᵀ.
    """
    coefficients = members.to(gram.dtype) * weights
    inner = coefficients @ (gram @ weights)
    norm_s = ((coefficients @ gram) * coefficients).sum(dim=-1).clamp(min=0).sqrt()
    norm_n = (weights @ gram @ weights).clamp(min=0).sqrt()
    zero = (norm_s <= _ZERO_NORM) | (norm_n <= _ZERO_NORM)
    return torch.where(zero, torch.zeros_like(inner), inner / (norm_s * norm_n).clamp(min=_ZERO_NORM**2))


def exact_cgsv(updates: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """φ_i = (1/N!) Σ_π [ν(S_{π,i} ∪ {i}) − ν(S_{π,i})], eq. (2), exactly.

    The N! orders are grouped by the set S of agents preceding i: S precedes i in
    |S|! (N−1−|S|)! of them, so eq. (2) is Σ_{S ⊆ N∖{i}} |S|!(N−1−|S|)!/N! · [ν(S ∪ i) − ν(S)]
    over 2^N coalitions, the same number.

    Args:
        updates: (N, d), row i = u_i.
        weights: (N,) r_i in u_S = Σ_{i∈S} r_i u_i; None = all ones.
    """
    gram, r = _gram_and_weights(updates, weights)
    n = gram.shape[0]
    if n > MAX_EXACT_AGENTS:
        raise ValueError(
            f"exact_cgsv enumerates 2^N coalitions and is limited to N <= {MAX_EXACT_AGENTS} agents, "
            f"got N = {n}: use sampled_cgsv (Monte-Carlo over orders) or approximate_cgsv (eq. 3)"
        )
    phi = exact_shapley(lambda members: coalition_values(gram, r, members.to(gram.device)), n)
    return phi.to(device=gram.device, dtype=_result_dtype(updates))


def sampled_cgsv(
    updates: torch.Tensor,
    num_permutations: int,
    generator: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Monte-Carlo estimate of eq. (2): the mean marginal gain over random orders π.

    Every sampled order contributes each agent's gain ν(S_{π,i} ∪ {i}) − ν(S_{π,i}) when
    it joins the agents before it; the N + 1 prefixes of all orders are valued at once.

    Args:
        updates: (N, d), row i = u_i.
        num_permutations: how many random orders (uniform, independent).
        generator: a CPU ``torch.Generator`` for reproducible orders.
        weights: (N,) r_i; None = all ones.
    """
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}")
    gram, r = _gram_and_weights(updates, weights)
    phi = sampled_shapley(lambda members: coalition_values(gram, r, members.to(gram.device)), gram.shape[0],
                          num_permutations, generator)
    return phi.to(device=gram.device, dtype=_result_dtype(updates))


def approximate_cgsv(updates: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """ψ_i = cos(u_i, u_N) with u_N = Σ_j r_j u_j, eq. (3).

    Args:
        updates: (N, d), row i = u_i.
        weights: (N,) r_j; None = all ones.
    """
    u, r = _vectors_and_weights(updates, weights)  # O(N d): no Gram matrix (the 2^N saving of Sec. 3.3)
    grand = r @ u  # u_N
    norm_i, norm_n = u.norm(dim=1), grand.norm()
    psi = (u @ grand) / (norm_i * norm_n).clamp(min=_ZERO_NORM**2)  # <u_i, u_N> / (||u_i|| ||u_N||)
    return torch.where((norm_i <= _ZERO_NORM) | (norm_n <= _ZERO_NORM), 0.0, psi).to(_result_dtype(updates))


def fig1_errors(estimate: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(ℓ1, ℓ2) error of ``estimate`` from the exact CGSVs ``exact``, the two errors of CGSV's
    Fig. 1 (Xu et al., NeurIPS 2021, Sec. 3.3).

    ψ (eq. 3) matches φ only up to the multiplicative factor L_i of Theorem 1, "normalised
    away": both vectors are divided by their sums first (as the authors' Fig. 1 script does; φ
    and the sampled φ̄ already sum to ν(N) = 1). (nan, nan) when either sum is not positive,
    where that normalisation has no meaning.
    """
    est, ref = estimate.detach().double().flatten(), exact.detach().double().flatten()
    if est.shape != ref.shape:
        raise ValueError(f"estimate and exact must have one value per agent each, got {est.numel()} and {ref.numel()}")
    total_est, total_ref = float(est.sum()), float(ref.sum())
    if not (total_est > _ZERO_NORM and total_ref > _ZERO_NORM):
        return math.nan, math.nan
    diff = est / total_est - ref / total_ref
    return float(diff.abs().sum()), float(diff.norm())


# ------------------------------------------------------------- any value function
CoalitionValue = Callable[[torch.Tensor], torch.Tensor]  # members (C, N) bool -> ν(S) (C,)


def _valued_once(value: CoalitionValue, members: torch.Tensor) -> torch.Tensor:
    """ν of every row of ``members``, each distinct coalition valued once (float64)."""
    distinct, where = torch.unique(members, dim=0, return_inverse=True)
    return value(distinct).double()[where]


def exact_shapley(value: CoalitionValue, num_players: int) -> torch.Tensor:
    """φ_i = Σ_{S ⊆ N∖{i}} |S|!(N−1−|S|)!/N! [ν(S ∪ {i}) − ν(S)] (Shapley 1953), exactly.

    ``value`` maps coalitions, rows of a (C, N) boolean matrix, to their worth (C,); it is
    called once with the 2^N coalitions. Returns φ (N,) in float64.
    """
    if not 1 <= num_players <= MAX_EXACT_AGENTS:
        raise ValueError(f"exact_shapley values 2^N coalitions and takes 1 <= N <= {MAX_EXACT_AGENTS} players, "
                         f"got N = {num_players}: use sampled_shapley (random orders)")
    coalitions = torch.arange(2**num_players)
    bits = 2 ** torch.arange(num_players)
    members = (coalitions.unsqueeze(1) & bits) > 0
    worth = value(members).double().cpu()
    by_size = [math.factorial(s) * math.factorial(num_players - 1 - s) / math.factorial(num_players)
               for s in range(num_players)] + [0.0]
    share = torch.tensor(by_size, dtype=torch.float64)[members.sum(dim=1)]
    gain = worth[coalitions.unsqueeze(1) | bits] - worth.unsqueeze(1)  # ν(S ∪ {i}) − ν(S)
    return torch.where(members, 0.0, share.unsqueeze(1) * gain).sum(dim=0)


def sampled_shapley(value: CoalitionValue, num_players: int, num_permutations: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Monte-Carlo Shapley values from random orders π (Castro et al. 2009; Maleki et al. 2013):
    φ_i ≈ mean over π of ν(S_{π,i} ∪ {i}) − ν(S_{π,i}), S_{π,i} the players before i.

    ``value`` is called once with the distinct prefixes of all orders (C ≤ P(N−1) + 2 rows).
    ``generator``: a CPU ``torch.Generator`` for reproducible orders. Returns φ (N,) in float64.
    """
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}")
    if num_players < 1:
        raise ValueError(f"num_players must be >= 1, got {num_players}")
    order = torch.rand(num_permutations, num_players, generator=generator).argsort(dim=1)  # π
    position = order.argsort(dim=1)
    prefix = torch.arange(num_players + 1)
    members = position.unsqueeze(1) < prefix.view(1, -1, 1)  # (P, N+1, N): the first k of π
    worth = _valued_once(value, members.view(-1, num_players)).cpu().view(num_permutations, num_players + 1)
    gain = worth[:, 1:] - worth[:, :-1]
    phi = torch.zeros(num_players, dtype=torch.float64).index_add_(0, order.flatten(), gain.flatten())
    return phi / num_permutations
