"""Ctrl-C that a tuning loop never loses, and that never lands in somebody else's code;
SIGTERM (what ``kill``, systemd, Docker, Kubernetes and batch schedulers send to stop a
job) taken the same way.

Python raises KeyboardInterrupt wherever the main thread happens to be when SIGINT
lands. Inside a finaliser or a garbage-collector callback (a Dask future's ``__del__``,
the in-process scheduler's GC diagnosis) Python reports it as "Exception ignored" with a
traceback and goes on: the job ran to its end, or the callback's own state was left half
updated and its next call failed with a second traceback. So while a loop runs,
:func:`latched` only records the first SIGINT, and :func:`check`, called once per turn of
the loop (every wait in it is bounded), raises KeyboardInterrupt there, in the loop's own
code. A second SIGINT before that raises at once, as Python's own handler would.

SIGTERM, left at its default, ended the process on the spot: the batch in flight was
lost as now, but the measurement child's folder of compiled kernels stayed in the
temporary directory until the next tune swept it, and nothing said what had happened.
While a loop runs it is latched too, and :func:`check` raises :class:`Terminated` (a
KeyboardInterrupt, so every cleanup for Ctrl-C runs for it).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a tuning loop ran."""


_tripped: int = 0  # the first signal latched (0: none)


def _handler(signum, frame) -> None:
    global _tripped
    if _tripped:  # pressed again: the user will not wait for the loop's next turn
        raise _interrupt(_tripped)
    _tripped = signum


def _interrupt(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _ours(signum: int) -> bool:
    """Whether ``signum`` is at Python's own handling: the default Ctrl-C handler for
    SIGINT (neither ignored nor taken by an embedding program), the default action for
    SIGTERM."""
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    return signal.getsignal(signum) is default


@contextmanager
def latched() -> Iterator[None]:
    """Record SIGINT and SIGTERM while the block runs, each where Python's own handling
    of it is in place, in the main thread."""
    global _tripped
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in (signal.SIGINT, signal.SIGTERM) if _ours(s)]
    if not taken:
        yield
        return
    _tripped = 0
    previous_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        # after a second signal, a KeyboardInterrupt that landed in a finaliser is not news
        if not (_tripped and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous_hook(unraisable)

    previous = {s: signal.signal(s, _handler) for s in taken}
    sys.unraisablehook = hook
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sys.unraisablehook = previous_hook
        _tripped = 0


def check() -> None:
    """Raise KeyboardInterrupt if SIGINT came since :func:`latched` began, or
    :class:`Terminated` if SIGTERM did."""
    if _tripped:
        raise _interrupt(_tripped)
