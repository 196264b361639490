"""A tuning job as plain data: which workloads, on which targets, how many trials each.

A job file (TOML) and a whole model (its fused functions) both produce a :class:`Job`;
the task scheduler and the runners only ever see this data. Everything is checked
before anything runs: an unknown key, op or target, a bad shape or a bad value ends in
one :class:`~autosched.errors.InvalidInputError` naming the file, the line and the key.

A job file::

    name = "night"           # required
    trials = 64              # per task and target (default 64)
    strategy = "model"       # model | random | tpe
    seed = 0
    batch = 16               # configs per batch (one batch in flight per device)
    timeout = 30             # seconds per candidate before its kernel is killed
    policy = "fair"          # fair | gradient: which task gets the next free device

    [[tasks]]
    op = "matmul"
    shape = "512,512,512"    # as `autosched tune --shape` takes it
    epilogue = "bias_relu"   # optional, as --epilogue
    targets = ["opencl", "llvm"]
    trials = 128             # optional: overrides the job's
    weight = 1               # optional: how often the model runs it (gradient policy)

A task may instead give ``workload``: a workload's JSON (``Workload.to_json()``) as a
string, in place of ``op``, ``shape`` and ``epilogue``; ``autosched model tasks --job``
writes a model's fused functions this way.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autosched.errors import InvalidInputError
from autosched.ops import OPS, Workload, workload
from autosched.ops.shape import parse_shape
from autosched.search import STRATEGIES
from autosched.space.space import ALL_TARGETS

POLICIES = ("fair", "gradient")

_JOB_KEYS = {
    "name": "a non-empty string",
    "trials": "an integer >= 1",
    "strategy": f"one of {', '.join(STRATEGIES)}",
    "seed": "an integer",
    "batch": "an integer >= 1",
    "timeout": "a number of seconds > 0",
    "policy": f"one of {', '.join(POLICIES)}",
    "tasks": "an array of [[tasks]] tables",
}
_TASK_KEYS = {
    "op": f"one of {', '.join(OPS)}",
    "shape": "the op's parameters as `autosched tune --shape` takes them",
    "epilogue": "as `autosched tune --epilogue` takes it",
    "targets": f"a list of {', '.join(ALL_TARGETS)}",
    "trials": "an integer >= 1",
    "weight": "a number > 0",
    "name": "a non-empty string",
    "workload": "a workload's JSON as a string (in place of op and shape)",
}


@dataclass(frozen=True)
class Task:
    """One workload on one target: the unit the task scheduler hands batches to."""

    name: str
    workload: Workload
    target: str
    trials: int
    weight: float = 1.0

    @property
    def key(self) -> str:
        return f"{self.workload.key}@{self.target}"


@dataclass(frozen=True)
class Job:
    name: str
    tasks: tuple[Task, ...]
    strategy: str = "model"
    seed: int = 0
    batch: int = 16
    timeout_s: float = 30.0
    policy: str = "fair"
    source: str = field(default="", compare=False)

    def targets(self) -> list[str]:
        return sorted({t.target for t in self.tasks})


def load_job(path: str | Path) -> Job:
    """Read and check a job file; nothing runs before this returns."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInputError(f"cannot read job file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInputError(f"{path}: not valid TOML: {exc}") from None
    return job_from_dict(data, source=str(path), text=text)


def job_from_dict(data: Mapping[str, Any], *, source: str = "<job>", text: str = "") -> Job:
    """Check ``data`` (a parsed job file, or one a model produced) and build the job.

    ``text``, the file's source when there is one, lets messages name the line.
    """
    where = _Locator(source, text)
    _unknown_keys(data, _JOB_KEYS, where, table=None)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise where.error(None, "name", name, _JOB_KEYS["name"])
    trials = _int(data, "trials", 64, 1, where, None)
    seed = _int(data, "seed", 0, None, where, None)
    batch = _int(data, "batch", 16, 1, where, None)
    strategy = data.get("strategy", "model")
    if strategy not in STRATEGIES:
        raise where.error(None, "strategy", strategy, _JOB_KEYS["strategy"])
    policy = data.get("policy", "fair")
    if policy not in POLICIES:
        raise where.error(None, "policy", policy, _JOB_KEYS["policy"])
    timeout = data.get("timeout", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise where.error(None, "timeout", timeout, _JOB_KEYS["timeout"])
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, Sequence) or isinstance(raw_tasks, str) or not raw_tasks:
        raise where.error(None, "tasks", raw_tasks, _JOB_KEYS["tasks"] + ", at least one")
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_tasks):
        if not isinstance(raw, Mapping):
            raise where.error(i, "tasks", raw, "a table of " + ", ".join(_TASK_KEYS))
        for task in _tasks_of(raw, i, trials, where):
            if task.key in seen:
                raise where.error(
                    i, "shape", raw.get("shape"),
                    f"a workload and target not already in tasks[{seen[task.key]}]",
                )  # fmt: skip
            seen[task.key] = i
            tasks.append(task)
    return Job(
        name=name.strip(),
        tasks=tuple(tasks),
        strategy=strategy,
        seed=seed,
        batch=batch,
        timeout_s=float(timeout),
        policy=policy,
        source=source,
    )


