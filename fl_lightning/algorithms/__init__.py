"""One file per federated algorithm; each is a ``FederatedModule`` subclass registered with
``@register_algorithm``, which makes it selectable as ``--model <ClassName>``.

The names are listed once, in :mod:`fl_lightning.algorithms.registry` (``BUILT_IN``), and read
without importing torch; a class is imported when it is first asked for
(``from fl_lightning.algorithms import FedLF``). ``ALGORITHMS`` maps every name to its class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fl_lightning.algorithms.registry import (
    BUILT_IN,
    algorithm_class,
    algorithm_names,
    load_algorithms,
    register_algorithm,
)

if TYPE_CHECKING:  # what the names below are, for type checkers (imported on first use at run time)
    from fl_lightning.algorithms.afl import AFL
    from fl_lightning.algorithms.cffl import CFFL
    from fl_lightning.algorithms.cgsv import CGSV, DW, EU, RR, Standalone
    from fl_lightning.algorithms.ditto import Ditto
    from fl_lightning.algorithms.drfl import DRFL
    from fl_lightning.algorithms.eci import ECI
    from fl_lightning.algorithms.fedavg import FedAvg
    from fl_lightning.algorithms.fedfa import FedFa
    from fl_lightning.algorithms.fedfv import FedFV
    from fl_lightning.algorithms.fedgini import FedGini
    from fl_lightning.algorithms.fedlf import FedLF
    from fl_lightning.algorithms.fedmdfg import FedMDFG
    from fl_lightning.algorithms.fedmgda import FedAvgN, FedMGDA, FedMGDAPlus, MGDAProx
    from fl_lightning.algorithms.fedprox import FedProx
    from fl_lightning.algorithms.qfedavg import QFedAvg
    from fl_lightning.algorithms.registry import ALGORITHMS

__all__ = [  # the registry's functions, then every name of BUILT_IN (a test keeps them equal)
    "ALGORITHMS", "BUILT_IN", "algorithm_class", "algorithm_names", "load_algorithms", "register_algorithm",
    "AFL", "CFFL", "Standalone", "CGSV", "DW", "EU", "RR", "FedAvg", "Ditto", "DRFL", "ECI", "FedFa", "FedFV",
    "FedGini", "FedLF", "FedMDFG", "FedMGDAPlus", "FedMGDA", "FedAvgN", "MGDAProx", "FedProx", "QFedAvg",
]


def __getattr__(name: str) -> Any:
    """``ALGORITHMS`` (every built-in one imported) or one algorithm's class, imported on first use."""
    if name == "ALGORITHMS":
        return load_algorithms()
    if name in BUILT_IN:
        return algorithm_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
