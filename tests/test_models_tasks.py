"""A model's fused functions as tuning tasks: spaces, builds, the scheduler, the Relax build.

Real parts throughout: torch.export + TVM's Relax front end for tiny models with random
weights, TVM codegen for llvm, real measurements in SQLite records.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import autosched.tvm
from autosched.measure.runner import TimingOptions
from autosched.ops import workload_from_json
from autosched.ops.fused import FusedFunc
from autosched.records.sqlite import SQLiteDatabase
from autosched.space.select import make_space
from autosched.tuning.model import model_job, model_policy, task_timings, tune_tasks
from autosched.tuning.runner import LocalRunner
from autosched.tuning.scheduler import Gradient, TaskProgress
from autosched.tvm.tasks import default_latency_ms, default_schedule, extract_tasks
from tests.relax_models import assert_matches
from tests.relax_models import relax_of as _relax

nn = torch.nn


class ResBlock(nn.Module):
    """conv+BN+relu, conv+BN+residual+relu, max-pool, mean, dense."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + x)
        return self.fc(self.pool(y).mean((2, 3)))


class ConvNet(nn.Module):
    """A strided stem (3 -> 12 channels), a depthwise and a grouped conv with BN, relu6,
    average pooling and a dense head: every kind of 2-D convolution a CNN has."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(12, 12, 3, padding=1, groups=12, bias=False)
        self.bn = nn.BatchNorm2d(12)
        self.grouped = nn.Conv2d(12, 8, 1, groups=4)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = nn.functional.relu6(self.bn(self.dw(torch.relu(self.stem(x)))))
        return self.fc(self.grouped(y).mean((2, 3)))


class BertLayer(nn.Module):
    """Attention (dense+bias, batched QK^T, softmax, batched AV) and an MLP with GELU."""

    def __init__(self, d: int = 32, heads: int = 2, ff: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.f1, self.f2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):
            return y.view(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, -1)
        x = self.ln1(x + self.o((a @ v).transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.f2(nn.functional.gelu(self.f1(x))))


@pytest.fixture(scope="module")
def resnet():
    return _relax(ResBlock(), (1, 8, 16, 16))


@pytest.fixture(scope="module")
def bert():
    return _relax(BertLayer(), (1, 16, 32))


def _by_name(tasks, prefix: str):
    return [t for t in tasks if t.name.startswith(prefix)]


def _check_configs(task, host, n: int = 3) -> None:
    """The default and ``n`` sampled configs build and match the TVM-built reference."""
    import tvm

    from autosched.space.schedule import schedule

    wl = task.workload
    space = make_space(wl, target="llvm", limits=host.limits)
    rng = np.random.default_rng(1)
    inputs = wl.make_inputs(rng)
    expected = wl.reference(inputs)
    for config in [space.default(), *space.sample(rng, n)]:
        assert_matches(wl, tvm.compile(schedule(space, config), target="llvm"), inputs, expected)


def test_resnet_block_tasks_have_weights_and_families(resnet, host):
    mod, _, _ = resnet
    every = extract_tasks(mod, limits=host.limits)
    tasks = [t for t in every if t.form == "direct"]
    convs = _by_name(tasks, "fused_conv2d")
    # Two convolutions with their BN arithmetic and relu (one with the residual) fused in.
    assert len(convs) == 2 and all(t.family == "contraction" for t in convs)
    from autosched.space.loopnest import analyze

    for conv in convs:  # the padding is a producer, the BN arithmetic and relu its epilogue
        nest = analyze(conv.workload)
        assert nest.produced and nest.epilogue
        assert len(conv.workload.tensor_specs()) >= 6  # data, weight, BN's four, output
    dense = [t for t in tasks if "matmul" in t.name]
    assert [t.family for t in dense] == ["contraction"]
    # Pooling windows and a mean over two axes: no family, the default schedule.
    assert {t.name: t.family for t in tasks}["max_pool2d"] is None
    # Channels-last: the input is transposed once, though the residual reads it too.
    assert {t.name: t.weight for t in tasks}["transpose"] == 1
    assert sum(t.weight for t in tasks) == 6
    # Both 3x3 convolutions have a Winograd form as well: one input transform and one
    # product for the two (same shapes), and an output transform for each epilogue.
    stages = [t for t in every if t.form == "winograd"]
    assert sorted((t.name.split("_")[-1].rstrip("0123456789"), t.weight) for t in stages) == [
        ("gemm", 2), ("input", 2), ("relu", 1), ("relu", 1),
    ]  # fmt: skip


class Centred(nn.Module):
    """A group's mean taken off (a group norm's first step, over a reshape): the mean's
    kept dimension is an output axis of extent 1 that indexes no input."""

    def forward(self, x):
        y = x.reshape(2, 4, -1)
        return (y - y.mean(-1, keepdim=True)).reshape(x.shape)


def test_a_mean_with_a_kept_dimension_is_no_contraction_and_every_task_builds(host, caplog):
    """Taken for a contraction (the unit axis reads like an output axis some input lacks:
    reuse), the mean's task failed its default schedule and `model tasks` with it."""
    mod, _, _ = _relax(Centred(), (2, 8, 6, 6))
    tasks = extract_tasks(mod, limits=host.limits)
    (mean,) = [t for t in tasks if "mean" in t.name]
    assert mean.family != "contraction"
    for task in tasks:
        assert default_latency_ms(task, device=host, repeats=1) > 0
    assert "cannot schedule" not in caplog.text


