"""The algorithms ``--model NAME`` accepts by short name, filled by ``@register_algorithm``."""

from __future__ import annotations

from typing import TypeVar

from fl_lightning.core.module import FederatedModule

ALGORITHMS: dict[str, type[FederatedModule]] = {}
Algorithm = TypeVar("Algorithm", bound=type[FederatedModule])


def register_algorithm(cls: Algorithm) -> Algorithm:
    """Class decorator: makes ``cls`` selectable as ``--model <ClassName>`` (any subclass of
    ``FederatedModule`` also works unregistered, by its class path: ``--model mypackage.MyAlgorithm``)."""
    if not (isinstance(cls, type) and issubclass(cls, FederatedModule)):
        raise TypeError(f"register_algorithm expects a FederatedModule subclass, got {cls!r}")
    known = ALGORITHMS.get(cls.__name__)
    if known is not None and known is not cls:
        raise ValueError(f"an algorithm named {cls.__name__!r} is already registered ({known.__module__}); "
                         "rename the class")
    ALGORITHMS[cls.__name__] = cls
    return cls
