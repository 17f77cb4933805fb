"""LEAF's natural federated datasets, read from LEAF's JSON files, and an offline stand-in.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) writes each split as
JSON files ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.

* ``shakespeare``: next-character prediction, one client per role (Li et al., FedProx, MLSys
  2020; McMahan et al., AISTATS 2017), as FedMGDA+ (Hu et al., Sec. 6.1.3) uses it: 31 users
  subsampled, 80-character sequences. Files: ``<data_dir>/shakespeare/{train,test}/*.json``.
* ``femnist``: Federated EMNIST, one client per writer, 62 classes, 28x28 (FedMGDA+ Sec. 6.1.2).
  Files: ``<data_dir>/femnist/{train,test}/*.json``.
* ``pydoc_chars``: an offline character-level stand-in for ``shakespeare``: real English text
  shipped with Python (``pydoc_data.topics``), one client per help topic.

Characters are coded with LEAF's 80-letter vocabulary (:data:`LEAF_LETTERS`); a character
outside it is coded as a space. Inputs are the indices stored as float32 (sources give float
inputs); ``fl_lstm_chars`` casts them back to integers.
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import torch

from fl_lightning.data.parse_cache import Table, parsed_once
from fl_lightning.data.source_registry import SourceData, SourceInfo, register_source

__all__ = ["LEAF_LETTERS", "SEQUENCE_LENGTH", "encode_text"]

# LEAF's ALL_LETTERS (models/utils/language_utils.py of the LEAF repository): 80 characters.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQUENCE_LENGTH = 80
_SPACE = LEAF_LETTERS.index(" ")
_INDEX = {c: i for i, c in enumerate(LEAF_LETTERS)}
FEMNIST_CLASSES = 62

_SHAKESPEARE_OBTAIN = (
    "LEAF (github.com/TalwalkarLab/leaf): in data/shakespeare run "
    "`./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8`, then copy its data/train/*.json "
    "and data/test/*.json into <data_dir>/shakespeare/train/ and <data_dir>/shakespeare/test/"
)
_FEMNIST_OBTAIN = (
    "LEAF (github.com/TalwalkarLab/leaf): in data/femnist run "
    "`./preprocess.sh -s niid --sf 1.0 -k 0 -t sample`, then copy its data/train/*.json "
    "and data/test/*.json into <data_dir>/femnist/train/ and <data_dir>/femnist/test/"
)


def encode_text(text: str) -> np.ndarray:
    """Indices of ``text``'s characters in :data:`LEAF_LETTERS` (int64; unknown -> space)."""
    return np.fromiter((_INDEX.get(c, _SPACE) for c in text), dtype=np.int64, count=len(text))


# --------------------------------------------------------------------------- LEAF's JSON files


def _leaf_files(data_dir: str, dataset: str) -> dict[str, list[str]]:
    """The JSON files of each split; a split with none gets the pattern it was looked for with
    (not a file, so that a dry run reports it missing)."""
    found = {}
    for split in ("train", "test"):
        pattern = os.path.join(data_dir, dataset, split, "*.json")
        found[split] = sorted(glob.glob(pattern)) or [pattern]
    return found


def _checked_leaf_files(data_dir: str, dataset: str, obtain: str) -> dict[str, list[str]]:
    files = _leaf_files(data_dir, dataset)
    for paths in files.values():
        if not os.path.isfile(paths[0]):
            raise FileNotFoundError(
                f"{dataset}: no LEAF JSON files in {os.path.dirname(paths[0])!r} "
                f"(data_dir={data_dir!r}); get them with {obtain}."
            )
    return files


def _read_leaf_json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        blob = json.load(handle)
    if not isinstance(blob, dict) or not {"users", "user_data"} <= set(blob):
        raise ValueError(f"{path}: not a LEAF JSON file (expected the keys 'users', 'num_samples', 'user_data')")
    return blob


def _users_column(blob: dict) -> tuple[np.ndarray, list]:
    """(a user name per sample, the users in file order)."""
    users = [str(u) for u in blob["users"]]
    counts = [len(blob["user_data"][u]["y"]) for u in users]
    return np.repeat(np.array(users, dtype=str), counts), users