def test_an_onnx_layer_norm_made_of_reductions_is_tuned_row_wise(host, tmp_path):
    """An ONNX file of opset 13 (no LayerNormalization op: ReduceMean with keepdims, Sub,
    Pow, ReduceMean, Add, Sqrt, Div, as most exported transformers have it): its mean
    and variance tasks are row-wise and every task builds (`autosched model tasks` failed
    on it in TVM's scheduler)."""
    from autosched.models import load_model, zoo

    module, example = zoo.tiny_bert_layer()
    path = tmp_path / "bert13.onnx"
    torch.onnx.export(module.eval(), example, str(path), opset_version=13, dynamo=False)
    tasks = extract_tasks(load_model(str(path)).mod, limits=host.limits)
    means = [t for t in tasks if "mean" in t.name]
    assert len(means) == 2 and all(t.family == "rowwise" for t in means), means
    for task in tasks:
        assert default_latency_ms(task, device=host, repeats=1) > 0


def test_bert_layer_tasks_share_keys_and_weights(bert, host):
    mod, _, _ = bert
    tasks = extract_tasks(mod, limits=host.limits)
    families = {t.name: t.family for t in tasks}
    # q, k, v and o are one computation: one task called four times.
    (qkvo,) = [t for t in tasks if t.weight == 4 and t.family == "contraction"]
    assert len(qkvo.functions) == 1
    assert families["layer_norm"] == "rowwise"
    assert next(t for t in tasks if "softmax" in t.name).family == "rowwise"
    batched = [t for t in tasks if t.name.startswith("matmul")]
    assert batched and all(t.family == "contraction" for t in batched)
    # Two layer norms on tensors Relax named differently: one workload, weight 2.
    assert next(t for t in tasks if t.name == "layer_norm").weight == 2


def test_a_linear_layers_constant_weight_is_transposed_at_build_time(bert, host):
    """nn.Linear computes x @ W^T with W stored [out, in]: the build folds the transpose
    into the constant, so the dense tasks read W^T as [in, out], along the output's
    contiguous axis, and no task strides through W's rows (Relax's NT_matmul)."""
    mod, _, _ = bert
    tasks = extract_tasks(mod, limits=host.limits)
    assert not [t.name for t in tasks if "NT_matmul" in t.name]
    # f1: x [16, 32] (the batch reshaped away) times W^T, out [16, 64], bias (64,)
    (f1,) = [t for t in tasks if _shapes(t)[0] == (16, 32) and _shapes(t)[-1] == (16, 64)]
    assert _shapes(f1)[1] == (32, 64)  # [in, out]; nn.Linear's W is [64, 32]


def _shapes(task) -> list[tuple[int, ...]]:
    return [tuple(s.shape) for s in task.workload.tensor_specs()]


