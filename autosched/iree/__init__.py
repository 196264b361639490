"""IREE as a code generation backend: autosched's operators as Linalg, compiled by
``iree-compile`` for its llvm-cpu and Vulkan (SPIR-V) backends.

The data path is the tuner's own: a space read off the root Linalg op
(:mod:`autosched.space.iree`), builds that render a config as a ``compilation_info``
attribute at the edge (:mod:`autosched.iree.render`, :mod:`autosched.iree.toolchain`),
measurements through ``iree.runtime`` in the killable worker
(:mod:`autosched.measure.iree_runner`), the same records; then the compiler side reads
the records back into user MLIR (:mod:`autosched.iree.annotate`).

Nothing here imports IREE at module level: the ``iree`` extra is optional.
"""

from __future__ import annotations

IREE_TARGETS = ("iree-llvm-cpu", "iree-vulkan")
