"""The data-source registry: :func:`register_source`, and the functions that describe, check, load
and download a registered source."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from fl_lightning.data._names import unknown_name
from fl_lightning.records.errors import did_you_mean


@dataclass
class SourceInfo:
    """What is known about a source without loading any data."""

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    has_official_test: bool
    natural_clients: bool


@dataclass
class SourceData:
    """A loaded source: float32 inputs normalised per dataset, int64 labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None
    y_test: torch.Tensor | None
    info: SourceInfo
    client_of_train: torch.Tensor | None = None  # natural client id per training sample
    # a test set per natural client drawn from that client's own distribution (synthetic)
    x_client_test: torch.Tensor | None = None
    y_client_test: torch.Tensor | None = None
    client_of_test: torch.Tensor | None = None


@dataclass(frozen=True)
class _Source:
    """A registry entry: how to describe and load one source, and its parameters."""

    describe: Callable[..., SourceInfo]
    load: Callable[..., SourceData]
    defaults: dict[str, Any] = field(default_factory=dict)
    fetch: Callable[..., None] | None = None  # downloads files; None for offline sources
    files: Callable[..., list[str]] | None = None  # the files load reads, for a dry run's check
    obtain: str = ""  # where a user gets those files, for the message that says they are missing


_SOURCES: dict[str, _Source] = {}
_LOADER_ARGUMENTS = ("data_dir", "download", "seed")

Loader = TypeVar("Loader", bound=Callable[..., SourceData])


def register_source(
    name: str,
    *,
    info: SourceInfo | Callable[..., SourceInfo],
    fetch: Callable[..., None] | None = None,
    files: Callable[..., list[str]] | None = None,
    obtain: str = "",
) -> Callable[[Loader], Loader]:
    """Register the decorated loader as data source ``name`` (the pattern of timm's
    ``register_model``); :func:`load_source` and ``FederatedDataModule(source=name)`` then
    accept ``name``.

    The loader is ``load(data_dir: str, download: bool, seed: int, **params) -> SourceData``;
    the source's parameters (``source_params``) are its arguments after ``seed``, each with
    a default (so that the source can be described without any).

    Args:
        name: the source's name, unique among :func:`list_sources`.
        info: what the source is without loading it: a :class:`SourceInfo`, or a function of
            the source's parameters that returns one. The function is where parameter values
            are checked: it is called before every load and must raise ``ValueError``
            naming a value it cannot take.
        fetch: ``fetch(data_dir, **params)`` downloads the files ``load`` reads (called by
            ``FederatedDataModule.prepare_data`` when ``download=True``); ``None`` for a
            source that needs no files.
        files: ``files(data_dir, **params)`` lists the paths ``load`` reads, so that a plan
            (``python -m benchmarks run --dry-run``) can say what is missing before any run.
        obtain: one sentence on where a user gets those files (printed with the missing ones).

    Returns the loader unchanged. Registering a name twice is refused, unless it is the same
    loader again (a module imported a second time).
    """

    def decorate(load: Loader) -> Loader:
        arguments = list(inspect.signature(load).parameters.values())
        if (
            tuple(a.name for a in arguments[:3]) != _LOADER_ARGUMENTS
            or any(a.kind in (a.VAR_POSITIONAL, a.VAR_KEYWORD) for a in arguments)
            or any(a.default is a.empty for a in arguments[3:])
        ):
            raise TypeError(
                f"register_source({name!r}): the loader must be load(data_dir, download, seed, "
                f"<source parameters, each with a default>) -> SourceData, got "
                f"{getattr(load, '__name__', load)}{inspect.signature(load)}."
            )
        previous = _SOURCES.get(name)
        if previous is not None and _qualified_name(previous.load) != _qualified_name(load):
            raise ValueError(
                f"data source {name!r} is already registered (by {_qualified_name(previous.load)}); "
                f"register {_qualified_name(load)} under another name."
            )
        _SOURCES[name] = _Source(
            describe=info if callable(info) else (lambda **_: info),
            load=load,
            defaults={a.name: a.default for a in arguments[3:]},
            fetch=fetch,
            files=files,
            obtain=obtain,
        )
        return load

    return decorate


def _qualified_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def list_sources() -> list[str]:
    """Names accepted by :func:`load_source` (the built-ins and every :func:`register_source`)."""
    return sorted(_SOURCES)


def reads_files(name: str) -> bool:
    """Whether source ``name`` is read from files under ``data_dir`` (it was registered with a
    ``fetch`` or ``files``), not built offline; False for a name that is not registered."""
    entry = _SOURCES.get(name)
    return entry is not None and (entry.fetch is not None or entry.files is not None)


def missing_files(name: str, data_dir: str = "data", **params) -> tuple[list[str], str]:
    """(the files source ``name`` reads under ``data_dir`` that are not there, where to get
    them); ``([], "")`` for an offline source or one that did not register its ``files``."""
    source, params, _ = _resolve(name, params)
    if source.files is None:
        return [], ""
    missing = [path for path in source.files(data_dir=str(data_dir), **params) if not os.path.isfile(path)]
    return missing, source.obtain if missing else ""


def source_info(name: str, **params) -> SourceInfo:
    """Shape, class count and splits of source ``name`` (no data is read)."""
    _, _, info = _resolve(name, params)
    return info


def load_source(
    name: str, data_dir: str = "data", download: bool = False, seed: int = 0, **params
) -> SourceData:
    """Load source ``name`` as tensors.

    ``data_dir``/``download`` matter for torchvision sources only; ``seed`` for
    ``synthetic`` only. ``params`` are the source's own (``emnist``: ``split``;
    ``synthetic``: ``alpha``, ``beta``, ``num_clients``, ``iid``, ``test_per_client``).
    """
    source, params, _ = _resolve(name, params)
    return source.load(data_dir=str(data_dir), download=download, seed=seed, **params)


def download_source(name: str, data_dir: str = "data", **params) -> None:
    """Download source ``name``'s files into ``data_dir`` if they are not there yet
    (torchvision sources; offline sources need nothing)."""
    source, params, _ = _resolve(name, params)
    if source.fetch is not None:
        source.fetch(data_dir=str(data_dir), **params)


def _resolve(name: str, params: dict) -> tuple[_Source, dict, SourceInfo]:
    """The one place a source's name and parameters are checked: the entry, the parameters
    with defaults filled in, and the source's info (its ``info`` checks the values)."""
    if name not in _SOURCES:
        raise unknown_name("data source", name, _SOURCES)
    source = _SOURCES[name]
    unknown = sorted(set(params) - set(source.defaults))
    if unknown:
        accepted = ", ".join(f"{k}={v!r}" for k, v in source.defaults.items())
        hint = "".join(did_you_mean(p, source.defaults) for p in unknown)
        raise ValueError(
            f"source {name!r} got unknown parameter(s) {unknown}; "
            f"it takes: {accepted or 'no parameters'}; remove them from source_params{hint}"
        )
    params = {**source.defaults, **params}
    return source, params, source.describe(**params)