def test_fused_workload_round_trips_through_records(bert, host):
    mod, _, _ = bert
    task = next(t for t in extract_tasks(mod, limits=host.limits) if t.name == "layer_norm")
    again = workload_from_json(task.workload.to_json())
    assert again == task.workload and again.key == task.workload.key
    assert again.key.startswith("fused-")
    # The key does not depend on the shown name, and normalising is idempotent.
    assert FusedFunc.of(again.prim_func(), "other").key == task.workload.key


@pytest.mark.parametrize("prefix", ["fused_conv2d", "fused_matmul"])
def test_resnet_contractions_build_correct_configs(resnet, host, prefix):
    for task in _by_name(extract_tasks(resnet[0], limits=host.limits), prefix):
        _check_configs(task, host)


@pytest.mark.parametrize("prefix", ["layer_norm", "fused_softmax", "matmul", "fused_matmul"])
def test_bert_tasks_build_correct_configs(bert, host, prefix):
    tasks = _by_name(extract_tasks(bert[0], limits=host.limits), prefix)
    assert tasks
    for task in tasks[:2]:
        _check_configs(task, host, n=2)


def test_gradient_budget_ends_the_job_and_gives_every_task_its_minimum():
    policy = Gradient(min_trials=2, budget=10, rng=np.random.default_rng(0))
    tasks = [TaskProgress(trials=10, weight=w) for w in (1.0, 4.0, 1.0)]
    picks = []
    while policy.room(tasks):
        i = policy.next_task(tasks, [0, 1, 2])
        n = min(2, policy.room(tasks))
        tasks[i].start(n)
        tasks[i].finish(n, 1e-3 * tasks[i].weight / (tasks[i].done + 1))
        picks.append(i)
    assert sum(t.done for t in tasks) == 10
    assert sorted(picks[:3]) == [0, 1, 2]  # the minimum first, for every task
    assert policy.next_task(tasks, [0, 1, 2]) is None
    assert picks.count(1) > picks.count(0)  # the heavy task gets the rest


def test_gradient_budget_counts_the_trials_the_records_hold():
    """A resumed model tune: 7 of its 10 trials measured before (by an interrupted run),
    so 3 are left, and the task short of its minimum gets them first."""
    policy = Gradient(min_trials=2, budget=10, rng=np.random.default_rng(0))
    tasks = [TaskProgress(trials=10, done=d) for d in (4, 3, 0)]
    assert policy.room(tasks) == 3
    assert policy.next_task(tasks, [0, 1, 2]) == 2
    tasks[2].start(2)
    tasks[2].finish(2, 1e-3)
    assert policy.room(tasks) == 1
    tasks[0].start(1)
    tasks[0].finish(1, 1e-3)
    assert policy.room(tasks) == 0 and policy.next_task(tasks, [0, 1, 2]) is None


def test_model_job_with_no_tunable_task_is_refused():
    from autosched.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="nothing to tune"):
        model_job([], name="m", target="llvm", trials=8)


class Mlp(nn.Module):
    """dense+bias+GELU, dense+bias+residual, layer norm, softmax: four tunable tasks."""

    def __init__(self, d: int = 32, ff: int = 64) -> None:
        super().__init__()
        self.f1, self.f2, self.ln = nn.Linear(d, ff), nn.Linear(ff, d), nn.LayerNorm(d)

    def forward(self, x):
        y = self.ln(x + self.f2(nn.functional.gelu(self.f1(x))))
        return torch.softmax(y, -1)


def test_a_model_function_is_timed_with_its_weights_out_of_the_caches(host, tmp_path):
    from autosched.measure.build import build
    from autosched.measure.runner import CpuRunner, TestData
    from autosched.ops import workload

    mod, _, _ = _relax(Mlp(), (16, 32))
    (task,) = [t for t in extract_tasks(mod, limits=host.limits) if t.name == "layer_norm"]
    space = make_space(task.workload, target="llvm", limits=host.limits)
    program = build(space, space.default())
    assert program.flush  # its weights come from memory in a model run
    op_space = make_space(workload("matmul", M=16, N=16, K=16), target="llvm", limits=host.limits)
    assert not build(op_space, op_space.default()).flush
    # The flush runs before every timed call (TVM's runtime knows it by name).
    inputs = task.workload.make_inputs(np.random.default_rng(0))
    data = TestData("ln", inputs, task.workload.reference(inputs), 1e-4, 1e-5)
    runner = CpuRunner(tmp_path)
    runner.set_data(data)
    options = TimingOptions(warmup=0, min_repeats=5, max_repeats=5, min_time_s=1.0)
    outcome = runner.run(program, options)
    assert outcome.status == "ok", outcome.error
    assert len(outcome.latencies) == 5


