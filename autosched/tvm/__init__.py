"""TVM integration: a model's tasks, and Relax builds that apply autosched's records.

>>> import autosched.tvm
>>> tasks = autosched.tvm.extract_tasks(relax_mod)                        # doctest: +SKIP
>>> built = autosched.tvm.build(relax_mod, target="llvm", db="records.db")  # doctest: +SKIP
>>> y = built(x, w, b)          # main on the host CPU, numpy in and out    # doctest: +SKIP
>>> built.applied               # what got an autosched schedule            # doctest: +SKIP
"""

from autosched.tvm.database import RecordsDatabase, RelaxBuild, build
from autosched.tvm.tasks import ModelTask, default_schedule, extract_tasks, fuse

__all__ = [
    "ModelTask",
    "RecordsDatabase",
    "RelaxBuild",
    "build",
    "default_schedule",
    "extract_tasks",
    "fuse",
]
