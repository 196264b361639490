"""autosched: ML-guided autotuning and schedule search for tensor operators.

>>> import autosched
>>> wl = autosched.workload("matmul", M=512, N=512, K=512, epilogue="bias_relu")
>>> result = autosched.tune(wl, trials=64)      # doctest: +SKIP
>>> result.best.gflops, result.best.config      # doctest: +SKIP
"""

from __future__ import annotations

from autosched._version import __version__
from autosched.compiler import compile
from autosched.errors import AutoschedError, InvalidInputError
from autosched.ops import workload
from autosched.tuning.tune import TuneResult, tune

__all__ = [
    "AutoschedError",
    "InvalidInputError",
    "TuneResult",
    "__version__",
    "compile",
    "tune",
    "workload",
]