def test_tune_a_model_and_build_it_with_its_records(host, tmp_path):
    mod, x, module = _relax(Mlp(), (16, 32))
    tasks = extract_tasks(mod, limits=host.limits)
    db = SQLiteDatabase(tmp_path / "model.db")
    runner = LocalRunner(host, "llvm", timing=TimingOptions(min_time_s=0.005), keep=len(tasks))
    try:
        first = tune_tasks(
            tasks, runner, db, name="mlp", target="llvm", trials=8, batch=2, finalists=1
        )
        # --trials is the total, as for `autosched tune`: a rerun (after Ctrl-C, or with a
        # larger budget) tops up, it does not spend the budget again.
        result = tune_tasks(
            tasks, runner, db, name="mlp", target="llvm", trials=10, batch=2, finalists=1
        )
    finally:
        runner.close()
    assert (first.new_trials, result.new_trials) == (8, 2)
    timings = task_timings(tasks, result)
    tuned = [t for t in timings if t.family is not None]
    assert len(tuned) >= 3
    assert sum(t.trials for t in tuned) == 10  # the budget, shared out
    assert all(t.trials >= 2 for t in tuned), timings
    assert all(t.best_ms and t.default_ms for t in tuned), [
        (r.status, r.error[:300]) for r in db.query() if not r.ok
    ]
    assert all(t.trials == 0 for t in timings if t.family is None)

    built = autosched.tvm.build(mod, "llvm", db=db, shipped=False)
    plain = autosched.tvm.build(mod, "llvm", untuned=False, records=False)
    applied = {a.function: a.provenance for a in built.applied}
    assert applied["layer_norm"] == "exact"
    assert [t.name for t in tasks if applied.get(t.name) != "exact"] == [
        t.name for t in tasks if t.family is None
    ]
    assert plain.applied == []
    (got,), (want,) = built(x), plain(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    eager = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)


def test_resnet_build_without_records_is_parallel_and_correct(resnet, host):
    mod, x, module = resnet
    built = autosched.tvm.build(mod, "llvm", db=None, shipped=False)
    kinds = {a.function: a.provenance for a in built.applied}
    assert kinds["max_pool2d"] == "default-schedule" and kinds["mean"] == "default-schedule"
    assert all(v == "untuned" for k, v in kinds.items() if k.startswith("fused_conv2d"))
    eager = module(torch.from_numpy(x)).detach().numpy()
    (got,) = built(x)
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)
    pool = next(t for t in extract_tasks(mod, limits=host.limits) if t.name == "max_pool2d")
    assert default_latency_ms(pool, device=host, repeats=2) > 0


def test_convolutions_run_channels_last_with_weights_transposed_at_build_time(host):
    """Every conv2d task is NHWC with an HWIO weight, whatever the model's layout: the
    output's innermost axis, where the spaces put the vector lanes, is the channels (not
    the image width), and the weight reads contiguously along it. The weights' layout
    change is folded into constants (no task transposes a weight), the model's output
    is unchanged (relu6, a clip, follows the layout instead of being transposed around),
    and the conv tasks' sampled configs build correctly."""
    mod, x, module = _relax(ConvNet(), (1, 3, 18, 18))
    tasks = extract_tasks(mod, limits=host.limits)
    convs = _by_name(tasks, "fused_conv2d") + _by_name(tasks, "conv2d")
    assert len(convs) == 3, [t.name for t in tasks]
    shapes = sorted((_shapes(t)[0], _shapes(t)[1], _shapes(t)[-1]) for t in convs)
    # stem: 1x3x18x18 (NCHW) -> data 1x18x18x3, weight 3x3x3x12, out 1x9x9x12
    assert ((1, 18, 18, 3), (3, 3, 3, 12), (1, 9, 9, 12)) in shapes
    # depthwise: weight HWIO with I = 12 / 12 groups; grouped 1x1: I = 12 / 4 groups
    assert ((1, 9, 9, 12), (3, 3, 1, 12), (1, 9, 9, 12)) in shapes
    assert ((1, 9, 9, 12), (1, 1, 3, 8), (1, 9, 9, 8)) in shapes
    # Only the model's input is transposed at run time (3 channels): no weight is.
    moves = [t for t in tasks if "transpose" in t.name and "conv" not in t.name]
    assert [_shapes(t)[0] for t in moves] == [(1, 3, 18, 18)], [t.name for t in moves]
    built = autosched.tvm.build(mod, "llvm", db=None, shipped=False)
    (got,) = built(x)
    eager = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)
    # The stem and the depthwise conv are contractions (a grouped conv with several
    # channels per group has no space in either layout: its default schedule runs).
    tuned = [t for t in convs if t.family == "contraction"]
    assert len(tuned) == 2
    for task in tuned:
        _check_configs(task, host, n=2)


