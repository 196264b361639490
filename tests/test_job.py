"""Job files and the task scheduler's policies: plain data, checked before anything runs."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

from autosched.errors import InvalidInputError
from autosched.tuning import FairShare, Gradient, TaskProgress, job_from_dict, load_job, make_policy

NIGHT = """\
name = "night"
trials = 32
strategy = "random"
seed = 3

[[tasks]]
op = "matmul"
shape = "512,512,512"
epilogue = "bias_relu"
targets = ["opencl", "llvm"]

[[tasks]]
name = "resnet conv"
op = "conv2d"
shape = "n=1,c=64,h=56,w=56,k=64,r=3,s=3,pad=1"
trials = 48
weight = 2
"""


def _write(tmp_path, text):
    path = tmp_path / "night.toml"
    path.write_text(text)
    return path


def test_a_job_file_becomes_one_task_per_workload_and_target(tmp_path):
    job = load_job(_write(tmp_path, NIGHT))
    assert (job.name, job.strategy, job.seed, job.batch, job.policy) == (
        "night", "random", 3, 16, "fair",
    )  # fmt: skip
    assert [(t.workload.op, t.target, t.trials, t.weight) for t in job.tasks] == [
        ("matmul", "opencl", 32, 1.0),
        ("matmul", "llvm", 32, 1.0),
        ("conv2d", "opencl", 48, 2.0),
    ]
    assert job.tasks[0].workload.params["epilogue"] == "bias_relu"
    assert job.tasks[2].name == "resnet conv" and job.tasks[2].workload.params["pad"] == 1
    assert job.targets() == ["llvm", "opencl"]
    # A model hands over the same structure without a file.
    again = job_from_dict(
        {"name": "m", "tasks": [{"op": "matmul", "shape": "M=512,N=512,K=512", "targets": "llvm"}]}
    )
    (task,) = again.tasks
    assert task.target == "llvm" and task.workload.params["epilogue"] == "none"
    assert task.key == f"{task.workload.key}@llvm" != job.tasks[1].key


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("trials = 32", "trails = 32", ":2: trails: unknown key 'trails'; accepted: name, trials"),
        ("weight = 2", "wieght = 2", ":17: tasks[1].wieght: unknown key 'wieght'"),
        (
            'op = "conv2d"',
            'op = "conv3d"',
            ":14: tasks[1].op = 'conv3d' is not valid; one of matmul",
        ),
        (
            'shape = "512,512,512"',
            'shape = "512,512"',
            ":8: tasks[0].shape = '512,512' is not valid",
        ),
        (
            '"opencl", "llvm"',
            '"opencl", "cuda"',
            ":10: tasks[0].targets = ['opencl', 'cuda'] is not valid",
        ),
        ("trials = 48", "trials = 0", ":16: tasks[1].trials = 0 is not valid; an integer >= 1"),
        (
            'strategy = "random"',
            'strategy = "annealing"',
            ":3: strategy = 'annealing' is not valid",
        ),
        (
            'epilogue = "bias_relu"',
            'epilogue = "gelu"',
            ":9: tasks[0].epilogue = 'gelu' is not valid",
        ),
    ],
)
def test_bad_keys_and_values_name_the_line_and_the_key(tmp_path, old, new, expected):
    assert old in NIGHT
    path = _write(tmp_path, NIGHT.replace(old, new))
    with pytest.raises(InvalidInputError) as err:
        load_job(path)
    assert expected in str(err.value), str(err.value)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_unreadable_or_broken_files_and_empty_jobs_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="cannot read job file"):
        load_job(tmp_path / "missing.toml")
    with pytest.raises(InvalidInputError, match="not valid TOML"):
        load_job(_write(tmp_path, "name = \n"))
    with pytest.raises(InvalidInputError, match="tasks = None is not valid"):
        load_job(_write(tmp_path, 'name = "x"\n'))
    dup = NIGHT + '\n[[tasks]]\nop = "matmul"\nshape = "M=512,N=512,K=512,epilogue=bias_relu"\n'
    with pytest.raises(InvalidInputError, match=r"tasks\[2\].shape .* not already in tasks\[0\]"):
        load_job(_write(tmp_path, dup))


# -- policies --------------------------------------------------------------------------


def _run(policy, tasks, batch, rounds, latency_of):
    """Hand out ``rounds`` batches one at a time; ``latency_of(i, done)`` is task i's best."""
    order = []
    for _ in range(rounds):
        eligible = [i for i, t in enumerate(tasks) if t.left > 0]
        i = policy.next_task(tasks, eligible)
        if i is None:
            break
        n = min(batch, tasks[i].left)
        tasks[i].start(n)
        tasks[i].finish(n, latency_of(i, tasks[i].done + n))
        order.append(i)
    return order


