"""Fairness metrics over per-client values (test accuracies, losses, rewards ...).

Small composable functions in the style of ``torchmetrics.functional``: each takes a 1-D
tensor (or anything ``torch.as_tensor`` accepts) with one value per client and returns a
0-d floating tensor on the same device (integer inputs are promoted to the default float
dtype, float64 stays float64). They are differentiable where the maths is.
:func:`fairness_summary` bundles them into a ``dict[str, float]`` for loggers.

Conventions:

* ``std`` and ``variance`` are *population* statistics (``unbiased=False``): the clients are
  the whole federation, not a sample of it, and FedFV / q-FFL report the variance this way.
* ``worst_fraction(values, f)`` is the mean of the ceil(f * K) lowest values, at least one
  client; ``worst5`` / ``worst10`` in the summary are f = 0.05 / 0.10 (FedLF's "worst 5%").
* ``fedlf_angle`` is FedLF's fairness indicator, the angle in radians between the vector of
  client values and the all-ones vector; 0 means every client has the same value. The angle
  of the all-zero vector is undefined; we define it as 0 because all clients are equal.
* ``jain_index`` is (sum a)^2 / (K * sum a^2): 1 when all are equal, 1/K when one client
  has everything (for nonnegative values). The all-zero vector is defined as 1 (all equal).
* NaN or infinite values raise ``ValueError`` naming the offending clients: a summary of a
  vector with a diverged client would silently be NaN.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torchmetrics.functional import pearson_corrcoef

__all__ = [
    "best_fraction",
    "fairness_summary",
    "fedlf_angle",
    "jain_index",
    "mean",
    "pearson",
    "std",
    "variance",
    "worst_fraction",
]

SUMMARY_KEYS = (
    "mean",
    "std",
    "var",
    "min",
    "max",
    "worst5",
    "best5",
    "worst10",
    "best10",
    "angle",
    "jain",
)


def _client_values(values: Any, name: str = "values") -> torch.Tensor:
    """``values`` as a non-empty, finite, floating 1-D tensor (one entry per client)."""
    try:
        tensor = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be numbers, one per client (a 1-D tensor, array or list of floats), "
            f"got {type(values).__name__} that torch cannot convert: {error}"
        ) from error
    if tensor.is_complex():
        raise TypeError(f"{name} must be real numbers, one per client, got dtype {tensor.dtype}")
    if tensor.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-D tensor with one value per client, got shape {tuple(tensor.shape)}"
        )
    if tensor.numel() == 0:
        raise ValueError(f"{name} is empty: a fairness metric needs at least one client")
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        nan_clients = torch.nonzero(torch.isnan(tensor)).flatten().tolist()
        inf_clients = torch.nonzero(torch.isinf(tensor)).flatten().tolist()
        problems = []
        if nan_clients:
            problems.append(f"NaN for clients {nan_clients}")
        if inf_clients:
            problems.append(f"infinite for clients {inf_clients}")
        raise ValueError(
            f"{name} is {' and '.join(problems)} (of {tensor.numel()} clients); "
            "evaluate or drop those clients before computing fairness metrics"
        )
    return tensor


def _fraction_count(num_clients: int, fraction: float) -> int:
    """ceil(fraction * K), at least 1; ``fraction`` must lie in (0, 1]."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    # round away float noise such as 0.07 * 100 = 7.000000000000001 before the ceiling
    return max(1, math.ceil(round(fraction * num_clients, 9)))


def mean(values: Any) -> torch.Tensor:
    """Mean over clients."""
    return _client_values(values).mean()


def variance(values: Any) -> torch.Tensor:
    """Population variance over clients (``unbiased=False``); 0 for a single client."""
    return _client_values(values).var(unbiased=False)


def std(values: Any) -> torch.Tensor:
    """Population standard deviation over clients (``unbiased=False``); 0 for one client."""
    return _client_values(values).std(unbiased=False)


def worst_fraction(values: Any, fraction: float) -> torch.Tensor:
    """Mean of the ceil(fraction * K) lowest values (at least one client)."""
    tensor = _client_values(values)
    k = _fraction_count(tensor.numel(), fraction)
    return torch.topk(tensor, k, largest=False).values.mean()


