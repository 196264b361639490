"""The compiler side for IREE: the records, read back into MLIR.

:func:`lookup` asks the database for the best config of a workload on a device:
this exact device first, then the same hardware under another IREE or driver version,
then (matmul) the same contraction tuned with another epilogue, since IREE fuses the
epilogue into the root op's dispatch without changing its tiles.
:func:`annotate_mlir` writes the found configs into a user's module as
``compilation_info`` (what the SPIR-V pipeline honours; llvm-cpu too), and
:func:`tuning_spec` writes them as a transform-dialect tuning spec for
``iree-compile --iree-codegen-tuning-spec-path`` (llvm-cpu; SPIR-V ignores specs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from autosched.iree.linalg import Domain, domain, tensor_type
from autosched.iree.mlir import annotate, find_roots
from autosched.iree.render import compilation_info
from autosched.ops import Workload, workload
from autosched.records.base import Database
from autosched.records.choice import chosen
from autosched.records.record import Record
from autosched.space.config import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """The record a config comes from, and how it was found (``exact``, ``family``:
    same hardware, other versions; ``epilogue``: the same contraction, another epilogue)."""

    record: Record
    provenance: str

    @property
    def config(self) -> Config:
        return Config.from_json(self.record.config)


def lookup(db: Database, wl: Workload, *, target: str, device) -> Found | None:
    """The chosen record of ``wl`` for ``device`` (:func:`autosched.records.choice.chosen`),
    or None. Where IREE's own config
    (pipeline ``auto``) measured fastest, that is the answer: nothing is written."""
    candidates = [wl]
    if wl.op == "matmul":
        for ep in ("none", "bias", "bias_relu"):
            if ep != wl.params.get("epilogue", "none"):
                candidates.append(workload("matmul", M=wl.M, N=wl.N, K=wl.K, epilogue=ep))
    for i, cand in enumerate(candidates):
        for how, kw in (
            ("exact", {"device_key": device.key(target)}),
            ("family", {"device_family": device.family(target)}),
        ):
            record = chosen(db, cand.key, target=target, **kw)
            if record is not None:
                return Found(record, how if i == 0 else "epilogue")
    return None


@dataclass(frozen=True)
class Applied:
    """One root op of a user's module and the record applied to it (None: left to IREE)."""

    index: int
    op: str
    function: str
    workload: Workload | None
    found: Found | None


def annotate_mlir(text: str, *, db: Database, target: str, device) -> tuple[str, list[Applied]]:
    """``text`` with ``compilation_info`` on every root op that the records cover."""
    applied, infos = [], {}
    for root in find_roots(text):
        found = None
        if root.workload is not None:
            found = lookup(db, root.workload, target=target, device=device)
        if found is not None:
            info = compilation_info(domain(root.workload), target, found.config)
            if info:
                infos[root.index] = info
        applied.append(Applied(root.index, root.op, root.function, root.workload, found))
    return (annotate(text, infos) if infos else text), applied


# -- tuning specs ------------------------------------------------------------------------


def _operand_types(wl: Workload) -> list[str]:
    """The root op's operand types (inputs, then the init of its result) as IREE sees
    them in the dispatch: a convolution's input already padded."""
    dom: Domain = domain(wl)
    p = wl.params
    if wl.op == "matmul":
        return [tensor_type(s) for s in ((wl.M, wl.K), (wl.K, wl.N), (wl.M, wl.N))]
    if wl.op == "batch_matmul":
        b, m, n, k = (p[x] for x in ("b", "m", "n", "k"))
        return [tensor_type(s) for s in ((b, m, k), (b, k, n), (b, m, n))]
    if wl.op in ("conv2d", "depthwise_conv2d"):
        data = list(wl.data_shape)
        hi, wi = (1, 2) if p["layout"] == "NHWC" else (2, 3)
        data[hi] += 2 * p["pad"]
        data[wi] += 2 * p["pad"]
        return [tensor_type(data), tensor_type(wl.weight_shape), tensor_type(wl.out_shape)]
    del dom
    return [tensor_type((p["rows"], p["cols"])), tensor_type((p["rows"],))]


