"""Benchmarks (scripts and their helpers); ``bench/results`` holds what they measured.

A script run as a file (``python bench/replay.py``) has this folder first on Python's
path, where ``bench/iree.py`` would stand in for IREE's own package: the IREE spaces
then found no IREE, and their searches started without IREE's own config, the seed they
have in a live run (the replay of the Zen 3's IREE matmul read 43 and 31 trials to 95 %
on seeds 0 and 1 so, 21 and 29 with it). Importing this package takes the folder off
the path again; its modules are imported as ``bench.<name>``.
"""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
