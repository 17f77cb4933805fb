"""Metrics of fl-lightning: fairness statistics over per-client values."""

from .fairness import (
    SUMMARY_KEYS,
    best_fraction,
    fairness_summary,
    fedlf_angle,
    jain_index,
    mean,
    pearson,
    std,
    variance,
    worst_fraction,
)
from .shapley import (
    FIG1_PERMUTATIONS,
    MAX_EXACT_AGENTS,
    approximate_cgsv,
    exact_cgsv,
    fig1_errors,
    sampled_cgsv,
)

__all__ = [
    "FIG1_PERMUTATIONS",
    "MAX_EXACT_AGENTS",
    "SUMMARY_KEYS",
    "approximate_cgsv",
    "best_fraction",
    "exact_cgsv",
    "fairness_summary",
    "fedlf_angle",
    "fig1_errors",
    "jain_index",
    "mean",
    "pearson",
    "sampled_cgsv",
    "std",
    "variance",
    "worst_fraction",
]
