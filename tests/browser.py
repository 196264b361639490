"""Pages rendered as a person sees them: Debian's headless Chromium takes a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np


def chromium() -> str:
    """The headless browser the test suite's install brings (Debian's chromium)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError(
        "no headless chromium on PATH; the test install brings it "
        "(EXTRAS=test bash scripts/install.sh, or apt-get install -y chromium)"
    )


def screenshot(page: Path, png: Path, *, width: int = 1280, height: int = 2400) -> np.ndarray:
    """Render ``page`` (a local HTML file) and return the screenshot's RGB pixels (0..1)."""
    import matplotlib.image

    subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={png.parent / (png.stem + '-profile')}",
            f"--screenshot={png}",
            f"--window-size={width},{height}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    assert png.is_file() and png.stat().st_size > 10_000
    image = matplotlib.image.imread(png)[..., :3]
    assert image.shape[:2] == (height, width)
    return image


def chart_blue(image: np.ndarray) -> int:
    """Pixels of the charts' first colour (matplotlib's blue): lines and markers drawn."""
    return int(np.all(np.abs(image - np.array([0x1F, 0x77, 0xB4]) / 255) < 0.06, axis=-1).sum())