def test_model_policy_minimum_fits_the_budget(bert, host):
    tasks = extract_tasks(bert[0], limits=host.limits)
    job = model_job(tasks, name="b", target="llvm", trials=12, batch=8)
    policy = model_policy(job, trials=12)
    assert policy.budget == 12 and policy.min_trials == 12 // len(job.tasks)
    assert all(t.weight >= 1 for t in job.tasks) and job.policy == "gradient"


def test_the_search_learns_only_from_records_of_its_space_kind(bert, host):
    """A model's fused functions share the op ``fused``: the contraction task's search
    learns from the other contractions' records (as a transfer source, weighed by how
    it ranks this task's own measurements), never from the row-wise ones."""
    from autosched.records.record import Record
    from autosched.search.evolutionary import EvolutionarySearch

    mod, _, _ = bert
    tasks = extract_tasks(mod, limits=host.limits)
    contraction = [t for t in tasks if t.family == "contraction"]
    rowwise = [t for t in tasks if t.family == "rowwise"]
    assert len(contraction) >= 2 and rowwise

    def space_for(wl_json):
        return make_space(workload_from_json(wl_json), target="llvm", limits=host.limits)

    def record(task, seed: int) -> Record:
        space = space_for(task.workload.to_json())
        (config,) = space.sample(np.random.default_rng(seed), 1)
        fp = host.fingerprint("llvm")
        return Record(
            workload_key=task.workload.key, workload=task.workload.to_json(), target="llvm",
            device_key=host.key("llvm"), device_family=host.family("llvm"), device=fp,
            config_key=config.key, config=config.to_json(), status="ok",
            latencies=(1e-4 * (1 + seed),), latency_s=1e-4 * (1 + seed), gflops=1 / (1 + seed),
        )  # fmt: skip

    mine, other, row = contraction[0], contraction[1], rowwise[0]
    space = space_for(mine.workload.to_json())
    search = EvolutionarySearch(
        space, rng=np.random.default_rng(0), space_for=space_for, family=host.family("llvm")
    )
    records = [record(t, s) for t in (mine, other, row) for s in range(8)]
    kept = search._kin(records, space_for)
    assert {r.workload_key for r in kept} == {mine.workload.key, other.workload.key}
    search.observe(records)
    assert search.propose(4)  # the fits on the kin records work
    assert "transfer:kin" in search.blend.weights()


@pytest.mark.parametrize("lanes", [4, 8])
def test_the_default_schedule_vectorises_a_pooling_window_across_channels(resnet, host, lanes):
    # Channels-last max-pool: the window's reduction loops go outside the channel
    # lanes, so the lanes are vectorised; the image's leading loops are one parallel loop.
    import dataclasses

    from tvm import tirx
    from tvm.s_tir import Schedule

    mod, _, _ = resnet
    # No cache sizes: the small test pool would otherwise run on one thread.
    limits = dataclasses.replace(host.limits, vector_lanes=lanes, cache_bytes=())
    pool = next(t for t in extract_tasks(mod, limits=limits) if t.name == "max_pool2d")
    wl = pool.workload
    sch = Schedule(wl.prim_func())
    default_schedule(sch, limits=limits)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))  # the window's max
    loops = [sch.get(lv) for lv in sch.get_loops(block)]
    kinds = [lp.kind for lp in loops]
    assert kinds[0] == tirx.ForKind.PARALLEL and kinds[-1] == tirx.ForKind.VECTORIZED
    assert int(loops[-1].extent) == lanes
    window = [lp for lp in loops if lp.loop_var.name.startswith("rv")]
    assert [lp.kind for lp in window] == [tirx.ForKind.SERIAL] * 2
    assert loops[-3:-1] == window  # the window, right outside the lanes
    _assert_runs_as_reference(sch, wl, seed=2)


