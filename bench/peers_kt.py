"""Kernel Tuner 1.5 as a peer: the hand-written SGEMM tuned on its OpenCL backend.

Each run happens in a spawned child process: Kernel Tuner opens its own OpenCL context,
aborts on a kernel that fails verification, and has no timeout, so a child keeps all of
that away from the benchmark (and its PoCL cache in a fresh folder, as autosched's
measurement worker does). Kernel Tuner 1.5 accepts ``seed=`` but none of its
strategies reads it: they draw from Python's and numpy's global generators, so the
child seeds those.

The child gets the environment autosched's measurement child gets (on PoCL, its threads
pinned: :func:`autosched.measure.worker.pocl_pinning`), and Kernel Tuner's stopwatch
waits on each launch's event instead of polling it (on any device: the time is the
event's profile either way). Kernel Tuner times
a launch by its event's profile (start to end) while its host thread asks every
microsecond whether the launch has finished (``time.sleep(1e-6)`` in a loop, made so
power observers can sample during the kernel). On a GPU that loop costs the kernel
nothing; on PoCL it wakes up beside the kernel's own threads on the same cores, and its
readings came out 1.26-1.61x slow against the shared harness (the Zen 4 and Zen 5 of
2026-12-02/03/05, `stopwatch_ratios`). The same config of its SGEMM timed in one process
four ways, interleaved, 10 rounds (Zen 5, 2026-12-05): Kernel Tuner's loop 260-307
GFLOP/s, the same loop blocking on the event 311-378, launches queued back to back
318-377; pinned or not within the rounds' noise. Waiting on the event keeps everything
else of the loop (a launch per iteration, the event's profile, the mean of its
iterations) and leaves the search as it is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
from datetime import UTC
from typing import Any

import numpy as np

STRATEGIES = ("bayes_opt", "genetic_algorithm", "random_sample")


def _child(conn, job: dict[str, Any], env: dict[str, str]) -> None:
    workdir = tempfile.mkdtemp(prefix="bench-kt-")
    os.environ.update({**env, "POCL_CACHE_DIR": workdir, "PYOPENCL_NO_CACHE": "1"})
    # Kernel Tuner writes the sources of a failing kernel to the working directory.
    sys.path[:] = [os.path.abspath(p) for p in sys.path]
    os.chdir(workdir)
    try:
        conn.send(("ok", _tune(**job)))
    except BaseException as exc:  # report, whatever it is: the parent decides
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        conn.close()


def _tune(
    *,
    m: int,
    n: int,
    k: int,
    strategy: str,
    trials: int,
    seed: int,
    platform: int,
    device: int,
    iterations: int,
    tolerance: tuple[float, float],
    local_mem_bytes: int,
) -> dict[str, Any]:
    import random
    from datetime import datetime

    import kernel_tuner
    from kernel_tuner.backends.opencl import OpenCLFunctions

    from bench import peers_sgemm

    OpenCLFunctions.kernel_finished = _waited  # see the module docstring

    random.seed(seed)
    np.random.seed(seed)  # Kernel Tuner only draws from the global generators
    rng = np.random.default_rng([seed, 0x5EED])
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)

    def verify(answer, result_host, atol=None):
        # Kernel Tuner passes its own ``atol``; the workload's tolerance applies, as in autosched.
        return bool(np.allclose(result_host[2], answer[2], rtol=tolerance[0], atol=tolerance[1]))

    # Kernel Tuner stamps each evaluation with the wall clock; the tune's wall time is
    # read off the same clock, so that no stamp lands past it (perf_counter and the
    # wall clock drift apart by milliseconds on a VM).
    start_utc = datetime.now(UTC)
    results, env = kernel_tuner.tune_kernel(
        peers_sgemm.KERNEL_NAME,
        peers_sgemm.shaped_source(m, n, k),
        (n, m),  # NDRange dimension 0 runs along N
        [a, b, c],
        peers_sgemm.TUNE_PARAMS,
        grid_div_x=["NWG"],
        grid_div_y=["MWG"],
        block_size_names=["NDIMC", "MDIMC"],
        restrictions=peers_sgemm.restrictions(m, n, k, local_mem_bytes=local_mem_bytes),
        answer=[None, None, expected],
        verify=verify,
        lang="OpenCL",
        platform=platform,
        device=device,
        iterations=iterations,
        strategy=strategy,
        strategy_options={"max_fevals": trials},
        cache=None,
        quiet=True,
        verbose=False,
    )
    wall = (datetime.now(UTC) - start_utc).total_seconds()
    names = list(peers_sgemm.TUNE_PARAMS)
    evaluations = []
    for r in results:
        config = {name: int(r[name]) for name in names}
        t = r.get("time")
        error = r.get("__error__")
        ok = error is None and isinstance(t, (float, np.floating)) and np.isfinite(t)
        stamp = datetime.fromisoformat(r["timestamp"])
        evaluations.append(
            {
                "config": config,
                "time_ms": float(t) if ok else None,
                "times_ms": [float(x) for x in r.get("times", [])] if ok else [],
                "error": None if ok else str(error or t),
                "t": (stamp - start_utc).total_seconds(),
                "compile_ms": float(r.get("compile_time", 0.0)),
            }
        )
    return {
        "evaluations": evaluations,
        "wall_s": wall,
        "device": env.get("device_name"),
        "iterations": iterations,
    }


def _waited(self) -> bool:
    """Kernel Tuner's ``kernel_finished`` for its OpenCL backend, blocking on the launch's
    event rather than asking its status (its loop polls this every microsecond)."""
    self.event.wait()
    return True


def tune(
    *,
    m: int,
    n: int,
    k: int,
    strategy: str,
    trials: int,
    seed: int,
    platform: int,
    device: int,
    tolerance: tuple[float, float],
    local_mem_bytes: int,
    iterations: int = 7,
    timeout_s: float = 3600.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Tune the SGEMM with Kernel Tuner's ``strategy`` for ``trials`` evaluations.

    Returns the evaluations in Kernel Tuner's order (config, its own mean time, seconds
    since the start), the wall time, and the device name. ``env``: variables the child
    sets before it opens OpenCL (PoCL's pinning). Raises RuntimeError if the run fails or
    exceeds ``timeout_s``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}; accepted: {', '.join(STRATEGIES)}")
    job = dict(
        m=m,
        n=n,
        k=k,
        strategy=strategy,
        trials=trials,
        seed=seed,
        platform=platform,
        device=device,
        iterations=iterations,
        tolerance=tolerance,
        local_mem_bytes=local_mem_bytes,
    )
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, job, env or {}), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise RuntimeError(f"Kernel Tuner ({strategy}) did not finish in {timeout_s:g} s")
        status, value = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"Kernel Tuner ({strategy}) died (exit code {proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        parent.close()
    if status != "ok":
        raise RuntimeError(f"Kernel Tuner ({strategy}): {value}")
    return value
