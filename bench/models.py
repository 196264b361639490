"""Benchmark: end-to-end latency of whole models, batch 1, on the host CPU.

    flock /tmp/autosched-cpu.lock python bench/models.py --model resnet18|bert|gpt2|vit|all

Models (autosched/models/zoo.py, random weights, seed 0): a hand-written ResNet-18
(1x3x224x224), a BERT-base encoder layer (seq 128) and a GPT-2 decoder block with a
causal mask (seq 128), written out, and a ViT-S/16 of PyTorch's own modules
(``nn.TransformerEncoder``, 1x3x224x224). Each is imported with
``autosched.models.load_model`` (the ``zoo.py:factory`` path, torch.export -> Relax) and
run by:

- TVM untuned: ``tvm.compile`` of the imported module for this CPU, no records;
- autosched / MetaSchedule after N trials per task: the ``TUNED`` hooks below, each a
  function that tunes the model and returns a built Relax executable
  (bench/models_autosched.py, always; bench/models_ms.py with ``--metaschedule``);
- onnxruntime (the module exported to ONNX) and torch eager: ``Model.runtimes``.

Every runner's outputs are checked against torch eager before its timings count (with
``--via onnx`` the factory's module is exported with ``torch.onnx.export`` and imported
from that file, and the reference is onnxruntime on it). The
runners are timed in interleaved rounds (the machine is shared: figures from one window
are compared), all on the same number of threads, by default every usable core (``--threads``):
TVM_NUM_THREADS is set before TVM is imported (its runtime otherwise takes half the
logical CPUs), torch and onnxruntime get the same count. Prints a table and writes bench/results/models.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autosched.models import Model, load_model  # noqa: E402
from autosched.models.latency import (  # noqa: E402
    Runner,
    max_error,
    time_rounds,
    tvm_runner,
)

log = logging.getLogger("bench.models")

USABLE_CORES = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
)
THREADS = USABLE_CORES  # what every runner uses; main() sets it (and TVM's) from --threads

ZOO = ROOT / "autosched" / "models" / "zoo.py"
# --model name -> (zoo factory at benchmark size, zoo factory of a tiny version for --tiny)
MODELS = {
    "resnet18": ("resnet18", "tiny_resnet18"),
    "bert": ("bert_layer", "tiny_bert_layer"),
    "gpt2": ("gpt2_block", "tiny_gpt2_block"),
    "vit": ("vit", "tiny_vit"),
    "lstm": ("lstm", "tiny_lstm"),
}
TRIALS = (16, 32, 64)


class TunedBuild(Protocol):
    """Tune ``model`` with ``trials_per_task`` more trials for each of its tasks, resuming
    from what ``work_dir`` holds (bench_model calls it once per budget, same folder).

    Returns the Relax executable built with the tuned schedules (what ``tvm.compile``
    returns) and the tuning wall time in seconds: ``autosched.tvm.build`` after
    ``tune_tasks`` (autosched), ``tune_relax`` with the same total trials applied with
    ``MetaScheduleApplyDatabase`` (MetaSchedule).
    """

    def __call__(
        self, model: Model, *, trials_per_task: int, work_dir: Path
    ) -> tuple[Any, float]: ...


# The hook points: None leaves the column empty (and says so in the JSON).
TUNED: dict[str, TunedBuild | None] = {"autosched": None, "metaschedule": None}
NOT_RUN = {"metaschedule": "not run in this run: --metaschedule fills this column"}


def onnxruntime_runner(path: Path, inputs: Sequence[np.ndarray]) -> Runner:
    """``path`` in onnxruntime on :data:`THREADS` threads; ``inputs`` in the model's order."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    # zoo.export_onnx names the inputs input0, input1, ... in the module's order.
    feed = {f"input{i}": a for i, a in enumerate(inputs)}
    return lambda: [np.asarray(o) for o in session.run(None, feed)]


