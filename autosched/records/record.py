"""The measurement record: one row of the records database.

A record is immutable, plain data and JSON-serialisable. It names everything that
changes the answer: the workload (op, shapes, dtype, epilogue), the target and the
full device fingerprint, the schedule config, and what happened when it ran.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Status of a measured candidate. "ok" means the output matched the reference and
# the timing counts; every other value is an error kind.
OK = "ok"
INVALID = "invalid"  # rejected by the space or device limits before any build
BUILD_ERROR = "build_error"  # TVM scheduling/codegen or the OpenCL compiler failed
RUN_ERROR = "run_error"  # the launch failed or the worker process crashed
TIMEOUT = "timeout"  # the candidate exceeded its time limit and its worker was killed
WRONG_RESULT = "wrong_result"  # ran, but the output does not match the reference
STATUSES = (OK, INVALID, BUILD_ERROR, RUN_ERROR, TIMEOUT, WRONG_RESULT)

FORMAT_VERSION = 1

# Fields added after format version 1, with the value that means "not kept".
_OPTIONAL_UNSET: dict[str, object] = {
    "started_at": None,
    "ended_at": None,
    "worker": "",
    "rounds": 0,
}


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the text that keys are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Record:
    """One measurement of one config of one workload on one device.

    Attributes:
        workload_key: stable key of the workload (``Workload.key``).
        workload: the workload as plain data (``Workload.to_json()``).
        target: code generation target, ``"opencl"`` or ``"llvm"``.
        device_key: hash of the full device fingerprint (exact match).
        device_family: hash of target + platform + device name, without versions;
            records of the same hardware with another driver share it.
        device: the full fingerprint as plain data.
        config_key: stable key of the config (``Config.key``).
        config: the config as plain data (knob name -> value).
        status: ``"ok"`` or an error kind, one of :data:`STATUSES`.
        error: the error message; empty when ``status == "ok"``.
        latencies: every timed repeat, seconds (empty unless ok).
        latency_s: median of ``latencies`` (None unless ok).
        spread: inter-quartile range of ``latencies`` divided by the median.
        gflops: useful floating point work / latency_s / 1e9 (None unless ok).
        timestamp: UNIX time of the measurement.
        run_id: identifies the tuning run that produced the record.
        started_at: UNIX time the measurement started (None when not kept).
        ended_at: UNIX time the measurement ended (None when not kept).
        worker: who measured it, e.g. ``host:pid`` or a farm worker's name ("" when
            not kept).
        rounds: 0 for a search reading; for a re-measurement side by side (the finalists
            at the end of a run, :meth:`autosched.tuner.Tuner.remeasure`), the number of
            interleaved rounds it pooled. The records of one such round share
            ``run_id`` and ``started_at``, and their figures are comparable with each
            other as search readings taken minutes apart are not
            (:mod:`autosched.records.choice`).
        id: database row id; None until stored.
    """

    workload_key: str
    workload: dict[str, Any]
    target: str
    device_key: str
    device_family: str
    device: dict[str, Any]
    config_key: str
    config: dict[str, Any]
    status: str
    error: str = ""
    latencies: tuple[float, ...] = ()
    latency_s: float | None = None
    spread: float | None = None
    gflops: float | None = None
    timestamp: float = 0.0
    run_id: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    worker: str = ""
    rounds: int = 0
    id: int | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def op(self) -> str:
        return str(self.workload["op"])

    def scaled(self, ratio: float) -> Record:
        """This record as if its machine had run ``ratio`` times faster: latencies divided
        by ``ratio``, throughput multiplied. A failed record, or a ratio of 1, is returned
        as it is."""
        if ratio == 1.0 or not self.ok or not self.latency_s:
            return self
        return replace(
            self,
            latencies=tuple(x / ratio for x in self.latencies),
            latency_s=self.latency_s / ratio,
            gflops=self.gflops * ratio if self.gflops else self.gflops,
        )

    def to_json(self) -> dict[str, Any]:
        """Plain data for JSON Lines export (includes the format version)."""
        data = asdict(self)
        data["latencies"] = list(self.latencies)
        # Unset optional fields stay out, so records without them export as before and
        # older autosched versions still import them.
        for name, unset in _OPTIONAL_UNSET.items():
            if data[name] == unset:
                del data[name]
        data["format_version"] = FORMAT_VERSION
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """Inverse of :meth:`to_json`; raises KeyError/TypeError/ValueError on bad data."""
        data = dict(data)
        version = data.pop("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"format_version {version!r} is not supported (expected {FORMAT_VERSION})"
            )
        data["latencies"] = tuple(float(x) for x in data.get("latencies", ()))
        if data.get("status") not in STATUSES:
            raise ValueError(f"status {data.get('status')!r} is not one of {', '.join(STATUSES)}")
        return cls(**data)


def device_label(device: dict[str, Any], default: str = "") -> str:
    """A fingerprint's device name, with the CPU's model where it holds one that the name
    does not already say (an llvm CPU's ``model_id``, an OpenCL CPU's ``host_cpu``), e.g.
    ``AMD EPYC (family 26 model 2)``: a cloud VM names a Zen 4 and a Zen 5 both
    ``AMD EPYC``."""
    name = str(device.get("name") or device.get("device") or default)
    model = str(device.get("model_id") or device.get("host_cpu") or "")
    for vendor in ("AuthenticAMD ", "GenuineIntel "):  # the name says whose it is
        model = model.removeprefix(vendor)
    return f"{name} ({model})" if model and model not in name else name
