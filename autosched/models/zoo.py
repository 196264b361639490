"""Models built in-process with seeded random weights (nothing is downloaded).

Each builder returns ``(module in eval mode, tuple of example inputs)``, the factory
contract of :func:`autosched.models.load_model`, so this file is itself a factory file:
``autosched/models/zoo.py:resnet18`` (full size) or ``...:tiny_resnet18`` (for tests).

- :func:`build_resnet18`: ResNet-18 written out (BasicBlocks, batch-norm), 1x3x224x224.
- :func:`build_bert_layer`: a BERT-base encoder layer (post-LN, erf GELU), seq 128.
- :func:`build_gpt2_block`: a GPT-2 decoder block (pre-LN, causal mask, tanh GELU), seq 128.
- :func:`build_vit`: a ViT-S/16 made of PyTorch's own modules (``nn.TransformerEncoder``,
  ``nn.MultiheadAttention``): a 16x16 stride-16 patch convolution, a class token, 12
  pre-LN encoder layers, 1x3x224x224. Library modules export differently from the
  hand-written attention above (a negative ``squeeze``, a fused in-projection).

This module imports torch at the top: import it only where torch is wanted.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016): a 7x7 stem, four stages of two basic blocks, a classifier."""

    def __init__(self, *, width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        stages, cin = [], width
        for i, cout in enumerate(width * m for m in (1, 2, 4, 8)):
            stride = 1 if i == 0 else 2
            stages += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class _Attention(nn.Module):
    """Multi-head self-attention written out (matmuls and softmax), optionally causal."""

    def __init__(self, hidden: int, heads: int, seq: int, *, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.causal = causal
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(x).split(h, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        if self.causal:
            floor = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype)
            scores = torch.where(self.mask[:s, :s], scores, floor)
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class BertLayer(nn.Module):
    """A BERT encoder layer: attention, add & LayerNorm, erf-GELU feed-forward, add & LayerNorm."""

    def __init__(
        self, *, hidden: int = 768, heads: int = 12, ffn: int = 3072, seq: int = 128
    ) -> None:
        super().__init__()
        self.attn = _Attention(hidden, heads, seq, causal=False)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Gpt2Block(nn.Module):
    """A GPT-2 decoder block: pre-LN causal attention and a tanh-GELU MLP, both residual."""

    def __init__(self, *, hidden: int = 768, heads: int = 12, seq: int = 128) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = _Attention(hidden, heads, seq, causal=True)
        self.ln2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class ViT(nn.Module):
    """A vision transformer of PyTorch's own modules; the head reads the class token."""

    def __init__(
        self, *, image: int, patch: int, hidden: int, heads: int, depth: int, classes: int
    ) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, hidden, patch, stride=patch)
        tokens = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.randn(1, 1, hidden) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens, hidden) * 0.02)
        layer = nn.TransformerEncoderLayer(
            hidden,
            heads,
            4 * hidden,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.patch(x).flatten(2).transpose(1, 2)
        y = torch.cat([self.cls.expand(y.shape[0], -1, -1), y], 1) + self.pos
        return self.head(self.norm(self.encoder(y))[:, 0])


class LstmEncoder(nn.Module):
    """A speech- or text-style encoder: a stacked LSTM over the sequence, a linear head
    on every step (batch first)."""

    def __init__(self, *, features: int, hidden: int, layers: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def _randomise_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give batch-norm statistics and affine parameters non-trivial values, so folding them
    is tested (fresh ones are the identity)."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def build_resnet18(
    *, seed: int, width: int = 64, image: int = 224, classes: int = 1000, batch: int = 1
) -> Built:
    """ResNet-18 with random weights; input ``batch x 3 x image x image``."""
    torch.manual_seed(seed)
    model = ResNet18(width=width, classes=classes)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _randomise_norms(model, gen)
    example = torch.randn(batch, 3, image, image, generator=gen)
    return model.eval(), (example,)


def build_bert_layer(
    *,
    seed: int,
    hidden: int = 768,
    heads: int = 12,
    ffn: int = 3072,
    seq: int = 128,
    batch: int = 1,
) -> Built:
    """A BERT(-base by default) encoder layer with random weights; input ``batch x seq x hidden``."""
    torch.manual_seed(seed)
    model = BertLayer(hidden=hidden, heads=heads, ffn=ffn, seq=seq)
    gen = torch.Generator().manual_seed(seed)
    return model.eval(), (torch.randn(batch, seq, hidden, generator=gen),)


def build_gpt2_block(
    *, seed: int, hidden: int = 768, heads: int = 12, seq: int = 128, batch: int = 1
) -> Built:
    """A GPT-2(-small by default) decoder block with random weights; input ``batch x seq x hidden``."""
    torch.manual_seed(seed)
    model = Gpt2Block(hidden=hidden, heads=heads, seq=seq)
    gen = torch.Generator().manual_seed(seed)
    return model.eval(), (torch.randn(batch, seq, hidden, generator=gen),)


def build_vit(
    *,
    seed: int,
    image: int = 224,
    patch: int = 16,
    hidden: int = 384,
    heads: int = 6,
    depth: int = 12,
    classes: int = 1000,
    batch: int = 1,
) -> Built:
    """A ViT(-S/16 by default) with random weights; input ``batch x 3 x image x image``."""
    torch.manual_seed(seed)
    model = ViT(image=image, patch=patch, hidden=hidden, heads=heads, depth=depth, classes=classes)
    gen = torch.Generator().manual_seed(seed)
    return model.eval(), (torch.randn(batch, 3, image, image, generator=gen),)


def build_lstm(
    *,
    seed: int,
    steps: int = 32,
    features: int = 80,
    hidden: int = 256,
    layers: int = 2,
    classes: int = 32,
    batch: int = 1,
) -> Built:
    """An LSTM encoder with random weights; input ``batch x steps x features``."""
    torch.manual_seed(seed)
    model = LstmEncoder(features=features, hidden=hidden, layers=layers, classes=classes)
    gen = torch.Generator().manual_seed(seed)
    return model.eval(), (torch.randn(batch, steps, features, generator=gen),)


# Factories (``zoo.py:NAME``): the benchmark's sizes and tiny ones for tests.
def resnet18() -> Built:
    return build_resnet18(seed=0)


def bert_layer() -> Built:
    return build_bert_layer(seed=0)


def gpt2_block() -> Built:
    return build_gpt2_block(seed=0)


def tiny_resnet18() -> Built:
    return build_resnet18(seed=0, width=8, image=32, classes=10)


def tiny_bert_layer() -> Built:
    return build_bert_layer(seed=0, hidden=64, heads=4, ffn=128, seq=16)


def tiny_gpt2_block() -> Built:
    return build_gpt2_block(seed=0, hidden=64, heads=4, seq=16)


def vit() -> Built:
    return build_vit(seed=0)


def tiny_vit() -> Built:
    return build_vit(seed=0, image=32, patch=8, hidden=64, heads=4, depth=2, classes=10)


def lstm() -> Built:
    return build_lstm(seed=0)


def tiny_lstm() -> Built:
    return build_lstm(seed=0, steps=6, features=12, hidden=16, classes=4)


def export_onnx(module: nn.Module, example: tuple[torch.Tensor, ...], path: str | Path) -> Path:
    """Write ``module`` as an ONNX file (:func:`autosched.models.torch_frontend.export_onnx`:
    TorchScript's exporter, opset 17, inputs ``input0``, ..., outputs ``output0``, ...)."""
    from autosched.models.torch_frontend import export_onnx as export

    path = Path(path)
    export(module, example, str(path))
    return path
