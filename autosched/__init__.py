"""autosched: ML-guided autotuning and schedule search for tensor operators."""

from __future__ import annotations

__version__ = "0.1.0"