def _matcher(i: int, wl: Workload, dom: Domain, info: str) -> list[str]:
    """Apply ``info`` to every root op of ``wl``'s kind (``dom``: its domain) whose
    operand types are ``wl``'s. The checks and the annotation are a sequence that stops
    at the first failed check (another shape), inside one that suppresses that failure
    (and alone would go on)."""
    # A convolution reaches IREE's configuration generalized (a linalg.generic): its
    # operand types tell it from the other generics.
    ops = [dom.op, "linalg.generic"] if dom.kind == "conv" else [dom.op]
    names = ", ".join(f'"{n}"' for n in ops)
    lines = [
        f"    %ops{i} = transform.structured.match ops{{[{names}]}} in %variant"
        " : (!transform.any_op) -> !transform.any_op",
        f"    transform.foreach %ops{i} : !transform.any_op {{",
        "    ^bb0(%each: !transform.any_op):",
        "      transform.sequence %each : !transform.any_op failures(suppress) {",
        "      ^bb1(%one: !transform.any_op):",
        "        transform.sequence %one : !transform.any_op failures(propagate) {",
        "        ^bb2(%op: !transform.any_op):",
    ]
    if dom.kind == "reduction":
        # A row op's root is its first reduction, of the rows alone (one input): a
        # softmax's or layer norm's later generics read the row's statistics too, and
        # IREE refuses a dispatch with a config on two of its ops.
        lines += [
            "          transform.match.structured %op : !transform.any_op {",
            "          ^bb3(%s: !transform.any_op):",
            "            %n_in = transform.match.structured.num_inputs %s"
            " : (!transform.any_op) -> !transform.param<i64>",
            "            %c_one = transform.param.constant 1 : i64 -> !transform.param<i64>",
            "            transform.match.param.cmpi eq %n_in, %c_one : !transform.param<i64>",
            "          }",
        ]
    for k, t in enumerate(_operand_types(wl)):
        lines += [
            f"          %v{k} = transform.get_operand %op[{k}] : (!transform.any_op) -> !transform.any_value",
            f"          transform.iree.match.cast_compatible_type %v{k} = {t} : !transform.any_value",
        ]
    lines += [
        f"          %config = transform.param.constant {info} -> !transform.any_param",
        '          transform.annotate %op "compilation_info" = %config'
        " : !transform.any_op, !transform.any_param",
        "        }",
        "      }",
        "    }",
    ]
    return lines


def tuning_spec(db: Database, *, device, target: str = "iree-llvm-cpu") -> tuple[str, list[Found]]:
    """A transform-dialect tuning spec with the best tuned config of every workload the
    database holds for ``device``, and the records used.

    The spec is one named sequence (the entry point), not a matcher and an action per
    config for ``foreach_match``: iree-compile 3.13 loads a spec under a lock on the
    first executable that asks for it, and the parser verifies a module's named
    sequences in parallel on the pass manager's thread pool, whose waiting worker may
    pick up another executable's configuration and wait for that same lock: the build
    hangs (5 of some 3,000 builds of a two-dispatch module on two cores; none of 2,400
    with the spec so written). One isolated op per block is verified in line. A later
    annotation replaces an earlier one, so the configs are written last first: where
    two match one op, the first (as ``foreach_match`` would pick) is applied.
    """
    keys: dict[str, Workload] = {}
    for rec in db.query(target=target, device_family=device.family(target), status="ok"):
        if rec.workload_key not in keys:
            from autosched.ops import workload_from_json

            keys[rec.workload_key] = workload_from_json(rec.workload)
    blocks, used = [], []
    for wl in keys.values():
        found = lookup(db, wl, target=target, device=device)
        if found is None or found.provenance == "epilogue":
            continue
        dom = domain(wl)
        info = compilation_info(dom, target, found.config)
        if info is None:
            continue
        blocks.append(_matcher(len(blocks), wl, dom, info))
        used.append(found)
    lines = [
        "module attributes {transform.with_named_sequence} {",
        "  transform.named_sequence @__kernel_config(%variant: !transform.any_op "
        "{transform.readonly}) -> !transform.any_op attributes "
        "{iree_codegen.tuning_spec_entrypoint} {",
    ]
    for block in reversed(blocks):
        lines += block
    lines += ["    transform.yield %variant : !transform.any_op", "  }", "}"]
    return "\n".join(lines) + "\n", used
