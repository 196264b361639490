"""Which form each 3x3 stride-1 convolution of a model takes in a build: direct or
Winograd (:mod:`autosched.tvm.winograd`), decided by measurement on this device.

The records say how fast each function is alone, its weights flushed from the caches;
inside a model run the two forms do not always rank the same. On a Zen 5, ResNet-18's
7x7x512 convolution's Winograd product (a 38 MB transformed weight against the direct
form's 9 MB) measured 0.56 ms alone and 0.67 ms inside the model, and the records' sum
chose the form that made the whole model slower. So the records only say which
convolutions are candidates (both forms tuned on this device), and the choice is made
by timing the model itself: once with every candidate direct and once with every one in
Winograd form, in interleaved rounds, each function's time taken inside the run (the
Relax VM's instrument hook) and summed per convolution signature and form.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autosched.tvm.tasks import call_counts, fuse
from autosched.tvm.winograd import call_signature, form_of

log = logging.getLogger(__name__)

ROUNDS = 4  # interleaved rounds of the two builds
RUNS = 5  # model runs per build and round (after one warm-up run)


def candidates(
    fused: Sequence[Any],
    tuned_latency_s: Callable[[Any, str], float | None],
    has_space: Callable[[Any, str], bool],
) -> set[str]:
    """Signatures of the convolutions both of whose forms have a record on this device
    for every function a space covers (``tuned_latency_s`` is not None), read off the
    model fused both ways (every convolution direct, every one the rewrite takes in
    Winograd form)."""
    from tvm import tirx

    seen: dict[tuple[str, str], bool] = {}
    for module in fused:
        counts = call_counts(module)
        for gv, func in module.functions.items():
            if not isinstance(func, tirx.PrimFunc) or gv.name_hint not in counts:
                continue
            form = form_of(func)
            if form is None:
                continue
            tuned = not has_space(func, gv.name_hint) or (
                tuned_latency_s(func, gv.name_hint) is not None
            )
            seen[form] = seen.get(form, True) and tuned
    return {
        sig
        for (kind, sig), ok in seen.items()
        if kind == "winograd" and ok and seen.get(("direct", sig), False)
    }


def choose(
    mod: Any,
    *,
    direct: Any,
    every: Any,
    schedule: Callable[[Any], Any],
    target: Any,
    sigs: set[str],
    rounds: int = ROUNDS,
    runs: int = RUNS,
) -> tuple[set[str], dict[frozenset[str], tuple[Any, Any]]]:
    """The signatures among ``sigs`` whose Winograd form took less time inside the model
    than their direct form, and the two builds timed (the set of signatures in Winograd
    form -> the scheduled module and its executable), for the caller to reuse.
    ``direct`` and ``every`` are ``mod`` fused with every convolution direct and with
    every one the rewrite takes in Winograd form (``schedule``, which applies the
    records to a fused module, may change them in place)."""
    if not sigs:
        return set(), {}
    forms = [_forms(direct), _forms(every)]
    if sigs == {sig for kind, sig in forms[1].values() if kind == "winograd"}:
        winograd = every
    else:
        winograd = fuse(mod, winograd=lambda call: call_signature(call) in sigs)
        forms[1] = _forms(winograd)
    try:
        runners = [_Timed(schedule(direct), target), _Timed(schedule(winograd), target)]
    except Exception as exc:  # a model this process cannot run (symbolic shapes, say)
        log.warning("the convolutions stay direct: the model could not be timed (%s)", exc)
        return set(), {}
    for _ in range(rounds):
        for runner in runners:
            runner.run(runs)
    cost: dict[tuple[str, str], float] = {}
    for names, runner in zip(forms, runners):
        for name, seconds in runner.per_run().items():
            if name in names:
                cost[names[name]] = cost.get(names[name], 0.0) + seconds
    chosen = set()
    for sig in sorted(sigs):
        d, w = cost.get(("direct", sig)), cost.get(("winograd", sig))
        if d is None or w is None:
            continue
        if w < d:
            chosen.add(sig)
        log.info(
            "conv %s inside the model: direct %.4f ms, winograd %.4f ms -> %s",
            sig, d * 1e3, w * 1e3, "winograd" if w < d else "direct",
        )  # fmt: skip
    built = {frozenset(): runners[0].built, frozenset(sigs): runners[1].built}
    return chosen, built


def _forms(fused: Any) -> dict[str, tuple[str, str]]:
    """Function name -> (form, signature) for the functions of a convolution."""
    from tvm import tirx

    out = {}
    for gv, func in fused.functions.items():
        if isinstance(func, tirx.PrimFunc):
            form = form_of(func)
            if form is not None:
                out[gv.name_hint] = form
    return out


class _Timed:
    """A scheduled module built and run on the host's CPU with random inputs, each
    function's time inside each run kept (the Relax VM's instrument hook)."""

    def __init__(self, mod: Any, target: Any) -> None:
        import tvm
        from tvm import relax

        dev = tvm.cpu()
        executable = tvm.compile(mod, target=target)
        self.built = (mod, executable)
        self.vm = relax.VirtualMachine(executable, dev)
        rng = np.random.default_rng(0)
        self.args = []
        for param in mod["main"].params:
            shape = [int(d) for d in param.ty.shape.values]
            dtype = str(param.ty.dtype)
            # Integers (token ids) as zeros: a valid index for any table.
            value = rng.standard_normal(shape) if dtype.startswith("float") else np.zeros(shape)
            self.args.append(tvm.runtime.tensor(value.astype(dtype), dev))
        self.samples: dict[str, list[float]] = {}
        self.runs = 0
        self._started: dict[str, float] = {}
        self.vm["main"](*self.args)  # warm-up: the first run allocates
        self.vm.set_instrument(self._instrument)

    def _instrument(self, func: Any, name: str, before: bool, ret: Any, *args: Any) -> int:
        if before:
            self._started[name] = time.perf_counter()
        else:
            self.samples.setdefault(name, []).append(time.perf_counter() - self._started[name])
        return 0

    def run(self, runs: int) -> None:
        for _ in range(runs):
            self.vm["main"](*self.args)
        self.runs += runs

    def per_run(self) -> dict[str, float]:
        """Seconds per model run of each function (its calls' median times calls)."""
        return {name: float(np.median(s)) * len(s) / self.runs for name, s in self.samples.items()}
