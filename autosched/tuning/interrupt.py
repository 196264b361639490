"""Ctrl-C that a tuning loop never loses, and that never lands in somebody else's code.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT
lands. Inside a finaliser or a garbage-collector callback (a Dask future's ``__del__``,
the in-process scheduler's GC diagnosis) Python reports it as "Exception ignored" with a
traceback and goes on: the job ran to its end, or the callback's own state was left half
updated and its next call failed with a second traceback. So while a loop runs,
:func:`latched` only records the first SIGINT, and :func:`check`, called once per turn of
the loop (every wait in it is bounded), raises KeyboardInterrupt there, in the loop's own
code. A second SIGINT before that raises at once, as Python's own handler would.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_tripped = False


def _handler(signum, frame) -> None:
    global _tripped
    if _tripped:  # pressed again: the user will not wait for the loop's next turn
        raise KeyboardInterrupt
    _tripped = True


@contextmanager
def latched() -> Iterator[None]:
    """Record SIGINT while the block runs, if Python's own Ctrl-C handling is in place
    (the main thread, SIGINT neither ignored nor taken by the embedding program)."""
    global _tripped
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _tripped = False
    previous_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        # after a second Ctrl-C, a KeyboardInterrupt that landed in a finaliser is not news
        if not (_tripped and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous_hook(unraisable)

    signal.signal(signal.SIGINT, _handler)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook
        _tripped = False


def check() -> None:
    """Raise KeyboardInterrupt if SIGINT came since :func:`latched` began."""
    if _tripped:
        raise KeyboardInterrupt
