"""autosched: ML-guided autotuning and schedule search for tensor operators.

>>> import autosched
>>> wl = autosched.workload("matmul", M=512, N=512, K=512, epilogue="bias_relu")
>>> result = autosched.tune(wl, trials=64)      # doctest: +SKIP
>>> result.best.gflops, result.best.config      # doctest: +SKIP
"""

from __future__ import annotations

__version__ = "0.1.0"

from autosched.compiler import compile  # noqa: E402
from autosched.errors import AutoschedError, InvalidInputError  # noqa: E402
from autosched.ops import workload  # noqa: E402
from autosched.tuner import TuneResult, tune  # noqa: E402

__all__ = [
    "AutoschedError",
    "InvalidInputError",
    "TuneResult",
    "__version__",
    "compile",
    "tune",
    "workload",
]
