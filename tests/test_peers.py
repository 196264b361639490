"""The peers benchmark's parts: the hand-written SGEMM, its restrictions, the metrics.

The kernel runs on the real OpenCL device through autosched's measurement worker; the
Kernel Tuner restrictions are checked against Kernel Tuner's own search-space builder.
Kernel Tuner is in the ``bench`` extra, which the test suite's install brings
(``EXTRAS=test,bench bash scripts/install.sh``): these tests use it, never skip.
"""

from __future__ import annotations

import numpy as np
import pytest

from autosched.measure.program import KernelProgram
from autosched.measure.runner import TimingOptions
from autosched.measure.worker import MeasureWorker
from autosched.ops import workload
from bench import peers_metrics, peers_retime, peers_runs, peers_sgemm, peers_summary
from tests.conftest import make_data

ONCE = TimingOptions(warmup=0, min_repeats=1, max_repeats=1, min_time_s=0.0)
LOCAL_MEM = 64 * 1024


def cfg(**kw) -> dict[str, int]:
    base = dict(MWG=8, NWG=32, KWG=16, MDIMC=1, NDIMC=1, VWM=1, VWN=16, KWI=2, SA=0, SB=0)
    base.update(kw)
    return base


# Three corners of the kernel: one work-item with wide vectors; a 2-D work-group staging
# both inputs in local memory; scalar columns with vector loads of A along K.
KERNEL_CONFIGS = {
    "one_work_item_vec16": cfg(),
    "work_group_local_staging": cfg(
        MWG=16, NWG=32, KWG=8, MDIMC=4, NDIMC=2, VWM=2, VWN=4, KWI=4, SA=1, SB=1
    ),
    "scalar_columns_vector_a": cfg(MWG=4, NWG=16, KWG=8, NDIMC=4, VWM=4, VWN=1, KWI=4, SB=1),
}


@pytest.mark.parametrize("name", list(KERNEL_CONFIGS))
def test_hand_written_sgemm_is_correct_through_autoscheds_harness(device, name):
    m, n, k = 32, 64, 48
    p = KERNEL_CONFIGS[name]
    assert not peers_sgemm.violations(
        p, m, n, k, local_mem_bytes=LOCAL_MEM, max_work_group=device.max_work_group_size
    )
    wl = workload("matmul", M=m, N=n, K=k)
    program = peers_sgemm.program(p, m, n, k)
    assert [t.name for t in program.tensors] == [t.name for t in wl.tensor_specs()]
    with MeasureWorker(device, timeout_s=60) as worker:
        out = worker.measure(program, make_data(wl), ONCE)
    assert out.status == "ok", out.error  # the runner compares with numpy before timing


def test_program_prepends_the_defines_as_kernel_tuner_does():
    p = KERNEL_CONFIGS["work_group_local_staging"]
    program = peers_sgemm.program(p, 64, 96, 32)
    assert isinstance(program, KernelProgram)
    head = program.source.splitlines()[: len(peers_sgemm.TUNE_PARAMS) + 3]
    assert head[:2] == ["#define MWG 16", "#define NWG 32"]
    assert "#define MSIZE 64" in head and "#define NSIZE 96" in head
    (launch,) = program.kernels
    assert launch.local_size == (2, 4)  # (NDIMC, MDIMC): dimension 0 runs along N
    assert launch.global_size == (96 // 32 * 2, 64 // 16 * 4)


def test_restriction_strings_and_function_agree_with_kernel_tuner():
    """Kernel Tuner's search space built from the strings is exactly the set of configs
    the kernel's own rules accept."""
    from kernel_tuner.searchspace import Searchspace

    m, n, k, max_wg = 64, 64, 32, 64
    space = Searchspace(
        peers_sgemm.TUNE_PARAMS,
        peers_sgemm.restrictions(m, n, k, local_mem_bytes=LOCAL_MEM),
        max_wg,
        block_size_names=["NDIMC", "MDIMC"],
    )
    accepted = {tuple(c) for c in space.list}
    valid = {
        tuple(c.values())
        for c in peers_sgemm.all_configs()
        if not peers_sgemm.violations(c, m, n, k, local_mem_bytes=LOCAL_MEM, max_work_group=max_wg)
    }
    assert accepted == valid
    assert 0 < len(valid) < 960_000


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(MWG=128), "divide the problem"),  # 128 rows of a 64-row matrix
        (dict(NWG=32, NDIMC=16, VWN=4), "VWN must divide"),  # 2 columns per work-item
        (dict(MDIMC=16, MWG=8), "work-items must divide"),
        (dict(KWI=4, VWM=8), "VWM must divide KWI"),
        (dict(MWG=32, NWG=32, VWN=16), "accumulators"),  # 32x32 floats per work-item
        (dict(SA=1, SB=1, MWG=64, NWG=64, KWG=32), "local memory"),  # 16 KiB over 8 KiB
        (dict(MDIMC=8, NDIMC=16, MWG=8, NWG=32, VWN=2), "work-group exceeds"),
    ],
)
def test_each_rule_rejects_its_invalid_config(change, reason):
    p = cfg(**change)
    problems = peers_sgemm.violations(p, 64, 64, 32, local_mem_bytes=8 * 1024, max_work_group=64)
    assert any(reason in msg for msg in problems), problems