def test_the_default_schedule_parallelises_only_the_loops_that_feed_the_cores(resnet, host):
    # The block's input transpose (1x8x16x16 to channels last, rows x columns x
    # channels): only as many leading loops as give every core 16 tasks are fused and
    # parallel (the rows for one core, rows x columns for 16, all for 64); the rest stay
    # plain loops inside each task.
    import dataclasses

    from tvm import tirx
    from tvm.s_tir import Schedule

    mod, _, _ = resnet
    for cores, parallel in ((1, 16), (16, 16 * 16), (64, 16 * 16 * 8)):
        limits = dataclasses.replace(host.limits, cores=cores, vector_lanes=16, cache_bytes=())
        task = next(t for t in extract_tasks(mod, limits=limits) if t.name == "transpose")
        sch = Schedule(task.workload.prim_func())
        default_schedule(sch, limits=limits)
        (block,) = sch.get_child_blocks(sch.get_sblock("root"))
        loops = [sch.get(lv) for lv in sch.get_loops(block)]
        assert loops[0].kind == tirx.ForKind.PARALLEL and int(loops[0].extent) == parallel
        assert all(lp.kind == tirx.ForKind.SERIAL for lp in loops[1:])
    _assert_runs_as_reference(sch, task.workload, seed=4)


def test_the_default_schedule_runs_a_function_that_fits_in_l1_on_one_thread(resnet, host):
    # The block's input transpose moves 16 KiB: on a CPU whose L1 holds that it runs on
    # one thread (waking the runtime's threads costs more than the work); with a smaller
    # L1 it is parallel; both give the reference's outputs.
    import dataclasses

    from tvm import tirx
    from tvm.s_tir import Schedule

    from autosched.tvm.tasks import argument_bytes

    mod, _, _ = resnet
    task = next(t for t in extract_tasks(mod, limits=host.limits) if t.name == "transpose")
    size = argument_bytes(task.workload.prim_func())
    assert size == 2 * 8 * 16 * 16 * 4
    for l1, parallel in ((size, False), (size - 4, True)):
        limits = dataclasses.replace(host.limits, cores=2, cache_bytes=(l1, 1 << 20))
        sch = Schedule(task.workload.prim_func())
        default_schedule(sch, limits=limits)
        (block,) = sch.get_child_blocks(sch.get_sblock("root"))
        kinds = [sch.get(lv).kind for lv in sch.get_loops(block)]
        assert (tirx.ForKind.PARALLEL in kinds) == parallel, (l1, kinds)
        _assert_runs_as_reference(sch, task.workload, seed=5)


class Steps(torch.nn.Module):
    def forward(self, x):
        return x.split(1, dim=0)  # a recurrent layer's input, one piece per step


