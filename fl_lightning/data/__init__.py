"""Where clients come from: data sources, partitioners and the federated data module.

Reports on a built split (a text table, a figure) are in :mod:`fl_lightning.data.reports`.
"""

from fl_lightning.data import adult, leaf, sources, text  # noqa: F401  (register their sources)
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition import class_counts, split_train_test  # registers the partitioners
from fl_lightning.data.partition_registry import PARTITIONERS, partition, register_partitioner
from fl_lightning.data.source_registry import (
    SourceData,
    SourceInfo,
    list_sources,
    load_source,
    register_source,
    source_info,
)

__all__ = [
    "PARTITIONERS",
    "FederatedDataModule",
    "SourceData",
    "SourceInfo",
    "class_counts",
    "list_sources",
    "load_source",
    "partition",
    "register_partitioner",
    "register_source",
    "source_info",
    "split_train_test",
]
