"""The format of ``benchmarks/<paper>/claims.yaml``, declared: pydantic models of what the file may
hold (``extra="forbid"``: a misspelt key is refused with a did-you-mean, not ignored), and
pydantic's refusals said in the file's own words, one line each. Torch-free and beside
``suite_format``; the leaderboard's ``claims.spec`` builds the ledger's claims from the validated
models (inherited benchmarks and quantities, the checks that need the whole claim)."""

from __future__ import annotations

import dataclasses
import datetime
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

from fl_lightning.records.errors import first_refusal


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
    """The first of pydantic's refusals in the file's words: where in the entry (the items of its
    lists by name and number), and what to write."""
    found = first_refusal(error, model)
    loc = found.loc
    named = [i for i in range(1, len(loc)) if isinstance(loc[i], int) and loc[i - 1] in ITEM_NAMES]
    said = ", ".join(f"{ITEM_NAMES[str(loc[i - 1])]} {int(loc[i]) + 1}" for i in named) + ": " if named else ""
    inside = dataclasses.replace(found, loc=loc[named[-1] + 1:] if named else loc)  # where in the innermost item
    a_key_missing = found.kind == "missing" and len(loc) == 1  # a claim's own key; inside an item: its form
    if found.kind != "extra_forbidden" and not found.own_text and not a_key_missing:
        form = next((FORMS[name] for name in reversed(loc) if isinstance(name, str) and name in FORMS), None)
        if form is not None:
            return f"{said}{form}, got {found.value!r}"
    return f"{said}{inside}"
