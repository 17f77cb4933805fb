"""The partitioner registry and its checks of a partitioner's name, parameters, labels and num_clients."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field, PlainValidator, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from fl_lightning.data._names import unknown_name
from fl_lightning.records.errors import did_you_mean

Partitioner = Callable[..., list[np.ndarray]]

PARTITIONERS: dict[str, Partitioner] = {}


# --------------------------------------------------------------------------- parameter types
# A partitioner's keyword parameters are annotated with these; check_partition_values
# validates each given value against its annotation (strictly: 2.5 is no Count, True no
# Count, "0.5" no Concentration; an int is a Concentration). ``| None``: None is allowed.


def _is_integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_sequence(value) -> bool:
    return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def _check_assignment(assignment: Any) -> Any:
    """``assignment`` if it is one non-empty list of distinct class ids per client."""
    example = "[[6], [2], [0]] (one list of class ids per client)"
    if not _is_sequence(assignment):
        raise ValueError(
            f"class_assignment assignment must be a list of class-id lists, e.g. {example}, "
            f"got {assignment!r}."
        )
    for client, client_classes in enumerate(assignment):
        if (
            not _is_sequence(client_classes)
            or not all(_is_integer(c) and c >= 0 for c in client_classes)
        ):
            raise ValueError(
                f"class_assignment[{client}] = {client_classes!r} must be a list of "
                f"non-negative integer class ids; assignment looks like {example}."
            )
        client_classes = [int(c) for c in client_classes]
        if not client_classes or len(set(client_classes)) != len(client_classes):
            raise ValueError(
                f"class_assignment[{client}] = {client_classes} must be a non-empty list of "
                "distinct class ids."
            )
    return assignment


def _check_client_ids(client_ids: Any) -> Any:
    """``client_ids`` if they are integers (their length is checked against the labels)."""
    dtype = np.asarray(client_ids).dtype
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(
            f"client_ids must be integer client ids (one per sample), got dtype {dtype}; "
            "convert them with client_ids.astype(np.int64)."
        )
    return client_ids


Concentration = Annotated[float, Field(gt=0, allow_inf_nan=False, examples=[0.5])]
"""A Dirichlet or power-law concentration ``alpha``: a finite number > 0."""
Count = Annotated[int, Field(ge=1, examples=[10])]
"""A number of samples, draws, classes or shards: an integer >= 1."""
ClassAssignment = Annotated[Sequence[Sequence[int]], PlainValidator(_check_assignment)]
"""One non-empty list of distinct, non-negative class ids per client."""
ClientIds = Annotated[np.ndarray, PlainValidator(_check_client_ids)]
"""One integer client id per sample."""


# --------------------------------------------------------------------------- registry


def register_partitioner(name: str) -> Callable[[Partitioner], Partitioner]:
    """Register ``fn`` under ``name``. The registered function checks the parameters
    (:func:`check_partition_params`), the labels and ``num_clients`` before calling ``fn``,
    so ``fn`` checks only what depends on the labels."""

    def decorate(fn: Partitioner) -> Partitioner:
        _parameter_types(fn)  # an annotation pydantic cannot check fails here, not in a run

        @functools.wraps(fn)
        def checked(labels, num_clients: int, seed: int = 0, **params) -> list[np.ndarray]:
            check_partition_params(name, params)
            labels = _as_labels(labels)
            check_num_clients(num_clients, len(labels))
            return fn(labels, num_clients, seed, **params)

        PARTITIONERS[name] = checked
        return checked

    return decorate


def partition(
    name: str, labels: np.ndarray, num_clients: int, seed: int = 0, **params
) -> list[np.ndarray]:
    """Split ``labels``' positions among ``num_clients`` clients with partitioner ``name``."""
    return _lookup(name)(labels, num_clients, seed, **params)


def partition_param_names(name: str, setting: str = "partitioner") -> dict[str, bool]:
    """The parameters partitioner ``name`` takes, each mapped to whether it is required."""
    fn = _lookup(name, setting)
    params = list(inspect.signature(fn).parameters.values())[3:]  # after labels, K, seed
    return {p.name: p.default is inspect.Parameter.empty for p in params}


def resolved_partition_params(name: str, params: Mapping) -> dict:
    """``params`` with partitioner ``name``'s defaults filled in (what the run really used,
    e.g. ``{"alpha": 0.5, "min_size": 10}`` for a Dirichlet partition given ``{}``)."""
    return {**_defaults(_lookup(name)), **params}


def _defaults(fn: Partitioner) -> dict:
    return {
        p.name: p.default
        for p in list(inspect.signature(fn).parameters.values())[3:]
        if p.default is not inspect.Parameter.empty
    }