def test_kernel_tuner_peer_records_every_evaluation_in_order(device):
    from autosched.measure.worker import pocl_pinning
    from bench import peers_kt

    m, n, k = 64, 64, 32
    out = peers_kt.tune(
        m=m,
        n=n,
        k=k,
        strategy="random_sample",
        trials=3,
        seed=1,
        platform=device.platform_index,
        device=device.device_index,
        tolerance=workload("matmul", M=m, N=n, K=k).tolerance(),
        local_mem_bytes=device.local_mem_bytes,
        iterations=2,
        timeout_s=120,
        env=pocl_pinning(device),
    )
    evs = out["evaluations"]
    assert len(evs) == 3
    assert all(ev["time_ms"] and ev["time_ms"] > 0 for ev in evs), evs
    times = [ev["t"] for ev in evs]
    assert times == sorted(times) and times[-1] <= out["wall_s"]
    for ev in evs:
        assert not peers_sgemm.violations(
            ev["config"],
            m,
            n,
            k,
            local_mem_bytes=device.local_mem_bytes,
            max_work_group=device.max_work_group_size,
        )


def test_kernel_tuner_s_stopwatch_waits_on_the_launch_instead_of_polling_it(device):
    """Kernel Tuner's loop asks ``kernel_finished`` until it says yes; the peer's
    replacement blocks on the launch's event, so it says yes once, with the kernel done
    and its profile (what Kernel Tuner reads) complete."""
    import pyopencl as cl

    from bench import peers_kt

    ctx = cl.Context([cl.get_platforms()[device.platform_index].get_devices()[device.device_index]])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    src = "__kernel void spin(__global float *x) { float v = x[get_global_id(0)];"
    src += " for (int i = 0; i < 200000; ++i) v = v * 0.999f + 1.0f; x[get_global_id(0)] = v; }"
    kernel = cl.Program(ctx, src).build().spin
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, size=4 * 64)
    cl.enqueue_fill_buffer(queue, buf, np.float32(0), 0, 4 * 64).wait()

    class Backend:  # what kernel_finished reads of Kernel Tuner's OpenCL backend
        event = kernel(queue, (64,), None, buf)

    assert peers_kt._waited(Backend()) is True
    status = Backend.event.get_info(cl.event_info.COMMAND_EXECUTION_STATUS)
    assert status == cl.command_execution_status.COMPLETE
    assert Backend.event.profile.end > Backend.event.profile.start


# -- metrics ------------------------------------------------------------------------------


def test_best_so_far_keeps_the_best_through_failures():
    curve = peers_metrics.best_so_far([None, 3.0, 2.0, None, 5.0, 4.0])
    assert curve == [0.0, 3.0, 3.0, 3.0, 5.0, 5.0]
    assert peers_metrics.best_so_far([]) == []


def test_best_after_n_trials_and_short_runs():
    curve = [1.0, 2.0, 2.0, 7.0]
    assert peers_metrics.best_after(curve, 2) == 2.0
    assert peers_metrics.best_after(curve, 4) == 7.0
    assert peers_metrics.best_after(curve, 64) == 7.0  # stopped early: its last figure
    assert peers_metrics.best_after([], 16) is None