def bench_model(
    key: str,
    *,
    tiny: bool,
    rounds: int,
    round_s: float,
    tolerance: float,
    trials: tuple[int, ...],
    via: str = "torch",
) -> dict:
    import tvm

    from autosched.measure.cpu import host_cpu
    from autosched.models import zoo

    factory = MODELS[key][1 if tiny else 0]
    module, example = getattr(zoo, factory)()
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as folder:
        t0 = time.perf_counter()
        if via == "onnx":  # the file torch.onnx.export writes, through the ONNX frontend
            model = load_model(str(zoo.export_onnx(module, example, Path(folder) / "m.onnx")))
        else:
            model = load_model(f"{ZOO}:{factory}")
        import_s = time.perf_counter() - t0
    arrays = model.example_inputs(np.random.default_rng(0))
    expected = model.reference(arrays)

    runners: dict[str, Runner] = {}
    errors: dict[str, float] = {}
    notes: dict[str, str] = {}
    build_s: dict[str, float] = {}

    def add(name: str, run: Runner) -> None:
        err = max_error(run(), expected)
        errors[name] = err
        if err <= tolerance:
            runners[name] = run
        else:
            notes[name] = (
                f"outputs differ from torch eager (max relative error {err:.2e}): not timed"
            )
            log.warning("%s %s: %s", key, name, notes[name])

    target = tvm.target.Target(host_cpu().tvm_target())
    t0 = time.perf_counter()
    executable = tvm.compile(model.mod, target=target)
    build_s["tvm_untuned"] = time.perf_counter() - t0
    add("tvm_untuned", tvm_runner(executable, model, arrays))

    # The model's own runtimes (Model.runtimes, as `autosched model tune` times them):
    # onnxruntime on the module exported to ONNX, and torch eager.
    for name, runtime in model.runtimes(THREADS).items():
        add(
            "torch_eager" if name == "torch" else name,
            lambda runtime=runtime: list(runtime(arrays)),
        )

    tuned: dict[str, dict] = {}
    for tuner, hook in TUNED.items():
        if hook is None:
            for n in trials:
                tuned[f"{tuner}@{n}"] = {"status": NOT_RUN.get(tuner, "not run")}
            continue
        # One run per tuner, built at each budget: every step resumes from what the
        # work folder holds and adds the trials up to the next budget, as a user who
        # tunes further overnight does. The wall time of a budget counts every step.
        done, wall = 0, 0.0
        with tempfile.TemporaryDirectory(prefix=f"bench-{tuner}-") as work:
            for n in sorted(trials):
                built, tune_s = hook(model, trials_per_task=n - done, work_dir=Path(work))
                done, wall = n, wall + tune_s
                name = f"{tuner}@{n}"
                tuned[name] = {"status": "tuned", "tuning_wall_s": wall, "trials_per_task": n}
                add(name, tvm_runner(built, model, arrays))

    timings = time_rounds(runners, rounds=rounds, round_s=round_s)
    rows = {}
    for name in ["tvm_untuned", *tuned, "onnxruntime", "torch_eager"]:
        row: dict[str, Any] = dict(tuned.get(name, {}))
        if name in errors:
            row["max_rel_error"] = errors[name]
        if name in timings:
            row.update(vars(timings[name]))
        if name in notes:
            row["note"] = notes[name]
        if name in build_s:
            row["build_s"] = build_s[name]
        rows[name] = row
    return {
        "model": key if via == "torch" else f"{key}-{via}",
        "factory": f"autosched/models/zoo.py:{factory}",
        "import": via,
        "inputs": {spec.name: list(spec.shape) for spec in model.inputs},
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "import_s": import_s,
        "rows": rows,
    }


def merge_results(old: dict, new: dict) -> dict:
    """``new`` with the entries of ``old`` for models it did not run; each kept entry
    carries the date, machine and versions of the run that measured it."""
    ran = {r["model"] for r in new["results"]}
    kept = []
    for r in old.get("results", []):
        if r["model"] not in ran:
            for key in ("date", "machine", "versions", "tiny"):
                r.setdefault(key, old.get(key))
            kept.append(r)
    return {**new, "results": kept + new["results"]}


def _fmt(row: dict, key: str, spec: str) -> str:
    return format(row[key], spec) if key in row else "-"


