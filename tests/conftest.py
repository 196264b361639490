from __future__ import annotations

import numpy as np
import pytest

from autosched.measure.device import select_device
from autosched.measure.runner import TestData


@pytest.fixture(scope="session")
def device():
    """The real OpenCL device (PoCL's CPU device on CI machines)."""
    return select_device()


def make_data(workload, seed: int = 0) -> TestData:
    inputs = workload.make_inputs(np.random.default_rng(seed))
    rtol, atol = workload.tolerance()
    return TestData(workload.key, inputs, workload.reference(inputs), rtol, atol)
