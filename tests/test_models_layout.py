"""The layout pass on models whose imports TVM 0.27 mishandled: each builds to what torch
eager computes (tests of the fixes in autosched.tvm.layout).

Real parts: torch.export + TVM's Relax front end for tiny models with random weights,
TVM codegen for llvm.
"""

from __future__ import annotations

import numpy as np
import torch

import autosched.tvm
from autosched.tvm.tasks import extract_tasks
from tests.relax_models import relax_of as _relax

nn = torch.nn


class TorchAttention(nn.Module):
    """PyTorch's own multi-head attention and layer norm: its export squeezes a
    negative axis, on which TVM 0.27's ConvertLayout fails with std::bad_alloc."""

    def __init__(self, d: int = 24, heads: int = 3) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        y = self.ln(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


def test_torch_multi_head_attention_becomes_tasks_and_builds_correctly(host):
    mod, x, module = _relax(TorchAttention(), (1, 7, 24))
    tasks = extract_tasks(mod, limits=host.limits)
    families = {t.family for t in tasks}
    assert "contraction" in families and "rowwise" in families, [t.name for t in tasks]
    built = autosched.tvm.build(mod, "llvm", db=None, shipped=False)
    (got,) = built(x)
    eager = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)


class UpSampler(nn.Module):
    """A U-Net's up path: a transposed convolution beside a convolution's output."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.out = nn.Conv2d(7, 2, 1)

    def forward(self, x):
        return self.out(torch.cat([x, self.up(torch.relu(self.down(x)))], 1))


def test_a_transposed_convolution_keeps_its_layout_and_builds_correctly(host):
    """Convolutions go channels-last; a transposed one stays NCHW (TVM 0.27 lowers it in
    no other layout: following its input to NHWC, the build failed in VM codegen)."""
    mod, x, module = _relax(UpSampler(), (1, 3, 12, 12))
    convs = [t for t in extract_tasks(mod, limits=host.limits) if "conv2d" in t.name]
    assert any("conv2d_transpose" in t.name for t in convs), [t.name for t in convs]
    built = autosched.tvm.build(mod, "llvm", db=None, shipped=False)
    (got,) = built(x)
    eager = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)