def test_fair_share_keeps_every_task_at_the_same_fraction_and_stops_at_its_trials():
    tasks = [TaskProgress(trials=64), TaskProgress(trials=32), TaskProgress(trials=64)]
    order = _run(FairShare(), tasks, 16, 100, lambda i, d: 1e-3)
    assert [t.done for t in tasks] == [64, 32, 64]
    assert len(order) == 10
    # After every round of four batches the shares differ by at most one batch.
    tasks2 = [TaskProgress(trials=64), TaskProgress(trials=32), TaskProgress(trials=64)]
    _run(FairShare(), tasks2, 16, 5, lambda i, d: 1e-3)
    fractions = [t.done / t.trials for t in tasks2]
    assert max(fractions) - min(fractions) <= 0.5
    assert FairShare().next_task(tasks, []) is None


def test_gradient_spends_trials_where_weighted_latency_falls_most():
    # Task 0: 10 ms, run 4 times per inference, still improving; task 1: 1 ms, flat.
    tasks = [TaskProgress(trials=1000, weight=4), TaskProgress(trials=1000, weight=1)]
    policy = Gradient(min_trials=16, explore=0.0)
    order = _run(policy, tasks, 16, 20, lambda i, d: (10e-3 * 64 / (64 + d)) if i == 0 else 1e-3)
    assert order[:2] == [0, 1]  # every task first gets its minimum
    assert order.count(0) >= 15, order
    assert tasks[0].done > 5 * tasks[1].done


def test_gradient_serves_unknown_latency_first_and_explores_a_fixed_share():
    tasks = [TaskProgress(trials=10_000, weight=10), TaskProgress(trials=10_000)]
    policy = Gradient(min_trials=0, explore=0.0)
    tasks[0].finish(16, 5e-3)
    tasks[1].finish(16, None)  # every candidate failed so far: its latency is unknown
    assert policy.next_task(tasks, [0, 1]) == 1
    tasks[1].finish(16, 1e-6)
    assert policy.next_task(tasks, [0, 1]) == 0
    explorer = Gradient(min_trials=0, explore=0.2, rng=np.random.default_rng(7))
    picks = [explorer.next_task(tasks, [0, 1]) for _ in range(2000)]
    share = picks.count(1) / len(picks)
    assert 0.07 < share < 0.13, share  # half of the 20% random picks land on task 1
    again = Gradient(min_trials=0, explore=0.2, rng=np.random.default_rng(7))
    assert [again.next_task(tasks, [0, 1]) for _ in range(2000)] == picks


def test_policies_by_name():
    assert isinstance(make_policy("fair"), FairShare)
    assert isinstance(make_policy("gradient", batch=8), Gradient)
    assert make_policy("gradient", batch=8).min_trials == 8
    with pytest.raises(InvalidInputError, match="accepted: fair, gradient"):
        make_policy("round-robin")


_FINALISER_CTRL_C = """
import os, signal
from autosched.tuning.interrupt import check, latched

class Future:
    def __del__(self):  # as a Dask future's release runs, between two lines of a loop
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs here; Python prints "Exception ignored"

with latched():
    Future()
    print("went on")
    try:
        check()
    except KeyboardInterrupt:
        print("interrupted")
"""


def test_a_ctrl_c_that_lands_in_a_finaliser_still_ends_the_loop():
    """Python swallows a KeyboardInterrupt raised inside ``__del__`` (without the latch
    this script prints "went on" and an "Exception ignored" traceback, and a farm job
    ran to its end): the latch keeps it, and the loop's next check raises it."""
    run = subprocess.run(
        [sys.executable, "-c", _FINALISER_CTRL_C], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert run.stdout.split() == ["went", "on", "interrupted"], (run.stdout, run.stderr)
    assert run.stderr == ""  # Python's "Exception ignored" report is kept off the terminal


_GC_CALLBACK_CTRL_C = """
import gc, os, signal, time
from autosched.tuning.interrupt import check, latched

state = {}

def diagnosis(phase, info):  # keeps state across a collection, as Dask's GC diagnosis does
    if phase == "start":
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the handler runs here
        state["start"] = time.perf_counter()
    else:
        assert state.pop("start", None) is not None, "stop without start"

gc.callbacks.append(diagnosis)
with latched():
    gc.collect()
    gc.callbacks.remove(diagnosis)
    print("collected")
    try:
        check()
    except KeyboardInterrupt:
        print("interrupted")
"""


def test_a_ctrl_c_that_lands_in_a_gc_callback_leaves_it_whole_and_ends_the_loop():
    """A KeyboardInterrupt raised inside a GC callback's "start" left Dask's diagnosis
    without its start time, and its "stop" then printed an AssertionError traceback over a
    farm job's Ctrl-C (CI, 2026-11-25). The first Ctrl-C only marks the loop to stop."""
    run = subprocess.run(
        [sys.executable, "-c", _GC_CALLBACK_CTRL_C], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert run.stdout.split() == ["collected", "interrupted"], (run.stdout, run.stderr)
    assert run.stderr == ""


_TWICE_CTRL_C = """
import os, signal, time
from autosched.tuning.interrupt import latched

with latched():
    os.kill(os.getpid(), signal.SIGINT)
    print("marked")
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("slept")
    except KeyboardInterrupt:
        print("interrupted")
"""


def test_a_second_ctrl_c_interrupts_at_once():
    run = subprocess.run(
        [sys.executable, "-c", _TWICE_CTRL_C], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert run.stdout.split() == ["marked", "interrupted"], (run.stdout, run.stderr)
