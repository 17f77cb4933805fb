"""The format of ``benchmarks/<paper>/claims.yaml``, declared: pydantic models of what the file may
hold (``extra="forbid"``: a misspelt key is refused with a did-you-mean, not ignored), and
pydantic's refusals said in the file's own words, one line each. ``claims.spec`` builds the
ledger's claims from the validated models (inherited benchmarks and quantities, the checks that
need the whole claim)."""

from __future__ import annotations

import datetime
import typing
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from fl_lightning.choices import unknown_key_message


def _text(value: Any) -> Any:
    """YAML's dates (``date: 2026-01-01``) and numbers read as the text they were written as."""
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


Text = Annotated[str, BeforeValidator(_text)]
Required = Annotated[Text, Field(min_length=1)]  # present and not empty
Number = StrictFloat | StrictInt


class _Declared(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SideSpec(_Declared):
    """A side of a comparison written out: ``{config, benchmark, quantity}`` (a bare label is the config)."""

    config: Required
    benchmark: Text | None = None
    quantity: Text | None = None


Side = Text | SideSpec


class ComparisonSpec(_Declared):
    treatment: Side
    baseline: Side | None = None
    threshold: Number | None = None
    benchmark: Text | None = None
    direction: Text | None = None
    margin: Number | None = None
    paper: list[Number] | None = None
    by_construction: Text | None = None  # why this comparison holds by construction (shown, kept out of the verdict)

    @model_validator(mode="after")
    def _one_reference(self) -> ComparisonSpec:
        if ("baseline" in self.model_fields_set) == ("threshold" in self.model_fields_set):
            raise ValueError("give exactly one of `baseline` and `threshold`")
        return self


class LocationSpec(_Declared):
    suite: Required
    benchmark: Required


class AblationSpec(LocationSpec):
    factor: Text | None = None
    comparisons: list[ComparisonSpec] | None = None

    @model_validator(mode="after")
    def _says_its_factor(self) -> AblationSpec:
        if not self.factor:
            raise ValueError("say which factor it changes (`factor`)")
        return self


class UntestedSpec(_Declared):
    """A part of a claim's quote that no comparison tests: the paper's words, and why not."""

    quote: Required
    why: Required


class RetirementSpec(_Declared):
    date: Required
    reason: Required


class ClaimSpec(_Declared):
    id: Required
    where: Required
    claim: Required
    quantity: Required
    direction: Required
    quote: Text | None = None
    quantity_note: Text | None = None
    bar: Text | None = None
    margin: Number | None = None
    offline: LocationSpec | None = None
    paper_scale: LocationSpec | None = None
    comparisons: list[ComparisonSpec] | None = None
    ablations: list[AblationSpec] | None = None
    reason: Text | None = None
    not_tested: Text | None = None
    not_testable: Text | None = None
    not_implemented: Text | None = None
    by_construction: Text | None = None
    untested: list[UntestedSpec] | None = None
    retired: RetirementSpec | None = None


class CoverageSpec(_Declared):
    item: Required
    claims: list[Text] | None = None
    not_claimed: Text | None = None


class ClaimsFileSpec(_Declared):
    """A whole claims file: the paper, how to cite it, its claims (validated one by one, so a
    refusal names the claim) and its coverage."""

    paper: Text | None = None
    citation: Text | None = None
    name: Text | None = None
    claims: list[dict[str, Any]]
    coverage: list[CoverageSpec] | None = None


# How each part is written, said when it is not (keyed by the field's name).
FORMS = {
    "offline": "expected {suite: ..., benchmark: ...}",
    "paper_scale": "expected {suite: ..., benchmark: ...}",
    "retired": "`retired` is {date: YYYY-MM-DD, reason: ...}",
    "comparisons": "`comparisons` must be a list of {treatment, baseline | threshold}",
    "treatment": "a side is a configuration label or {config, benchmark, quantity}",
    "baseline": "a side is a configuration label or {config, benchmark, quantity}",
    "paper": "`paper` is a list of the paper's numbers",
    "coverage": "`coverage` is a list of {item, claims} or {item, not_claimed}",
    "untested": "`untested` is a list of {quote, why}: the paper's words no comparison tests, and why",
}


# How an item of a list is named in a refusal (``claim c1, ablation 2, comparison 1: ...``).
ITEM_NAMES = {"comparisons": "comparison", "ablations": "ablation", "coverage": "coverage entry",
              "untested": "untested part"}


def refusal(error: ValidationError, model: type[BaseModel]) -> str:
    """The first of pydantic's refusals in the file's words: where in the entry, and what to write."""
    first = error.errors()[0]
    path = list(first["loc"])
    names = [part for part in path if isinstance(part, str) and part not in ("str", "SideSpec")]
    items = [f"{ITEM_NAMES[name]} {index + 1}" for name, index in zip(path, path[1:])
             if isinstance(index, int) and name in ITEM_NAMES]
    said = ", ".join(items) + ": " if items else ""
    if first["type"] == "extra_forbidden":
        known = _fields_at(model, names[:-1])
        return f"{said}{unknown_key_message(names[-1], known)}"
    if first["type"] == "value_error":
        return f"{said}{first['ctx']['error']}"
    if first["type"] == "missing" and len(names) == 1:
        return f"missing {names[0]}"
    for name in reversed(names):
        if name in FORMS:
            return f"{said}{FORMS[name]}, got {first['input']!r}"
    return f"{said}{'.'.join(names) or 'the entry'}: {first['msg']} (got {first['input']!r})"


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    """The field names of the model found at ``path`` (through nested models and their lists)."""
    for name in path:
        field = model.model_fields.get(name)
        nested = [a for a in _types_in(field.annotation if field else None) if _is_model(a)]
        if not nested:
            break
        model = nested[0]
    return list(model.model_fields)


def _is_model(annotation: Any) -> bool:
    """Whether an annotation is a pydantic model class (``list[X]`` passes as a type on Python 3.10)."""
    try:
        return isinstance(annotation, type) and issubclass(annotation, BaseModel)
    except TypeError:
        return False


def _types_in(annotation: Any) -> list[Any]:
    """Every type inside an annotation (``list[X] | None`` -> the union, list[X], X, None)."""
    found, stack = [], [annotation]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(typing.get_args(current))
    return found