def test_the_default_schedule_runs_each_small_block_of_a_split_on_one_thread(host):
    # A split into 8 steps is one function of 8 blocks, each copying 1 KiB: 16 KiB of
    # arguments, more than a 4 KiB L1, but each block (2 KiB read and written) fits, so
    # none wakes the runtime's threads (an LSTM's 32-step split: 32 parallel loops per
    # call). With an L1 smaller than a block, every block is parallel again.
    import dataclasses

    from tvm import tirx
    from tvm.s_tir import Schedule

    from autosched.tvm.tasks import argument_bytes, block_bytes

    mod, _, _ = _relax(Steps(), (8, 256))
    (task,) = extract_tasks(mod, limits=host.limits)
    assert task.family is None
    assert argument_bytes(task.workload.prim_func()) == 2 * 8 * 256 * 4
    for l1, parallel in ((4096, False), (2 * 256 * 4, False), (2 * 256 * 4 - 4, True)):
        limits = dataclasses.replace(host.limits, cores=2, cache_bytes=(l1, 1 << 20))
        sch = Schedule(task.workload.prim_func())
        default_schedule(sch, limits=limits)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        assert len(blocks) == 8
        for rv in blocks:
            assert block_bytes(sch, rv) == 2 * 256 * 4
            kinds = [sch.get(lv).kind for lv in sch.get_loops(rv)]
            assert (tirx.ForKind.PARALLEL in kinds) == parallel, (l1, kinds)
        _assert_runs_as_reference(sch, task.workload, seed=6)


def test_the_default_schedule_inlines_a_pooling_window_s_padding(host):
    # ResNet's stem pool pads its input; the padded copy is computed inside the window's
    # reads instead of being written and read back.
    from tvm.s_tir import Schedule

    stem = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1))
    mod, _, _ = _relax(stem, (1, 4, 16, 16))
    pool = next(t for t in extract_tasks(mod, limits=host.limits) if t.name == "max_pool2d")
    wl = pool.workload
    sch = Schedule(wl.prim_func())
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 2  # the padding, the max
    default_schedule(sch, limits=host.limits)
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 1
    _assert_runs_as_reference(sch, wl, seed=3)


def _assert_runs_as_reference(sch, wl, *, seed: int) -> None:
    """``sch`` built for the host gives ``wl``'s reference outputs exactly."""
    import tvm

    lib = tvm.compile(sch.mod, target="llvm")
    inputs = wl.make_inputs(np.random.default_rng(seed))
    args = {
        s.name: tvm.runtime.tensor(
            inputs[s.name] if s.role == "input" else np.full(s.shape, np.nan, s.dtype)
        )
        for s in wl.tensor_specs()
    }
    lib["main"](*args.values())
    for name, want in wl.reference(inputs).items():
        np.testing.assert_array_equal(args[name].numpy(), want)


def test_records_tables_and_reports_say_a_fused_function_in_one_line(resnet, host, tmp_path):
    """A model's records carry each fused function's whole TVMScript: `records stats` and
    the report's headings printed all of it, newlines escaped, thousands of characters
    per row. They say its blocks and argument shapes in one line; the report keeps the
    script, folded under its section's heading."""
    import dataclasses
    import html
    import re

    from autosched.records.files import stats
    from autosched.report import build_report
    from tests.records_factory import make_record

    mod, _, _ = resnet
    tasks = {t.name: t for t in extract_tasks(mod, limits=host.limits)}
    with SQLiteDatabase(tmp_path / "r.db") as db:
        for i, task in enumerate(tasks.values()):
            base = make_record(i, target="llvm")
            wl = task.workload
            db.add([dataclasses.replace(base, workload=wl.to_json(), workload_key=wl.key)])
        table = stats(db)
    by_key = dict(zip(table.workload_key, table.params))
    dense = tasks["fused_matmul_add2"].workload
    assert by_key[dense.key] == "matmul, T_add: 1x8, 8x10, 10 -> 1x10"
    assert by_key[tasks["max_pool2d"].workload.key].endswith(": 1x16x16x8 -> 1x8x8x8")
    assert len(by_key) == len(tasks)
    assert all(
        "\n" not in text and "script" not in text and len(text) < 150 for text in by_key.values()
    )

    page = build_report(tmp_path / "r.db", vendor_gflops=1.0)
    titles = [html.unescape(t) for t in re.findall(r"<h2>([^<]*)</h2>", page)]
    assert len(titles) == len(tasks)
    assert "fused matmul, T_add: 1x8, 8x10, 10 -> 1x10 on " in "\n".join(titles)
    assert all(len(t) < 250 and "T.Buffer" not in t for t in titles), titles
    folded = re.findall(
        r"<details><summary>the function \(TVMScript\)</summary><pre>(.*?)</pre>", page, re.S
    )
    assert sorted(html.unescape(s) for s in folded) == sorted(
        t.workload.script for t in tasks.values()
    )