def test_trials_and_wall_seconds_to_reach_a_threshold():
    curve = [1.0, 5.0, 9.5, 10.0]
    times = [0.5, 1.0, 4.0, 9.0]
    assert peers_metrics.trials_to_reach(curve, 9.5) == 3  # reaching counts, 1-based
    assert peers_metrics.trials_to_reach(curve, 0.5) == 1
    assert peers_metrics.trials_to_reach(curve, 11.0) is None
    assert peers_metrics.wall_to_reach(curve, times, 9.5) == 4.0
    assert peers_metrics.wall_to_reach(curve, times, 11.0) is None


def test_retimed_figure_is_the_best_rounds_median():
    f = peers_runs.Finalist("x", None, own_gflops=10.0, visits=[[2.0, 2.0, 9.0], [1.0, 1.0, 1.5]])
    assert f.retimed_gflops(10e9) == pytest.approx(10.0)  # round 2: median 1 s
    assert f.retimed_median_gflops(10e9) == pytest.approx(10e9 / 1.75 / 1e9)
    f.error = "wrong_result: ..."
    assert f.retimed_gflops(10e9) is None


def test_the_shared_harness_times_every_finalist_and_the_vendor_each_round(device):
    from autosched.measure.build import build
    from autosched.space.select import make_space

    wl = workload("matmul", M=64, N=96, K=48)
    space = make_space(wl, limits=device.limits)
    program = build(space, space.default())
    good = peers_runs.Finalist("default", program, 0.0)
    failed = peers_runs.Finalist("failed", program, 0.0, error="build_error: ...")
    vendor = peers_retime.Vendor(wl)
    try:
        per_round = peers_retime.retime(
            [failed, good], wl, device=device, rounds=3, vendor=vendor, timeout_s=30
        )
    finally:
        vendor.close()
    assert len(good.visits) == 3 and all(
        len(v) >= peers_retime.RETIME.min_repeats for v in good.visits
    )
    assert good.error is None and good.retimed_gflops(wl.flops()) > 0
    assert failed.visits == []  # a finalist that failed is not timed again
    assert len(per_round) == 3 and all(len(v) >= peers_retime.RETIME.min_repeats for v in per_round)


def _run(tuner, own, retimed_latency, *, seed=0):
    run = peers_runs.Run(tuner=tuner, seed=seed, target="opencl", gflops=own)
    run.times = [float(i + 1) for i in range(len(own))]
    best = max(g for g in own if g)
    run.finalists = [peers_runs.Finalist("top1", None, best, visits=[[retimed_latency]])]
    return run


def test_summary_scales_the_peers_stopwatch_and_measures_95_on_the_shared_clock():
    flops = 100e9  # GFLOP/s = 100 / latency
    runs = [
        # Kernel Tuner reads 2x slow: own best 40, re-timed 80.
        _run("kt-random_sample", [10.0, 40.0, 30.0], 100 / 80),
        # autosched: own 50 then 90 (an outlier), re-timed 78.
        _run("autosched-model", [50.0, None, 90.0], 100 / 78),
    ]
    rows, refs, ratios = peers_summary.summarize(runs, flops)
    assert refs["retimed"] == pytest.approx(80.0)
    assert ratios["kernel_tuner/opencl"] == pytest.approx(2.0)
    kt, ours = rows
    assert kt["stopwatch_scale"] == pytest.approx(2.0)
    assert ours["stopwatch_scale"] == 1.0  # timed by the shared harness already
    assert kt["trials_to_95"] == 2 and kt["wall_to_95"] == 2.0  # 40 x 2 >= 76
    assert ours["trials_to_95"] == 3
    assert kt["trials_to_95_own"] is None  # unscaled, 40 never reaches 95% of 90
    assert kt["best_at_16"] == 40.0 and ours["retimed_gflops"] == pytest.approx(78.0)
    summary = peers_summary.table(rows, vendor_gflops=100.0, trials=3)
    assert [e["tuner"] for e in summary] == ["kt-random_sample", "autosched-model"]
    assert summary[0]["of_vendor"] == pytest.approx(0.8)
    assert summary[0]["reached_95"] == "1/1"
    # Against the best on the run's own target (both opencl here: the same reference).
    assert peers_summary.add_same_target_t95(rows) == {"opencl": pytest.approx(80.0)}
    assert kt["trials_to_95_target"] == 2 and ours["trials_to_95_target"] == 3
    # Recomputed from the JSON rows alone (--resummarize), the figures are the same.
    again = [dict(r, trials_to_95=None, wall_to_95=None, stopwatch_scale=None) for r in rows]
    ratios_again, ref_again = peers_summary.rescale_rows(again)
    assert ref_again == pytest.approx(80.0)
    assert ratios_again["kernel_tuner/opencl"] == pytest.approx(2.0)
    assert [r["trials_to_95"] for r in again] == [2, 3]
    assert [r["stopwatch_scale"] for r in again] == [pytest.approx(2.0), 1.0]


