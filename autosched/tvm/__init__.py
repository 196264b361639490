"""TVM integration: Relax builds that apply autosched's tuned schedules.

>>> import autosched.tvm
>>> ex = autosched.tvm.build(relax_mod, target="llvm", db="records.db")   # doctest: +SKIP
>>> vm = tvm.relax.VirtualMachine(ex.executable, tvm.cpu())             # doctest: +SKIP
"""

from autosched.tvm.database import RecordsDatabase, apply_to_prim_func, build, legalize_and_fuse

__all__ = ["RecordsDatabase", "apply_to_prim_func", "build", "legalize_and_fuse"]
