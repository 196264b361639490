"""Shared by the model tests: small torch modules imported into Relax, and a built
function checked against its workload's reference."""

from __future__ import annotations

import numpy as np
import torch


def relax_of(module: torch.nn.Module, shape: tuple[int, ...]):
    """(Relax module with bound weights, a random input, the eval-mode torch module):
    ``torch.export`` then TVM's Relax front end. Batch-norms get running statistics
    that are not the identity."""
    from tvm.relax.frontend.torch import from_exported_program

    torch.manual_seed(0)
    module = module.eval()
    for bn in [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]:
        bn.running_mean.uniform_(-0.5, 0.5)  # BN arithmetic that is not the identity
        bn.running_var.uniform_(0.5, 1.5)
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    ep = torch.export.export(module, (torch.from_numpy(x),))
    return from_exported_program(ep, keep_params_as_input=False), x, module


def assert_matches(wl, lib, inputs: dict, expected: dict) -> None:
    """``lib["main"]`` on ``inputs`` (outputs pre-filled with NaN) writes ``expected``
    within ``wl``'s tolerance."""
    import tvm

    rtol, atol = wl.tolerance()
    args = {
        s.name: tvm.runtime.tensor(
            inputs[s.name] if s.role == "input" else np.full(s.shape, np.nan, s.dtype)
        )
        for s in wl.tensor_specs()
    }
    lib["main"](*args.values())
    for name, want in expected.items():
        np.testing.assert_allclose(args[name].numpy(), want, rtol=rtol, atol=atol)