def test_checkpoint_leaders_are_the_programs_the_own_curve_stands_on():
    gflops = [None, 5.0, 3.0, 7.0, 7.0, 2.0] + [1.0] * 30 + [9.0]
    # After 16 and 32 trials the curve stands on trial 4 (index 3: the first 7.0, a tie
    # keeps it); 64 is past the run.
    assert peers_metrics.checkpoint_leaders(gflops) == {16: 3, 32: 3}
    assert peers_metrics.checkpoint_leaders(gflops, (2, 5)) == {2: 1, 5: 3}
    assert peers_metrics.checkpoint_leaders([None] * 20) == {}
    assert peers_metrics.first_trials(["a", "b", "a", "c"]) == {"a": 1, "b": 2, "c": 4}


def test_finalists_add_the_checkpoints_best_and_are_judged_by_trial():
    # 40 trials: an early 50 (trial 2) and a late 100 (trial 35) by the tool's own
    # stopwatch; the re-timing says the early one is faster.
    own = [10.0, 50.0] + [20.0] * 32 + [100.0] + [30.0] * 5
    run = peers_runs.Run(tuner="kt-random_sample", seed=0, target="opencl", gflops=own)
    run.keys = [f"c{i}" for i in range(len(own))]
    ranked = [(key, g) for key, g in zip(run.keys, own)]
    picks = peers_runs._picks(run, ranked, 1)
    # The top one, then the best at 16 and 32, with the checkpoints each led.
    assert picks == [("c34", 100.0, []), ("c1", 50.0, [16, 32])]
    # re@N is the re-timed figure of the program the own curve stood on at N (what the
    # tuner hands its user then), not the best re-timed of all it had measured by then.
    row = {
        "trials": len(own),
        "trial_gflops": own,
        "finalists": [
            {"trial": 35, "leads": [], "retimed_gflops": 60.0},
            {"trial": 2, "leads": [16, 32], "retimed_gflops": 45.0},
            {"trial": 1, "leads": [], "retimed_gflops": 99.0},  # measured early, not chosen
        ],
    }
    peers_summary.add_retimed_at([row])
    assert row["retimed_at_16"] == 45.0 and row["retimed_at_32"] == 45.0
    assert "retimed_at_64" not in row  # 64 is past the run: the end's figure is retimed_gflops
    # A file whose finalists carry only their trial: the leader is matched by it.
    old = dict(
        row, finalists=[{k: v for k, v in f.items() if k != "leads"} for f in row["finalists"]]
    )
    peers_summary.add_retimed_at([old])
    assert old["retimed_at_16"] == 45.0
    older = dict(row, finalists=[{"retimed_gflops": 60.0}])
    peers_summary.add_retimed_at([older])
    assert older["retimed_at_16"] is None


def test_vendor_runs_in_its_own_process_and_names_the_baseline():
    wl = workload("matmul", M=64, N=64, K=64)
    assert "numpy baseline of matmul" in peers_retime.vendor_name(wl)
    assert (
        peers_retime.vendor_name(workload("conv2d", n=1, c=4, h=6, w=6, k=4, r=3, s=3)) is not None
    )
    vendor = peers_retime.Vendor(wl)
    try:
        lat = vendor.latencies(min_time_s=0.0, min_repeats=5, warmup=1)
    finally:
        vendor.close()
    assert len(lat) == 5 and all(t > 0 for t in lat)
