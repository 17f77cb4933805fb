"""``FederatedModule``'s settings: one constrained type per meaning, and groups that check themselves.

A type says what a setting may hold (``Annotated`` with pydantic's ``Field``): the module's
signature carries it, so LightningCLI (jsonargparse) refuses a bad value while parsing, and a
settings group checks the same type when the module is built in Python. The rule a person reads
in an error is the type's ``description``; :func:`check_setting` turns pydantic's structured
error into that one line. Closed choices are ``Literal`` types (listed in ``--help``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import typing
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    PydanticSchemaGenerationError,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
)

from fl_lightning.choices import check_choice, choices_of
from fl_lightning.records.errors import first_refusal
from fl_lightning.records.vocabulary import DEFAULT_EVAL_EVERY, DEFAULT_FRACTION, DEFAULT_NUM_ROUNDS

# ----------------------------------------------------------------------------- closed choices
EngineName = Literal["auto", "vectorised", "sequential"]
Autocast = Literal["bf16", "fp16"]
HistoryDtype = Literal["float32", "bfloat16", "float16"]
HistoryDevice = Literal["model", "cpu"]  # "cpu": per-client histories offloaded to host memory
LayerGrouping = Literal["tensor", "module"]
Attack = Literal["bias", "scaling"]

NULL_MEANS = "null_means"  # a Literal | None type's Field(json_schema_extra=...): what None stands for


OptionalAutocast = Annotated[Autocast | None, Field(json_schema_extra={NULL_MEANS: "full precision"})]
OptionalHistoryDtype = Annotated[HistoryDtype | None, Field(json_schema_extra={NULL_MEANS: "the parameters' dtype"})]
OptionalAttack = Annotated[Attack | None, Field(json_schema_extra={NULL_MEANS: "no attacker"})]

# ----------------------------------------------------------------------------- numbers
Count = Annotated[int, Field(ge=1, description=">= 1")]  # rounds, epochs, evaluation period
Participation = Annotated[float, Field(gt=0, le=1, description="in (0, 1] (1.0 = full participation)")]
Probability = Annotated[float, Field(ge=0, lt=1, description="in [0, 1)")]  # dropout, momentum
Decay = Annotated[float, Field(gt=0, le=1, description="in (0, 1]")]
StepSize = Annotated[float, Field(gt=0, allow_inf_nan=False, description="> 0")]
Penalty = Annotated[float, Field(ge=0, allow_inf_nan=False, description=">= 0")]  # weight decay
FiniteNumber = Annotated[float, Field(allow_inf_nan=False, description="finite")]
ClientId = Annotated[int, Field(ge=0, description="a client id >= 0")]
Gigabytes = Annotated[float, Field(gt=0, allow_inf_nan=False, description="> 0")]
BatchSize = Annotated[
    Annotated[int, Field(ge=1)] | None, Field(description="a positive integer or null (full batch)")]
ChunkSize = Annotated[
    Annotated[int, Field(ge=1)] | Literal["auto"] | None,
    Field(description="an integer >= 1, 'auto' or null (all at once)")]
Threads = Annotated[
    Annotated[int, Field(ge=1)] | Literal["auto"],
    Field(description="an integer >= 1 or 'auto' (the cores the fit is given)")]
CountOrZero = Annotated[int, Field(ge=0, description="an integer >= 0")]  # FedFV's τ, line-search steps: 0 = none
Proportion = Annotated[float, Field(ge=0, le=1, description="in [0, 1]")]  # a weight or share, both ends allowed
Scale = Annotated[float, Field(gt=0, allow_inf_nan=False, description="> 0")]  # a formula's constant: Γ, sinh's α, L
Exponent = Annotated[float, Field(ge=0, allow_inf_nan=False, description=">= 0")]  # q of q-FFL, DRFL: 0 = uniform

# what a value that is not of the type at all must be (pydantic's error type -> words)
_TYPE_ERRORS = {
    "int_parsing": "an int", "int_type": "an int", "int_from_float": "an int",
    "float_parsing": "a float", "float_type": "a float", "finite_number": "a finite number",
    "bool_parsing": "true or false", "bool_type": "true or false",
    "string_type": "a string", "dict_type": "a mapping", "list_type": "a list",
}


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any] | None:
    """pydantic's validator of ``annotation``; None for a type it cannot check (a tensor, a class)."""
    try:
        return TypeAdapter(annotation)
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError):
        return None


def _field_info(annotation: Any, key: str) -> Any:
    """The ``key`` of the ``Field`` an ``Annotated`` type carries (the outermost that sets it:
    ``Annotated[Decay, Field(description="... (the paper: 0.999)")]`` words its own rule)."""
    for meta in reversed(getattr(annotation, "__metadata__", ())):
        value = getattr(meta, key, None)
        if value is not None:
            return value
    return None


def _null_means(annotation: Any) -> str | None:
    extra = _field_info(annotation, "json_schema_extra")
    return extra.get(NULL_MEANS) if isinstance(extra, dict) else None


def _has_choices(annotation: Any) -> bool:
    inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    return bool(choices_of(inner)) and all(
        a is type(None) or typing.get_origin(a) is Literal
        for a in (typing.get_args(inner) if typing.get_origin(inner) is not Literal else [inner]))


