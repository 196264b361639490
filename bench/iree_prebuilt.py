"""IREE configs built here and measured on a machine without the compiler.

A lent GPU machine has a Vulkan driver and a CPU of its own but neither
``iree-base-compiler`` (350 MB, more than a call may carry) nor a network. So the two
halves of a tune run apart:

- ``build``, here: a random sample of an ``iree-vulkan`` or ``iree-llvm-cpu`` space,
  plus IREE's own config (``auto``) and IREE's config written out as knobs, each
  compiled by the same build function a tune uses, for the device described by
  ``--vulkaninfo`` (that machine's ``vulkaninfo`` output: its GPU's SPIR-V target) or
  ``--cpuinfo`` and ``--llvm-cpu`` (its ``/proc/cpuinfo`` and LLVM's name of its CPU).
  The built modules go into one file.
- ``measure``, there (with ``iree-base-runtime``): each module timed by autosched's
  :class:`~autosched.tuner.Tuner` in its killable measurement worker (numpy reference
  first, warm-up, repeats, interleaved passes) in batches of ``--batch``, each with the
  fastest config so far timed again (its control, as a tune's batches have: what the
  replay's ``drift_free`` reads each batch's speed from), then the fastest few re-timed
  side by side with IREE's config; the records go to a SQLite database and to a records
  export that ``bench/replay.py`` replays searches on.

    python -m bench.iree_prebuilt build --op matmul --vulkaninfo gpu.txt --configs 150 -o b/
    python -m bench.iree_prebuilt build --op matmul --cpuinfo cpu.txt --llvm-cpu sapphirerapids -o c/
    python -m bench.iree_prebuilt measure b/ --db out.db --export out.jsonl.gz

Replaying the search over the sample stands in for a live tune there; every figure the
records hold was measured on the GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import pickle
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

import autosched
from autosched.measure.build import BuildResult
from autosched.records.record import OK
from autosched.space.config import Config
from autosched.space.select import make_space

OPS = ["conv2d", "conv2d-resnet", "matmul"]  # bench.iree.WORKLOADS (which needs the compiler)


def _device_from_vulkaninfo(path: str):
    from autosched.measure.cpu import host_cpu
    from autosched.measure.iree_device import device_from_info, iree_version, parse_vulkaninfo

    infos = parse_vulkaninfo(Path(path).read_text())
    if not infos:
        sys.exit(f"{path}: no device in this file; accepted: the output of `vulkaninfo`")
    gpus = [i for i in infos if "CPU" not in i.get("deviceType", "")]
    return device_from_info((gpus or infos)[0], 0, host_cpu(), iree_version())


def _cpu_from_cpuinfo(path: str, llvm_cpu: str):
    """The iree-llvm-cpu device of another machine, from its /proc/cpuinfo."""
    from autosched.measure.cpu import cpu_name, isa_of, model_id_of, parse_cpuinfo
    from autosched.measure.iree_device import cpu_device, iree_version

    text = Path(path).read_text()
    cores = sum(1 for b in text.split("\n\n") if "processor" in b)
    if not cores:
        sys.exit(f"{path}: no processor in this file; accepted: a copy of /proc/cpuinfo")
    info = parse_cpuinfo(text)
    return cpu_device(
        cpu_name(info), model_id_of(info), cores, isa_of(info),
        version=iree_version(), llvm_cpu=llvm_cpu,
    )  # fmt: skip


def _build_one(args: tuple) -> BuildResult:
    from autosched.tuner import _build_task

    return _build_task(*args)


def cmd_build(args: argparse.Namespace) -> None:
    from bench.iree import WORKLOADS

    op, params = WORKLOADS[args.op]
    wl = autosched.workload(op, **params)
    if bool(args.vulkaninfo) == bool(args.cpuinfo):
        sys.exit("give one of --vulkaninfo (iree-vulkan) and --cpuinfo (iree-llvm-cpu)")
    if args.vulkaninfo:
        dev = _device_from_vulkaninfo(args.vulkaninfo)
    else:
        dev = _cpu_from_cpuinfo(args.cpuinfo, args.llvm_cpu)
    space = make_space(wl, target=dev.target, limits=dev.limits)
    rng = np.random.default_rng(args.seed)
    configs = {c.key: c for c in [space.default(), *space.seeds()]}
    for c in space.sample(rng, args.configs):
        configs.setdefault(c.key, c)
    jobs = [(wl.to_json(), c.to_json(), dev.limits, dev.target) for c in configs.values()]
    start = time.perf_counter()
    with cf.ProcessPoolExecutor(args.jobs) as pool:
        built = list(pool.map(_build_one, jobs))
    ok = sum(b.program is not None for b in built)
    print(
        f"{args.op}: {len(built)} configs for {dev.name} ({dev.vulkan_target or dev.llvm_cpu}): "
        f"{ok} built, "
        f"{len(built) - ok} refused, {time.perf_counter() - start:.0f} s"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bundle = {
        "workload": wl.to_json(),
        "device": dataclasses.asdict(dev),
        "configs": [c.to_json() for c in configs.values()],
        "built": built,
    }
    with open(out / f"{args.op}.pkl", "wb") as f:
        pickle.dump(bundle, f)


class Prebuilt:
    """Stands in for the tuner's build pool: hands back the builds made by ``build``."""

    def __init__(self, configs: list[dict], built: list[BuildResult]) -> None:
        self.by_key = {Config.from_json(c).key: b for c, b in zip(configs, built)}

    def submit(self, workload_json, config_json, limits, target) -> cf.Future:
        fut: cf.Future = cf.Future()
        fut.set_result(self.by_key[Config.from_json(config_json).key])
        return fut

    def result(self, fut: cf.Future, timeout_s: float) -> BuildResult:
        return fut.result()

    def close(self) -> None:
        pass