def best_fraction(values: Any, fraction: float) -> torch.Tensor:
    """Mean of the ceil(fraction * K) highest values (at least one client)."""
    tensor = _client_values(values)
    k = _fraction_count(tensor.numel(), fraction)
    return torch.topk(tensor, k, largest=True).values.mean()


def fedlf_angle(values: Any) -> torch.Tensor:
    """FedLF's fairness indicator: arccos(A . 1 / (||A|| ||1||)) in radians.

    0 when all clients have the same value (and, by definition, for the all-zero vector);
    at most pi/2 for nonnegative values. Computed as the equal angle
    ``atan2(||A - mean(A) 1||, mean(A) sqrt(K))``, which stays accurate near 0 where
    ``arccos`` of a cosine rounded to 1 - 1e-7 would report ~5e-4 rad.
    """
    tensor = _client_values(values)
    if bool((tensor == 0).all()):
        return torch.zeros((), dtype=tensor.dtype, device=tensor.device)
    center = tensor.mean()
    spread = torch.linalg.vector_norm(tensor - center)  # ||A|| sin(theta)
    along_ones = center * math.sqrt(tensor.numel())  # ||A|| cos(theta)
    return torch.atan2(spread, along_ones)


def jain_index(values: Any) -> torch.Tensor:
    """Jain's fairness index (sum a)^2 / (K * sum a^2); 1 when all equal (all-zero too)."""
    tensor = _client_values(values)
    sum_sq = (tensor * tensor).sum()
    if bool(sum_sq == 0):
        return torch.ones((), dtype=tensor.dtype, device=tensor.device)
    return tensor.sum() ** 2 / (tensor.numel() * sum_sq)


def pearson(x: Any, y: Any) -> torch.Tensor:
    """Pearson correlation of two per-client vectors (CGSV's rho is 100 * pearson).

    Returns NaN, with a ``RuntimeWarning`` saying why, when a vector is constant or there are
    fewer than two clients: the correlation is undefined there.
    """
    xt, yt = _client_values(x, "x"), _client_values(y, "y")
    if xt.numel() != yt.numel():
        raise ValueError(
            f"x and y must have one value per client each, got {xt.numel()} and {yt.numel()}"
        )
    dtype = torch.promote_types(xt.dtype, yt.dtype)
    xt, yt = xt.to(dtype), yt.to(dtype)
    nan = torch.full((), float("nan"), dtype=dtype, device=xt.device)
    if xt.numel() < 2:
        warnings.warn(
            "pearson: correlation needs at least 2 clients; returning nan",
            RuntimeWarning,
            stacklevel=2,
        )
        return nan
    constant = [name for name, v in (("x", xt), ("y", yt)) if bool((v == v[0]).all())]
    if constant:
        warnings.warn(
            f"pearson: {' and '.join(constant)} {'is' if len(constant) == 1 else 'are'} constant across clients, "
            "so the correlation "
            "is undefined (zero variance); returning nan",
            RuntimeWarning,
            stacklevel=2,
        )
        return nan
    return pearson_corrcoef(xt, yt).clamp(-1.0, 1.0)  # torchmetrics, once it is defined


def fairness_summary(values: Any, prefix: str = "") -> dict[str, float]:
    """Every fairness statistic of ``values`` as floats, keys prefixed with ``prefix``.

    Keys: mean, std, var, min, max, worst5, best5, worst10, best10, angle, jain
    (e.g. ``test_acc_mean`` with ``prefix="test_acc_"``). Computed in float64 on the CPU.
    """
    tensor = _client_values(values).detach().to("cpu", torch.float64)
    stats = {
        "mean": mean(tensor),
        "std": std(tensor),
        "var": variance(tensor),
        "min": tensor.min(),
        "max": tensor.max(),
        "worst5": worst_fraction(tensor, 0.05),
        "best5": best_fraction(tensor, 0.05),
        "worst10": worst_fraction(tensor, 0.10),
        "best10": best_fraction(tensor, 0.10),
        "angle": fedlf_angle(tensor),
        "jain": jain_index(tensor),
    }
    return {f"{prefix}{key}": float(stats[key]) for key in SUMMARY_KEYS}
