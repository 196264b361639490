"""TVM integration: Relax builds that apply autosched's tuned schedules.

>>> import autosched.tvm
>>> built = autosched.tvm.build(relax_mod, target="llvm", db="records.db")  # doctest: +SKIP
>>> y = built(x, w, b)          # main on the host CPU, numpy in and out    # doctest: +SKIP
>>> built.applied               # what got an autosched schedule            # doctest: +SKIP
"""

from autosched.tvm.database import RecordsDatabase, apply_to_prim_func, build, legalize_and_fuse

__all__ = ["RecordsDatabase", "apply_to_prim_func", "build", "legalize_and_fuse"]