def check_setting(name: str, value: Any, annotation: Any, strict: bool = False) -> Any:
    """``value`` if it is of ``annotation``'s type, else ``ValueError`` in one line: "unknown
    engine 'gpu'; valid: ..." for a closed choice, "lr must be > 0, got -1" for a constraint (the
    type's ``description``), "lr must be a float, got 'abc'" for a value of another type. Strings
    are read as jsonargparse reads a command line (``"0.5"`` is 0.5), unless ``strict`` (a value
    given in Python: ``"0.5"`` is no float there). Returns the value as read."""
    if _has_choices(annotation):
        inner = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
        check_choice(name, value, inner, _null_means(annotation))
        return value
    adapter = _adapter(annotation)
    if adapter is None:
        return value
    if strict and isinstance(value, numbers.Number) and hasattr(value, "item"):
        value = value.item()  # a NumPy scalar: its Python number
    try:
        return adapter.validate_python(value, strict=strict)
    except ValidationError as error:
        raise ValueError(describe(name, value, annotation, error)) from None


def setting_rule(annotation: Any) -> str | None:
    """What a value of ``annotation`` must be, in the words of its errors ("in (0, 1]", "> 0");
    None for a closed choice (a help lists those) or a type without a rule."""
    if annotation is None or _has_choices(annotation):
        return None
    rule = _field_info(annotation, "description")
    return rule if isinstance(rule, str) else None


def describe(name: str, value: Any, annotation: Any, error: ValidationError) -> str:
    """One line from pydantic's structured error (its ``type``); its text (a validator's own, as
    written) only where the annotation says no rule."""
    kinds = [e["type"] for e in error.errors()]
    rule = _field_info(annotation, "description")
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if "finite_number" in kinds or (is_number and not math.isfinite(value)):
        rule = rule if rule is not None and "finite" in rule else "a finite number"
    elif rule is None or (all(kind in _TYPE_ERRORS for kind in kinds) and not is_number):
        rule = next((_TYPE_ERRORS[k] for k in kinds if k in _TYPE_ERRORS), None) or rule or first_refusal(error).message
    return f"{name} must be {rule}, got {value!r}"


# ----------------------------------------------------------------------------- groups
@dataclasses.dataclass(frozen=True)
class SettingsGroup:
    """A frozen group of settings whose fields' types check them when it is built.

    ``LABELS`` maps a field to the name its errors use, where that is not the field's name."""

    LABELS: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self), include_extras=True)
        for field in dataclasses.fields(self):
            check_setting(
                self.LABELS.get(field.name, field.name), getattr(self, field.name), hints[field.name], strict=True
            )


@dataclasses.dataclass(frozen=True)
class Federation(SettingsGroup):
    """Who takes part, and for how long: T rounds, a fraction C of the K clients sampled, each
    answering with probability 1 - dropout_prob; every client evaluated every ``eval_every``."""

    num_rounds: Count = DEFAULT_NUM_ROUNDS
    fraction: Participation = DEFAULT_FRACTION
    dropout_prob: Probability = 0.0
    eval_every: Count = DEFAULT_EVAL_EVERY


@dataclasses.dataclass(frozen=True)
class EngineSettings(SettingsGroup):
    """How the clients of a round are trained (``core.engines``): the engine, the memory the
    ``"auto"`` choice may spend, the clients stacked at once, mixed precision."""

    engine: EngineName = "auto"
    memory_budget_gb: Gigabytes = 4.0
    clients_per_chunk: ChunkSize = "auto"
    autocast: OptionalAutocast = None

    LABELS: ClassVar[dict[str, str]] = {"memory_budget_gb": "engine_memory_budget_gb",
                                        "autocast": "local_autocast"}


@dataclasses.dataclass(frozen=True)
class HistorySettings(SettingsGroup):
    """Where per-client histories (K x d: FedFV, FedLF, FedMDFG) are kept, and in which dtype."""

    dtype: OptionalHistoryDtype = None
    device: HistoryDevice = "model"

    LABELS: ClassVar[dict[str, str]] = {"dtype": "history_dtype", "device": "history_device"}


# ----------------------------------------------------------------------------- signatures
def is_constrained(annotation: Any) -> bool:
    """Whether a type says more than a plain Python type: a ``Field`` constraint or a choice."""
    return _has_choices(annotation) or any(
        getattr(meta, "metadata", None) or getattr(meta, "description", None)
        for meta in getattr(annotation, "__metadata__", ()))


@functools.cache
def signature_types(cls: type, base: type = object) -> dict[str, Any]:
    """Every keyword ``cls.__init__`` takes, and those of the ``__init__``s it passes ``**kwargs``
    to, down to ``base`` (left out), each with its annotated type (``Any`` when it has none). A
    name a subclass re-declares takes the subclass's type (FedFa's ``momentum`` may be None,
    meaning its γ). ``TypeError`` when an annotation cannot be resolved at run time."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        if issubclass(base, klass):
            break
        init = vars(klass).get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
            # not typing.get_type_hints: on Python 3.10 it wraps a parameter whose default is None
            # in Optional[...], which hides the Field of an ``Annotated[X | None, Field(...)]``
            hints = inspect.get_annotations(init, eval_str=True)
        except (NameError, TypeError, ValueError) as error:
            raise TypeError(f"{klass.__qualname__}.__init__'s annotations must be importable at run time "
                            f"(not only under TYPE_CHECKING): {error}") from None
        for p in parameters:
            if p.name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
                found.setdefault(p.name, hints.get(p.name, Any))
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return found


def constrained_settings(cls: type, base: type = object) -> tuple[tuple[str, Any], ...]:
    """``(name, type)`` of every keyword of :func:`signature_types` whose type constrains it."""
    return tuple((name, hint) for name, hint in signature_types(cls, base).items() if is_constrained(hint))


def check_settings(cls: type, values: typing.Mapping[str, Any], base: type = object) -> None:
    """Checks each of ``values`` that ``cls``'s signature (down to ``base``) gives a constrained
    type, strictly: a value given in Python is not re-read from a string."""
    for name, annotation in constrained_settings(cls, base):
        if name in values:
            check_setting(name, values[name], annotation, strict=True)