def _parse_shakespeare(path: str) -> Table:
    blob = _read_leaf_json(path)
    user_of, users = _users_column(blob)
    xs = [s for u in users for s in blob["user_data"][u]["x"]]
    ys = [s for u in users for s in blob["user_data"][u]["y"]]
    bad = [s for s in xs if len(s) != SEQUENCE_LENGTH] + [s for s in ys if len(s) != 1]
    if bad:
        raise ValueError(f"{path}: expected {SEQUENCE_LENGTH}-character inputs and one-character "
                         f"targets, found {bad[0]!r}")
    x = encode_text("".join(xs)).reshape(len(xs), SEQUENCE_LENGTH).astype(np.uint8)
    y = encode_text("".join(ys)).astype(np.uint8)
    return {"user": user_of, "x": x, "y": y}


def _parse_femnist(path: str) -> Table:
    blob = _read_leaf_json(path)
    user_of, users = _users_column(blob)
    x = np.asarray([p for u in users for p in blob["user_data"][u]["x"]], dtype=np.float32)
    y = np.asarray([c for u in users for c in blob["user_data"][u]["y"]], dtype=np.int64)
    if len(x) and x.shape[1:] != (784,):
        raise ValueError(f"{path}: expected 784 pixel values per image, got shape {x.shape[1:]}")
    x = x.reshape(len(x), 784)
    as_bytes = np.round(x * 255)
    if np.abs(as_bytes - x * 255).max(initial=0) < 1e-3:  # LEAF writes pixel / 255: keep a byte each
        return {"user": user_of, "pixels": as_bytes.astype(np.uint8), "y": y}
    return {"user": user_of, "x": x, "y": y}


def _concatenate(paths: list[str], parse, parser: str) -> Table:
    tables = [parsed_once(p, parse, parser) for p in paths]
    return {k: np.concatenate([t[k] for t in tables]) for k in tables[0]}


def _choose_users(train_users: np.ndarray, test_users: np.ndarray, count: int | None,
                  seed: int, name: str) -> np.ndarray:
    """``count`` users with both training and test samples, drawn without replacement with
    ``numpy.random.default_rng(seed)`` from the sorted names (all when ``count`` is None), sorted."""
    candidates = np.intersect1d(np.unique(train_users), np.unique(test_users))
    if count is None:
        return candidates
    if count > len(candidates):
        raise ValueError(f"{name}: asked for {count} users, the files have {len(candidates)} with "
                         "both training and test samples; lower num_clients.")
    return np.sort(np.random.default_rng(seed).choice(candidates, size=count, replace=False))


def _natural(train: Table, test: Table, users: np.ndarray, inputs, info: SourceInfo) -> SourceData:
    """SourceData of the chosen users: client k = users[k], its training and its own test samples."""
    parts = {}
    for split, table in (("train", train), ("test", test)):
        rows = np.flatnonzero(np.isin(table["user"], users))
        rows = rows[np.argsort(np.searchsorted(users, table["user"][rows]), kind="stable")]
        parts[split] = (inputs(table, rows), torch.as_tensor(table["y"][rows].astype(np.int64)),
                        torch.as_tensor(np.searchsorted(users, table["user"][rows])))
    (x, y, ids), (xt, yt, idt) = parts["train"], parts["test"]
    return SourceData(x, y, xt, yt, info, client_of_train=ids,
                      x_client_test=xt, y_client_test=yt, client_of_test=idt)


def _check_count(name: str, num_clients, allow_none: bool) -> None:
    if num_clients is None and allow_none:
        return
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"{name} num_clients must be an integer >= 1"
                         f"{' or null (all users)' if allow_none else ''}, got {num_clients!r}.")


# --------------------------------------------------------------------------- shakespeare

_SHAKESPEARE_INFO = SourceInfo("shakespeare", len(LEAF_LETTERS), (SEQUENCE_LENGTH,),
                               has_official_test=True, natural_clients=True)


