"""One file per federated algorithm; each is a ``FederatedModule`` subclass registered with
``@register_algorithm``, which makes it selectable as ``--model <ClassName>``.

``ALGORITHMS`` maps those names to the classes (in the order they were registered).
"""

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
from fl_lightning.algorithms.registry import ALGORITHMS, register_algorithm

__all__ = [
    "ALGORITHMS", "register_algorithm", "AFL", "CFFL", "CGSV", "DW", "EU", "RR", "Standalone", "Ditto",
    "DRFL", "ECI", "FedAvg", "FedFa", "FedFV", "FedGini", "FedLF", "FedMDFG", "FedAvgN", "FedMGDA",
    "FedMGDAPlus", "MGDAProx", "FedProx", "QFedAvg",
]
