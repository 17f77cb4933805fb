"""The algorithms ``--model NAME`` accepts by short name: one list, read without importing torch.

``BUILT_IN`` names every algorithm this package ships, with the module that defines it, so that the
console script can list and check names in milliseconds. ``ALGORITHMS`` holds the classes, filled by
``@register_algorithm`` as their modules are imported; ``load_algorithms()`` imports them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from fl_lightning.core.module import FederatedModule

PACKAGE = "fl_lightning.algorithms"

# name -> module of fl_lightning.algorithms, in the order the help lists them
BUILT_IN: dict[str, str] = {
    "AFL": "afl", "CFFL": "cffl", "Standalone": "cgsv", "CGSV": "cgsv", "DW": "cgsv", "EU": "cgsv", "RR": "cgsv",
    "FedAvg": "fedavg", "Ditto": "ditto", "DRFL": "drfl", "ECI": "eci", "FedFa": "fedfa", "FedFV": "fedfv",
    "FedGini": "fedgini", "FedLF": "fedlf", "FedMDFG": "fedmdfg", "FedMGDAPlus": "fedmgda", "FedMGDA": "fedmgda",
    "FedAvgN": "fedmgda", "MGDAProx": "fedmgda", "FedProx": "fedprox", "QFedAvg": "qfedavg",
}

ALGORITHMS: dict[str, type[FederatedModule]] = {}
Algorithm = TypeVar("Algorithm", bound="type[FederatedModule]")


def algorithm_names() -> tuple[str, ...]:
    """The short names ``--model`` accepts: the built-in algorithms, then any registered since."""
    return tuple(BUILT_IN) + tuple(name for name in ALGORITHMS if name not in BUILT_IN)


def load_algorithms() -> dict[str, type[FederatedModule]]:
    """Imports every built-in algorithm's module (registering its classes) and returns ``ALGORITHMS``,
    in ``algorithm_names()``'s order whichever module was imported first."""
    for module in dict.fromkeys(BUILT_IN.values()):
        importlib.import_module(f"{PACKAGE}.{module}")
    ordered = {name: ALGORITHMS[name] for name in algorithm_names()}
    ALGORITHMS.clear()
    ALGORITHMS.update(ordered)
    return ALGORITHMS


def algorithm_class(name: str) -> type[FederatedModule]:
    """The class registered as ``name``, importing only its own module when it is a built-in one."""
    if name not in ALGORITHMS and name in BUILT_IN:
        importlib.import_module(f"{PACKAGE}.{BUILT_IN[name]}")
    return ALGORITHMS[name]


def register_algorithm(cls: Algorithm) -> Algorithm:
    """Class decorator: makes ``cls`` selectable as ``--model <ClassName>`` (any subclass of
    ``FederatedModule`` also works unregistered, by its class path: ``--model mypackage.MyAlgorithm``).
    An algorithm of this package must be listed in ``BUILT_IN``, under its own module."""
    from fl_lightning.core.module import FederatedModule

    if not (isinstance(cls, type) and issubclass(cls, FederatedModule)):
        raise TypeError(f"register_algorithm expects a FederatedModule subclass, got {cls!r}")
    known = ALGORITHMS.get(cls.__name__)
    if known is not None and known is not cls:
        raise ValueError(f"an algorithm named {cls.__name__!r} is already registered ({known.__module__}); "
                         "rename the class")
    package, _, module = cls.__module__.rpartition(".")
    if package == PACKAGE and BUILT_IN.get(cls.__name__) != module:
        raise ValueError(f"{cls.__name__} is defined in {cls.__module__}: list it in "
                         f"fl_lightning.algorithms.registry.BUILT_IN as {cls.__name__!r}: {module!r}")
    ALGORITHMS[cls.__name__] = cls
    return cls