def _describe_shakespeare(num_clients: int) -> SourceInfo:
    _check_count("shakespeare", num_clients, allow_none=False)
    return _SHAKESPEARE_INFO


def _shakespeare_files(data_dir: str, num_clients: int = 31) -> list[str]:
    return [p for paths in _leaf_files(data_dir, "shakespeare").values() for p in paths]


def _char_inputs(table: Table, rows: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(table["x"][rows].astype(np.float32))


@register_source("shakespeare", info=_describe_shakespeare, files=_shakespeare_files, obtain=_SHAKESPEARE_OBTAIN)
def _load_shakespeare(data_dir: str, download: bool, seed: int, num_clients: int = 31) -> SourceData:
    """LEAF Shakespeare, one client per role: ``num_clients`` roles (default 31, as FedMGDA+,
    Hu et al., Sec. 6.1.3, following FedProx, Li et al., MLSys 2020) drawn without replacement
    from the sorted roles that have training and test samples, with
    ``numpy.random.default_rng(seed)``; client k is the k-th chosen role in name order. Inputs:
    80 character indices (float32), target: the next character (80 classes). Each client's
    test set is its samples in LEAF's test files."""
    files = _checked_leaf_files(data_dir, "shakespeare", _SHAKESPEARE_OBTAIN)
    train = _concatenate(files["train"], _parse_shakespeare, "leaf-shakespeare-v1")
    test = _concatenate(files["test"], _parse_shakespeare, "leaf-shakespeare-v1")
    users = _choose_users(train["user"], test["user"], num_clients, seed, "shakespeare")
    return _natural(train, test, users, _char_inputs, _SHAKESPEARE_INFO)


# --------------------------------------------------------------------------- femnist

_FEMNIST_INFO = SourceInfo("femnist", FEMNIST_CLASSES, (1, 28, 28), has_official_test=True, natural_clients=True)


def _describe_femnist(num_clients: int | None) -> SourceInfo:
    _check_count("femnist", num_clients, allow_none=True)
    return _FEMNIST_INFO


def _femnist_files(data_dir: str, num_clients: int | None = None) -> list[str]:
    return [p for paths in _leaf_files(data_dir, "femnist").values() for p in paths]


def _image_inputs(table: Table, rows: np.ndarray) -> torch.Tensor:
    if "pixels" in table:
        x = torch.as_tensor(table["pixels"][rows].astype(np.float32) / 255.0)
    else:
        x = torch.as_tensor(table["x"][rows].astype(np.float32))
    return x.view(-1, 1, 28, 28)


@register_source("femnist", info=_describe_femnist, files=_femnist_files, obtain=_FEMNIST_OBTAIN)
def _load_femnist(data_dir: str, download: bool, seed: int, num_clients: int | None = None) -> SourceData:
    """LEAF FEMNIST (Caldas et al. 2018), one client per writer, 62 classes, (1, 28, 28) images
    with LEAF's pixel values in [0, 1] (no normalisation, as Reddi et al., ICLR 2021 and
    FedMGDA+ Sec. 6.1.2 train on them). ``num_clients``: all writers that have training and
    test samples (None; 3,406 in the full set), or that many drawn without replacement with
    ``numpy.random.default_rng(seed)``; client k is the k-th chosen writer in name order. Each
    client's test set is its samples in LEAF's test files."""
    files = _checked_leaf_files(data_dir, "femnist", _FEMNIST_OBTAIN)
    train = _concatenate(files["train"], _parse_femnist, "leaf-femnist-v1")
    test = _concatenate(files["test"], _parse_femnist, "leaf-femnist-v1")
    users = _choose_users(train["user"], test["user"], num_clients, seed, "femnist")
    return _natural(train, test, users, _image_inputs, _FEMNIST_INFO)


# --------------------------------------------------------------------------- pydoc_chars (offline)

_PYDOC_INFO = SourceInfo("pydoc_chars", len(LEAF_LETTERS), (SEQUENCE_LENGTH,),
                         has_official_test=True, natural_clients=True)


def _pydoc_topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return topics


def _describe_pydoc(num_clients: int, max_samples_per_client: int, test_fraction: float) -> SourceInfo:
    _check_count("pydoc_chars", num_clients, allow_none=False)
    available = sum(len(_collapsed(t)) >= 10 * SEQUENCE_LENGTH for t in _pydoc_topics().values())
    if num_clients > available:
        raise ValueError(f"pydoc_chars num_clients must be at most {available} (topics of this "
                         f"Python's help text with at least {10 * SEQUENCE_LENGTH} characters), got {num_clients}.")
    if isinstance(max_samples_per_client, bool) or not isinstance(max_samples_per_client, int) \
            or max_samples_per_client < 4:
        raise ValueError(f"pydoc_chars max_samples_per_client must be an integer >= 4, got {max_samples_per_client!r}.")
    if not 0.125 <= test_fraction <= 0.875:  # both parts of an 800-character topic hold a window
        raise ValueError(f"pydoc_chars test_fraction must be in [0.125, 0.875], got {test_fraction!r}.")
    return _PYDOC_INFO


def _collapsed(text: str) -> str:
    return re.sub(" +", " ", text)


def _windows(codes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` evenly spaced 80-character windows of ``codes`` and the character after each."""
    last = len(codes) - SEQUENCE_LENGTH - 1  # the last window start with a next character
    starts = np.unique(np.linspace(0, last, num=max(1, min(count, last + 1))).round().astype(np.int64))
    x = codes[starts[:, None] + np.arange(SEQUENCE_LENGTH)]
    return x, codes[starts + SEQUENCE_LENGTH]


@register_source("pydoc_chars", info=_describe_pydoc)
def _load_pydoc_chars(
    data_dir: str,
    download: bool,
    seed: int,
    num_clients: int = 20,
    max_samples_per_client: int = 300,
    test_fraction: float = 0.2,
) -> SourceData:
    """OFFLINE-SCALE stand-in for LEAF Shakespeare (next-character prediction, 80-character
    sequences, LEAF's 80-letter vocabulary): the English help text shipped with Python
    (``pydoc_data.topics``), one client per topic, the ``num_clients`` longest topics (ties by
    name). Runs of spaces are collapsed to one. Each topic's first ``1 - test_fraction`` of
    characters gives at most ``max_samples_per_client`` evenly spaced training windows, the rest
    its own test windows (at most ``max_samples_per_client * test_fraction / (1 - test_fraction)``,
    at least one), so train and test never share characters. Deterministic; the ``seed`` is
    not used (the text depends on the Python version only)."""
    topics = _pydoc_topics()
    names = sorted(topics, key=lambda k: (-len(_collapsed(topics[k])), k))[:num_clients]
    test_cap = max(1, int(round(max_samples_per_client * test_fraction / (1 - test_fraction))))
    xs, ys, ids, xts, yts, idts = [], [], [], [], [], []
    for k, name in enumerate(names):
        codes = encode_text(_collapsed(topics[name]))
        cut = int(round(len(codes) * (1 - test_fraction)))
        x, y = _windows(codes[:cut], max_samples_per_client)
        xt, yt = _windows(codes[cut:], test_cap)
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(y), k))
        xts.append(xt)
        yts.append(yt)
        idts.append(np.full(len(yt), k))
    x_test = torch.as_tensor(np.concatenate(xts), dtype=torch.float32)
    y_test = torch.as_tensor(np.concatenate(yts), dtype=torch.int64)
    return SourceData(
        x_train=torch.as_tensor(np.concatenate(xs), dtype=torch.float32),
        y_train=torch.as_tensor(np.concatenate(ys), dtype=torch.int64),
        x_test=x_test,
        y_test=y_test,
        info=_PYDOC_INFO,
        client_of_train=torch.as_tensor(np.concatenate(ids), dtype=torch.int64),
        x_client_test=x_test,
        y_client_test=y_test,
        client_of_test=torch.as_tensor(np.concatenate(idts), dtype=torch.int64),
    )
