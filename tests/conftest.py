from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autosched.measure.device import select_device
from autosched.measure.runner import TestData


@pytest.fixture(scope="session", autouse=True)
def _private_data_home(tmp_path_factory):
    """A command a test runs without --db (a refused one, say) gets the default records
    database: in a folder of the test run's, never the user's ~/.local/share."""
    home = tmp_path_factory.mktemp("data-home")
    old = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = old


@pytest.fixture(scope="session")
def device():
    """The real OpenCL device (PoCL's CPU device on CI machines)."""
    return select_device()


def marked_processes(mark: str) -> list[str]:
    """Processes whose environment carries ``mark``, except this one and its own
    children (multiprocessing's resource tracker lives as long as this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"AUTOSCHED_TEST_MARK={mark}".encode() not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != os.getpid():
            found.append(f"{entry.name}: {cmd}")
    return found


def make_data(workload, seed: int = 0) -> TestData:
    inputs = workload.make_inputs(np.random.default_rng(seed))
    rtol, atol = workload.tolerance()
    return TestData(workload.key, inputs, workload.reference(inputs), rtol, atol)


@pytest.fixture(scope="session")
def host():
    """The host CPU as TVM's llvm target sees it (limits, fingerprint)."""
    return select_device(None, target="llvm")


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server on 127.0.0.1 for this session (see tests/pg_server.py).

    Fails, never skips, when the server binaries are missing: the records suite runs
    over every backend.
    """
    from tests.pg_server import PgServer

    try:
        server = PgServer().start()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        pytest.fail(f"cannot start a PostgreSQL server for the tests: {exc} {detail}".strip())
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """The URL of a fresh, empty database on the session's server."""
    return pg_server.url(pg_server.new_database())