def check_partition_params(
    name: str, params: Mapping, *, supplied: Collection[str] = (), setting: str = "partitioner"
) -> None:
    """Raise ``ValueError`` if ``name`` is no partitioner, or ``params`` has a key partitioner
    ``name`` does not take, lacks one it requires, or holds a value of the wrong type or range
    (:func:`check_partition_values`). The message lists the valid names or parameters.

    Needs no labels, so a data module can run it before any data is loaded. ``supplied``:
    parameters the caller fills in itself later from the data (the data module's
    ``client_ids`` for ``natural``): not required in ``params``, and refused there.
    ``setting``: what the messages call ``name`` (the data module's argument ``partition``)."""
    accepted = partition_param_names(name, setting)
    described = ", ".join(f"{p} (required)" if req else p for p, req in accepted.items())
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        defaults = ", ".join(f"{p}={v!r}" for p, v in _defaults(PARTITIONERS[name]).items())
        hint = "".join(did_you_mean(p, accepted) for p in unknown)
        raise ValueError(
            f"{setting} {name!r} got unknown parameter(s) {unknown}; "
            f"it takes: {described or 'no parameters'}"
            f"{f' (defaults: {defaults})' if defaults else ''}; "
            f"remove them from partition_params{hint}"
        )
    given = sorted(set(supplied) & set(params))
    if given:
        raise ValueError(
            f"partition_params must not contain {given}: the {setting} {name!r} takes them "
            "from the data source. Remove them from partition_params."
        )
    missing = [
        p for p, required in accepted.items() if required and p not in params and p not in supplied
    ]
    if missing:
        raise ValueError(
            f"{setting} {name!r} needs parameter(s) {missing}; it takes: {described}. "
            f"Pass them in partition_params, e.g. {{{missing[0]!r}: ...}}."
        )
    check_partition_values(name, params)


def check_partition_values(name: str, params: Mapping) -> None:
    """Raise ``ValueError`` naming the parameter when a value of ``params`` does not fit the
    type partitioner ``name`` annotates it with (e.g. ``alpha <= 0`` or
    ``classes_per_client=2.5``). Checks what needs no labels; the partitioner checks the
    rest (e.g. k <= classes)."""
    fn = inspect.unwrap(_lookup(name))
    types = _parameter_types(fn)
    for param, value in params.items():
        if param not in types:
            continue
        try:  # numpy scalars count as the Python scalars they hold
            types[param].validate_python(_as_python(value), strict=True)
        except ValidationError as invalid:
            error = invalid.errors()[0]
            if error["type"] == "value_error":  # a validator's own message (ClassAssignment)
                raise error["ctx"]["error"] from None
            example = _defaults(fn).get(param)
            if example is None:
                example = _first_example(inspect.get_annotations(fn, eval_str=True)[param])
            raise ValueError(
                f"{name}: {param} must be {_requirement(types[param].core_schema)}, "
                f"got {value!r}; fix it in partition_params, e.g. "
                f"{{{param!r}: {_as_setting(example)}}}."
            ) from None


@functools.cache
def _parameter_types(fn: Partitioner) -> dict[str, TypeAdapter[Any]]:
    """A validator for each annotated keyword parameter of partitioner ``fn``."""
    # not typing.get_type_hints: on Python 3.10 it wraps a parameter whose default is None in
    # Optional[...], around the Annotated type that carries the Field
    hints = inspect.get_annotations(fn, eval_str=True)
    params = list(inspect.signature(fn).parameters)[3:]  # after labels, K, seed
    return {p: TypeAdapter(hints[p]) for p in params if p in hints}


def _as_python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


# Core-schema bound keys and how a message writes them.
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _bound(value: Any) -> Any:
    """A bound as its ``Field`` wrote it: pydantic before 2.6 stores ``gt=0`` of a float as 0.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _requirement(schema: Mapping[str, Any]) -> str:
    """What a value of core schema ``schema`` must be, in words."""
    kind = schema["type"]
    if kind == "nullable":
        return f"{_requirement(schema['schema'])} (or null)"
    bounds = " and ".join(f"{op} {_bound(schema[key])}" for key, op in _BOUNDS.items() if key in schema)
    if kind == "int":
        return f"an integer {bounds}".rstrip()
    if kind == "float":
        number = "a finite number" if schema.get("allow_inf_nan") is False else "a number"
        return f"{bounds} ({number})" if bounds else number
    if kind == "bool":
        return "true or false"
    if kind == "str":
        return "a string"
    if kind == "literal":
        return f"one of {schema['expected']}"
    return f"a valid {kind}"


def _first_example(annotation: Any) -> Any:
    """The first ``examples`` entry of a ``Field`` in ``annotation``, else ``...``."""
    pending: list[Any] = [annotation]
    while pending:
        part = pending.pop(0)
        if isinstance(part, FieldInfo) and part.examples:
            return part.examples[0]
        pending.extend(typing.get_args(part))
    return ...


def _as_setting(value: Any) -> str:
    """``value`` as one writes it in a config: ``true``/``false`` for booleans."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def check_num_clients(num_clients: int, num_samples: int | None = None) -> None:
    """Raise ``ValueError`` unless ``num_clients`` is an integer >= 1 (and at most
    ``num_samples``, when given)."""
    if not _is_integer(num_clients) or num_clients < 1:
        raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}.")
    if num_samples is not None and num_clients > num_samples:
        raise ValueError(
            f"num_clients={num_clients} is more than the {num_samples} samples to share; "
            "use fewer clients."
        )


def check_test_fraction(test_fraction: float, setting: str = "test_fraction") -> None:
    """Raise ``ValueError`` unless ``0 <= test_fraction < 1`` (every client keeps a training
    sample); ``setting`` is the name the message uses."""
    if not 0 <= test_fraction < 1:
        raise ValueError(f"{setting} must be in [0, 1), got {test_fraction}.")


def _lookup(name: str, setting: str = "partitioner") -> Partitioner:
    if name not in PARTITIONERS:
        raise unknown_name(setting, name, PARTITIONERS)
    return PARTITIONERS[name]


def _as_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}.")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"labels must be integer class ids, got dtype {labels.dtype}; pass integer "
            "labels (e.g. labels.astype(np.int64), or tensor.long())."
        )
    if labels.min() < 0:
        raise ValueError(f"labels must be non-negative class ids, found {labels.min()}.")
    return labels.astype(np.int64, copy=False)