def _gpu_here(expected: str) -> dict:
    """The Vulkan device IREE's runtime sees here, and the NVIDIA driver's version."""
    import subprocess

    import iree.runtime as rt

    devices = rt.get_driver("vulkan").query_available_devices()
    names = [d.get("name", "") for d in devices]
    same = [n for n in names if expected.split()[0] in n]
    if not same:
        sys.exit(f"the bundle was built for {expected!r}; this machine's Vulkan devices: {names}")
    try:
        version = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except OSError:
        version = ""
    # the bundle's (vulkaninfo's) name where the runtime's holds it, as a live tune keys it
    name = expected if any(expected in n for n in same) else same[0]
    return {"name": name, "driver_info": version}


def _cpu_here(fields: dict) -> dict:
    """This machine's CPU as the fingerprint names it; it must have the cores and the
    vector width the bundle's space was pruned for."""
    from autosched.measure.cpu import _cpuinfo, _usable_cores, cpu_model_id, cpu_name, isa_of
    from autosched.space.device import vector_bits

    info = _cpuinfo()
    isa = isa_of(info)
    cores = _usable_cores()
    if cores != fields["cores"] or vector_bits(isa) != fields["vector_bits"]:
        sys.exit(
            f"the bundle was built for {fields['cores']} cores of {fields['vector_bits']}-bit "
            f"vectors; this machine has {cores} of {vector_bits(isa)}"
        )
    name = cpu_name(info)
    return {"name": name, "cpu_name": name, "cpu_model": cpu_model_id(), "isa": isa}


def _numpy_ms(wl) -> float | None:
    """numpy (its BLAS, all cores) on the workload, for scale; None where it has none."""
    from autosched.report.vendor import VENDOR_OPS, time_vendor

    return time_vendor(wl).median_s * 1e3 if wl.op in VENDOR_OPS else None