def _tasks_of(raw: Mapping[str, Any], i: int, trials: int, where: _Locator) -> list[Task]:
    _unknown_keys(raw, _TASK_KEYS, where, table=i)
    if "workload" in raw:
        return _workload_tasks(raw, i, trials, where)
    op = raw.get("op")
    if op not in OPS:
        raise where.error(i, "op", op, _TASK_KEYS["op"])
    shape = raw.get("shape")
    if not isinstance(shape, str):
        raise where.error(i, "shape", shape, "a string, e.g. " + repr(OPS[op].example))
    try:
        params = parse_shape(op, shape)
    except InvalidInputError as exc:
        raise where.error(i, "shape", shape, str(exc)) from None
    epilogue = raw.get("epilogue")
    if epilogue is not None:
        if "epilogue" not in OPS[op].shape_params:
            takers = [o for o, cls in OPS.items() if "epilogue" in cls.shape_params]
            raise where.error(i, "epilogue", epilogue, f"only for {', '.join(takers)}")
        if params.setdefault("epilogue", epilogue) != epilogue:
            raise where.error(
                i, "epilogue", epilogue, f"the same as epilogue={params['epilogue']} in shape"
            )
    try:
        wl = workload(op, **params)
    except InvalidInputError as exc:
        key = "epilogue" if epilogue is not None and "epilogue" in str(exc) else "shape"
        raise where.error(i, key, raw.get(key), str(exc)) from None
    return _targets_and_rest(raw, i, trials, where, wl, f"{op} {shape}".strip())


def _workload_tasks(raw: Mapping[str, Any], i: int, trials: int, where: _Locator) -> list[Task]:
    """A task given as a workload's JSON (a model's fused function)."""
    import json

    from autosched.ops import workload_from_json

    for key in ("op", "shape", "epilogue"):
        if key in raw:
            raise where.error(i, key, raw[key], "not together with workload")
    text = raw["workload"]
    try:
        data = json.loads(text) if isinstance(text, str) else None
        wl = workload_from_json(data) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError, InvalidInputError):
        wl = None
    if wl is None:
        raise where.error(i, "workload", str(text)[:60], _TASK_KEYS["workload"])
    return _targets_and_rest(raw, i, trials, where, wl, wl.op)


def _targets_and_rest(
    raw: Mapping[str, Any], i: int, trials: int, where: _Locator, wl: Workload, default_name: str
) -> list[Task]:
    targets = raw.get("targets", ["opencl"])
    if isinstance(targets, str):
        targets = [targets]
    if (
        not isinstance(targets, Sequence)
        or not targets
        or any(t not in ALL_TARGETS for t in targets)
        or len(set(targets)) != len(targets)
    ):
        raise where.error(i, "targets", targets, _TASK_KEYS["targets"] + ", each once")
    task_trials = _int(raw, "trials", trials, 1, where, i)
    weight = raw.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
        raise where.error(i, "weight", weight, _TASK_KEYS["weight"])
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise where.error(i, "name", name, _TASK_KEYS["name"])
    label = name.strip()
    return [
        Task(name=label, workload=wl, target=t, trials=task_trials, weight=float(weight))
        for t in targets
    ]


def _int(
    data: Mapping[str, Any], key: str, default: int, low: int | None, where: _Locator,
    table: int | None,
) -> int:  # fmt: skip
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        keys = _TASK_KEYS if table is not None else _JOB_KEYS
        raise where.error(table, key, value, keys[key])
    return value


def _unknown_keys(
    data: Mapping[str, Any], accepted: Mapping[str, str], where: _Locator, table: int | None
) -> None:
    for key in data:
        if key not in accepted:
            raise InvalidInputError(
                f"{where.place(table, key)}: unknown key {key!r}; accepted: {', '.join(accepted)}"
            )


class _Locator:
    """Names the place of a key: ``night.toml:12: tasks[1].shape``.

    tomllib keeps no positions, so the line is found again in the text: the first
    assignment of the key after the table's header (the n-th ``[[tasks]]``).
    """

    _HEADER = re.compile(r"^\s*\[\[\s*tasks\s*\]\]")

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.lines = text.splitlines()

    def line(self, table: int | None, key: str) -> int | None:
        assign = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\")\s*=")
        count = -1
        for no, line in enumerate(self.lines, 1):
            if self._HEADER.match(line):
                count += 1
                if table is not None and count == table and key == "tasks":
                    return no
                continue
            if re.match(r"^\s*\[", line) and table is None:
                break
            if count == (-1 if table is None else table) and assign.match(line):
                return no
            if table is not None and count > table:
                break
        return None

    def place(self, table: int | None, key: str) -> str:
        no = self.line(table, key) if self.lines else None
        where = f"{self.source}:{no}" if no else self.source
        return f"{where}: {key}" if table is None else f"{where}: tasks[{table}].{key}"

    def error(self, table: int | None, key: str, value: Any, accepted: str) -> InvalidInputError:
        return InvalidInputError(f"{self.place(table, key)} = {value!r} is not valid; {accepted}")