def print_table(results: list[dict]) -> None:
    print(
        f"\n{'model':<9} {'runner':<16} {'median ms':>10} {'min ms':>9} {'spread':>7} {'n':>4} {'rel err':>8}  note"
    )
    for res in results:
        for name, row in res["rows"].items():
            note = row.get("note") or row.get("status", "")
            if "build_s" in row:
                note = f"build {row['build_s']:.1f} s"
            if "tuning_wall_s" in row:
                note = f"tuning {row['tuning_wall_s']:.0f} s"
            print(
                f"{res['model']:<9} {name:<16} {_fmt(row, 'median_ms', '10.2f')} {_fmt(row, 'min_ms', '9.2f')} "
                f"{_fmt(row, 'spread', '7.2f')} {_fmt(row, 'samples', '4d')} {_fmt(row, 'max_rel_error', '8.1e')}  {note}"
            )


def main(
    argv: list[str] | None = None, *, tuned: Mapping[str, TunedBuild | None] | None = None
) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all", choices=[*MODELS, "all"])
    parser.add_argument("--tiny", action="store_true", help="the tiny test sizes (a smoke run)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--round-s", type=float, default=1.0, help="seconds per runner per round")
    parser.add_argument(
        "--trials", default=",".join(map(str, TRIALS)), help="trials per task of the tuned columns"
    )
    parser.add_argument(
        "--tolerance", type=float, default=1e-3, help="max relative error that counts"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "models.json"))
    parser.add_argument(
        "--threads",
        type=int,
        default=USABLE_CORES,
        help="threads of every runner (default: the usable cores)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the other models' entries of an existing --out (one model per run)",
    )
    parser.add_argument(
        "--via",
        choices=("torch", "onnx"),
        default="torch",
        help="import the factory through torch.export (default) or as the ONNX file "
        "torch.onnx.export writes (its reference then onnxruntime)",
    )
    parser.add_argument(
        "--metaschedule",
        action="store_true",
        help="fill the MetaSchedule columns (bench/models_ms.py)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    global THREADS
    THREADS = args.threads
    if "tvm" in sys.modules:
        log.warning("TVM was imported before TVM_NUM_THREADS was set: its runtime may ignore it")
    # TVM's thread pool reads this once, on import; unset, it takes half the logical CPUs.
    os.environ["TVM_NUM_THREADS"] = str(THREADS)
    from bench.models_autosched import autosched_build

    TUNED["autosched"] = autosched_build
    if args.metaschedule:
        from bench.models_ms import metaschedule_build

        TUNED["metaschedule"] = metaschedule_build
    if tuned is not None:
        TUNED.update(tuned)
    trials = tuple(int(t) for t in args.trials.split(",") if t)

    from autosched.measure.cpu import host_cpu

    keys = list(MODELS) if args.model == "all" else [args.model]
    results = []
    for key in keys:
        log.info("%s ...", key)
        results.append(
            bench_model(
                key,
                tiny=args.tiny,
                rounds=args.rounds,
                round_s=args.round_s,
                tolerance=args.tolerance,
                trials=trials,
                via=args.via,
            )
        )
    print_table(results)
    cpu = host_cpu()
    import onnxruntime
    import torch
    import tvm

    out = {
        "benchmark": "models",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpu": cpu.name,
            "mcpu": cpu.mcpu,
            "model": cpu.model_id,
            "isa": list(cpu.isa),
            "usable_cores": USABLE_CORES,
            "threads": {
                "tvm": int(os.environ["TVM_NUM_THREADS"]),
                "torch": THREADS,
                "onnxruntime": THREADS,
            },
            "load_average": os.getloadavg(),
        },
        "versions": {
            "tvm": tvm.__version__,
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "timing": {
            "rounds": args.rounds,
            "round_s": args.round_s,
            "figures": "batch 1; median and min of the pooled interleaved samples in ms; spread = IQR / median",
            "checked": f"outputs within {args.tolerance} relative error of torch eager before timing",
        },
        "tiny": args.tiny,
        "results": results,
    }
    if args.update and Path(args.out).exists():
        out = merge_results(json.loads(Path(args.out).read_text()), out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
