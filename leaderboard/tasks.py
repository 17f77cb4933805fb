"""What a run was asked to solve (its *task*), so that only runs of one task are ranked together.

``fl-lightning fit`` tags every run with ``task`` (canonical JSON of everything that defines the
task: data source, partition and its resolved parameters, clients, participation, model, rounds,
local epochs, batch size, test mode and fraction, dropout, attack) and ``task_key`` (a digest of
it). Runs logged before those tags existed get a task rebuilt from their MLflow params (the same
settings, as logged), marked as such; it never equals a tagged task, so the two never mix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.vocabulary import Tag

# field -> label on the page, in the order the page lists them (unknown fields follow, sorted)
TASK_LABELS = {
    schema.SOURCE: "data source",
    schema.SOURCE_PARAMS: "source parameters",
    schema.PARTITION: "partition",
    schema.PARTITION_PARAMS: "partition parameters",
    schema.NUM_CLIENTS: "clients",
    schema.FRACTION: "fraction sampled per round",
    schema.MODEL: "model",
    schema.NUM_ROUNDS: "rounds",
    schema.LOCAL_EPOCHS: "local epochs",
    schema.BATCH_SIZE: "batch size",
    schema.TEST_MODE: "test mode",
    schema.TEST_FRACTION: "test fraction",
    schema.LOCAL_TEST_FRACTION: "local test fraction",
    schema.GLOBAL_TEST_FRACTION: "global test fraction",
    schema.DROPOUT_PROB: "dropout probability",
    schema.ATTACK: "attack",
    schema.ATTACK_CLIENT: "attacking client",
    schema.ATTACK_STRENGTH: "attack strength",
    Tag.LEDGER_PASS: "ledger pass",
}
# MLflow params (as LightningCLI logs them) that define the task of an untagged run
PARAM_FIELDS = (schema.SOURCE, schema.SOURCE_PARAMS, schema.PARTITION, schema.PARTITION_PARAMS, schema.NUM_CLIENTS,
                schema.FRACTION, schema.BACKBONE, schema.NUM_ROUNDS, schema.LOCAL_EPOCHS, schema.BATCH_SIZE,
                schema.TEST_MODE, schema.LOCAL_TEST_FRACTION, schema.GLOBAL_TEST_FRACTION, schema.DROPOUT_PROB,
                schema.ATTACK, *schema.ATTACK_FIELDS)
NESTED_PARAMS = (schema.SOURCE_PARAMS, schema.PARTITION_PARAMS)  # logged flat: partition_params/alpha, ...
NO_VALUE = ("", "None", "null", "none")

TAGGED, FROM_PARAMS, UNRECORDED = "tag", "params", "unrecorded"
SOURCE_TEXT = {
    TAGGED: "the runs' task tag",
    FROM_PARAMS: "rebuilt from the runs' MLflow params (runs logged before the task tag existed)",
    UNRECORDED: "not recorded (no task tag, no task params): grouped by benchmark name only",
}


@dataclass(frozen=True)
class Task:
    """A task: its fields, the key that identifies it, and where they were read from."""

    key: str
    source: str  # TAGGED, FROM_PARAMS or UNRECORDED
    fields: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def identity(self) -> tuple[str, str]:
        return (self.source, self.key)


def canonical_json(fields: Mapping[str, object]) -> str:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


def digest(fields: Mapping[str, object]) -> str:
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:12]


def _parse_value(text: str) -> object:
    """A logged param back to a value: JSON where it parses ("10" -> 10), else the text."""
    if text in NO_VALUE:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def fields_from_params(params: Mapping[str, str]) -> dict[str, object]:
    """The task fields of an untagged run, from its params (the test fraction that applies only,
    the attack's client and strength only when there is an attack)."""
    fields: dict[str, object] = {}
    for name in PARAM_FIELDS:
        if name in params:
            fields[schema.MODEL if name == schema.BACKBONE else name] = _parse_value(params[name])
    for prefix in NESTED_PARAMS:
        nested = {k.split("/", 1)[1]: _parse_value(v) for k, v in params.items() if k.startswith(prefix + "/")}
        if nested:
            logged_whole = fields.get(prefix)
            fields[prefix] = {**(logged_whole if isinstance(logged_whole, dict) else {}), **nested}
    global_test = fields.get(schema.TEST_MODE) == schema.GLOBAL_TEST_MODE
    fields.pop(schema.LOCAL_TEST_FRACTION if global_test else schema.GLOBAL_TEST_FRACTION, None)
    if fields.get(schema.ATTACK) is None:
        for name in (schema.ATTACK, *schema.ATTACK_FIELDS):
            fields.pop(name, None)
    return fields


def task_of(tags: Mapping[str, str], params: Mapping[str, str]) -> Task:
    """The run's task: from its ``task`` tag, else from its params, else unrecorded; a run of the
    ledger's confirmatory pass (``ledger_pass`` tag) has a task of its own, so that a table never
    mixes the pass's fresh seeds with the exploratory runs of the same settings."""
    task = _recorded_task(tags, params)
    ledger_pass = tags.get(Tag.LEDGER_PASS)
    if not ledger_pass:
        return task
    return Task(digest({"task": task.key, Tag.LEDGER_PASS: ledger_pass}), task.source,
                {**task.fields, Tag.LEDGER_PASS: ledger_pass})


def _recorded_task(tags: Mapping[str, str], params: Mapping[str, str]) -> Task:
    text = tags.get(Tag.TASK)
    if text:
        try:
            fields = json.loads(text)
        except ValueError:
            fields = {"task tag (not JSON)": text}
        if not isinstance(fields, dict):
            fields = {"task tag": fields}
        return Task(tags.get(Tag.TASK_KEY) or digest(fields), TAGGED, fields)
    fields = fields_from_params(params)
    if fields:
        return Task(digest(fields), FROM_PARAMS, fields)
    return Task("unknown", UNRECORDED, {})


def format_value(value: object) -> str:
    """A task value as a reader wants it: ``alpha=0.5, min_size=10``; ``none``; ``[[3], [5]]``."""
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_value(v)}" for k, v in sorted(value.items())) or "{}"
    if isinstance(value, (list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def ordered_fields(fields: Mapping[str, object]) -> list[str]:
    known = [name for name in TASK_LABELS if name in fields]
    return known + sorted(set(fields) - set(known))


def fresh_test_samples(fields: Mapping[str, object]) -> object | None:
    """``source_params.test_per_client``: each client is tested on that many fresh samples of its
    own distribution (a Synthetic source), not on a fraction of its data; None when not set."""
    params = fields.get(schema.SOURCE_PARAMS)
    value = params.get("test_per_client") if isinstance(params, Mapping) else None
    return None if value in (None, 0) else value


def task_lines(task: Task) -> list[tuple[str, str]]:
    """(label, value) of every field of the task, in reading order. Where the source draws each
    client's test set fresh (``test_per_client``), the local test fraction (0: no split of the
    client's data) is replaced by what the test is."""
    fresh = fresh_test_samples(task.fields)
    lines = []
    for name in ordered_fields(task.fields):
        if fresh is not None and name == schema.LOCAL_TEST_FRACTION:
            lines.append(("local test", f"{format_value(fresh)} fresh samples of each client's own distribution "
                                        "(source parameter test_per_client)"))
            if not task.fields[name]:  # 0: no split of the client's data, nothing more to say
                continue
        lines.append((TASK_LABELS.get(name, name), format_value(task.fields[name])))
    return lines


def differences(tasks: list[Task]) -> list[str]:
    """For each task, the short text of what sets it apart from the others (``rounds 20``);
    empty texts when there is only one task."""
    if len(tasks) < 2:
        return [""] * len(tasks)
    names = ordered_fields({name: None for task in tasks for name in task.fields})
    varying = [name for name in names
               if len({canonical_json({"v": task.fields.get(name, "not set")}) for task in tasks}) > 1]
    texts = []
    for task in tasks:
        parts = [f"{TASK_LABELS.get(name, name)} {format_value(task.fields.get(name, 'not set'))}"
                 for name in varying]
        if len({t.source for t in tasks}) > 1:
            parts.append({TAGGED: "task tagged", FROM_PARAMS: "task from params (older runs)",
                          UNRECORDED: "task not recorded"}[task.source])
        texts.append(", ".join(parts) or f"task {task.key}")
    return texts
