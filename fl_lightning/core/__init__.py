"""Round mechanics shared by every algorithm: the module, its contract, local engines, flat views."""

from fl_lightning.core.engines import SequentialEngine, VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import LocalSGD
from fl_lightning.core.module import FederatedModule
from fl_lightning.core.payload import RoundPayload, ServerStep

__all__ = [
    "FederatedModule",
    "LocalSGD",
    "ParameterLayout",
    "RoundPayload",
    "SequentialEngine",
    "ServerStep",
    "VectorisedEngine",
]
