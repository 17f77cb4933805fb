"""The data module's client tensors: each client's samples packed contiguously with a padded index,
the matched test set's tensors, and a digest of the split."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def _matched_test_tensors(test_mode: str, class_counts: np.ndarray, pool_y: torch.Tensor | None,
                          num_classes: int) -> dict[str, torch.Tensor | None]:
    """For ``test_mode="matched"``: each client's training label distribution (K, C) and the
    shared test set's samples grouped by class (C, max per class) with the class sizes."""
    if test_mode != "matched":
        return dict.fromkeys(("test_class_weights", "global_test_class_index", "global_test_class_sizes"))
    if pool_y is None:
        raise ValueError(
            "test_mode='matched' needs a shared test pool (global_test_fraction > 0, or the source's test split)"
        )
    counts = torch.as_tensor(class_counts, dtype=torch.float32)
    weights = counts / counts.sum(dim=1, keepdim=True).clamp_min(1)
    by_class = [np.flatnonzero(pool_y.numpy() == c) for c in range(num_classes)]
    sizes = torch.as_tensor([len(i) for i in by_class], dtype=torch.int64)
    missing = [c for c in range(num_classes) if sizes[c] == 0 and bool((weights[:, c] > 0).any())]
    if missing:
        raise ValueError(
            f"test_mode='matched' needs every class the clients hold in the shared test set; classes "
            f"{missing} have no test sample: raise global_test_fraction or use test_mode='local'."
        )
    columns = torch.arange(max(1, int(sizes.max())))
    index = torch.zeros(num_classes, len(columns), dtype=torch.int64)
    for c, positions in enumerate(by_class):
        index[c, : len(positions)] = torch.as_tensor(positions, dtype=torch.int64)
    return {"test_class_weights": weights, "global_test_class_index": index, "global_test_class_sizes": sizes}


def _digest_of_split(train_lists, test_lists, global_y: torch.Tensor | None) -> str:
    """sha1 over every client's train and test sample positions and the shared test labels."""
    digest = hashlib.sha1()
    for kind, lists in ((b"train", train_lists), (b"test", test_lists)):
        for positions in lists:
            digest.update(kind + np.asarray(positions, dtype=np.int64).tobytes() + b";")
    if global_y is not None:
        digest.update(b"global" + global_y.numpy().astype(np.int64).tobytes())
    return digest.hexdigest()[:16]



def _pack_clients(x: torch.Tensor, y: torch.Tensor, index_lists: list[np.ndarray]):
    """Gather the clients' samples contiguously -> (x, y, padded index, sizes)."""
    sizes = torch.as_tensor([len(i) for i in index_lists], dtype=torch.int64)
    order = torch.as_tensor(np.concatenate(index_lists), dtype=torch.int64)
    offsets = torch.cumsum(sizes, 0) - sizes
    columns = torch.arange(max(1, int(sizes.max())))  # at least one column, even if all empty
    index = offsets[:, None] + columns[None, :]
    index = torch.where(columns[None, :] < sizes[:, None], index, torch.zeros_like(index))
    return x[order], y[order], index, sizes
