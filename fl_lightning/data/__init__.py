"""Where clients come from: data sources, partitioners and the federated data module.

Reports on a built split (a text table, a figure) are in :mod:`fl_lightning.data.reports`.
"""

from fl_lightning.data import adult, leaf, text  # noqa: F401  (register their sources)
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition import (
    PARTITIONERS,
    class_counts,
    partition,
    register_partitioner,
    split_train_test,
)
from fl_lightning.data.sources import (
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