def cmd_measure(args: argparse.Namespace) -> None:
    from autosched.measure.iree_device import IreeDevice
    from autosched.measure.runner import TimingOptions
    from autosched.ops import workload_from_json
    from autosched.records.files import export_jsonl
    from autosched.records.sqlite import SQLiteDatabase
    from autosched.tuner import Tuner
    from autosched.tuning.control import BatchControl

    db = SQLiteDatabase(args.db)
    rows = []
    for path in sorted(Path(args.bundle).glob("*.pkl")):
        with open(path, "rb") as f:
            bundle = pickle.load(f)
        fields = dict(bundle["device"], isa=tuple(bundle["device"]["isa"]))
        if fields["target"] == "iree-vulkan":
            seen = _gpu_here(fields["name"])
            fields.update(
                name=seen["name"], driver_info=seen["driver_info"] or fields["driver_info"]
            )
        else:
            fields.update(_cpu_here(fields))
        dev = IreeDevice(**fields)
        wl = workload_from_json(bundle["workload"])
        configs = [Config.from_json(c) for c in bundle["configs"]]
        pool = Prebuilt(bundle["configs"], bundle["built"])
        tuner = Tuner(
            wl, db=db, device=dev, target=dev.target, builders=pool, timeout_s=args.timeout,
            timing=TimingOptions(passes=args.passes),
        )  # fmt: skip
        start = time.perf_counter()
        records = []
        control = BatchControl()
        try:
            for i in range(0, len(configs), args.batch):
                if time.perf_counter() - start > args.deadline:
                    print(f"{path.stem}: deadline after {i} configs", flush=True)
                    break
                # The fastest config so far, timed again mid-batch as a tune's batches
                # do: configs read in several batches are what drift_free fits each
                # batch's speed from (a batch run while the host was busy elsewhere).
                sent, again = control.with_control(configs[i : i + args.batch])
                batch = tuner.measure(sent, control=again.key if again is not None else "")
                db.add(batch)
                control.scale(batch, again)
                records += [r for r in batch if again is None or r.config_key != again.key]
            ok = sorted((r for r in records if r.status == OK), key=lambda r: r.latency_s)
            default = configs[0]  # `auto`: IREE's own config
            finalists = [Config.from_json(r.config) for r in ok[: args.finalists]]
            if default.key not in {c.key for c in finalists}:
                finalists.append(default)
            final = tuner.remeasure(finalists, rounds=3)
            db.add([r for r in final if r.status == OK])
        finally:
            tuner.close()
        by_key = {r.config_key: r for r in final if r.status == OK}
        if not by_key:
            print(
                f"{path.stem}: no config ran: {dict(Counter(r.status for r in records))}; first error:"
            )
            print(next((r.error for r in records if r.error), "")[:2000], flush=True)
            continue
        best = min(by_key.values(), key=lambda r: r.latency_s)
        auto = by_key.get(default.key)
        rows.append(
            {
                "op": path.stem,
                "workload": str(wl),
                "device": dev.name,
                "driver": dev.driver_info,
                "vulkan_target": dev.vulkan_target,
                "llvm_cpu": dev.llvm_cpu,
                "cpu": dev.cpu_name,
                "cpu_model": dev.cpu_model,
                "configs": len(configs),
                "ok": len(ok),
                "statuses": dict(Counter(r.status for r in records)),
                "seconds": round(time.perf_counter() - start, 1),
                "best_ms": best.latency_s * 1e3,
                "best_gflops": best.gflops,
                "best_config": best.config,
                "default_ms": auto.latency_s * 1e3 if auto else None,
                "speedup": auto.latency_s / best.latency_s if auto else None,
                "numpy_ms": _numpy_ms(wl) if dev.type == "cpu" else None,
            }
        )
        r = rows[-1]
        print(
            f"{r['op']}: {r['ok']}/{r['configs']} ran ({r['statuses']}) in {r['seconds']} s; "
            f"best {r['best_ms']:.4f} ms ({r['best_gflops']:.0f} GFLOP/s), IREE's config "
            f"{r['default_ms'] or float('nan'):.4f} ms: {r['speedup'] or float('nan'):.2f}x",
            flush=True,
        )
    db.close()
    Path(args.summary).write_text(json.dumps(rows, indent=1))
    if args.export:  # gzip where the name ends .gz
        with SQLiteDatabase(args.db) as done:
            export_jsonl(done, args.export)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile a sample of an iree-vulkan space here")
    b.add_argument("--op", choices=OPS, required=True)
    b.add_argument("--vulkaninfo", default="", help="iree-vulkan: `vulkaninfo` output of the GPU")
    b.add_argument("--cpuinfo", default="", help="iree-llvm-cpu: /proc/cpuinfo of the CPU")
    b.add_argument(
        "--llvm-cpu", default="", help="iree-llvm-cpu: LLVM's name of that CPU (default: this one)"
    )
    b.add_argument("--configs", type=int, default=150)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--jobs", type=int, default=2)
    b.add_argument("-o", "--out", required=True)
    b.set_defaults(func=cmd_build)
    m = sub.add_parser("measure", help="time a bundle's modules on this machine's GPU")
    m.add_argument("bundle")
    m.add_argument("--db", required=True)
    m.add_argument("--export", default="")
    m.add_argument("--summary", default="iree_prebuilt.json")
    m.add_argument("--batch", type=int, default=32)
    m.add_argument("--passes", type=int, default=2)
    m.add_argument("--finalists", type=int, default=5)
    m.add_argument("--timeout", type=float, default=30.0)
    m.add_argument("--deadline", type=float, default=1e9, help="seconds of sampling per op")
    m.set_defaults(func=cmd_measure)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
