"""Children that die with their parent, and where they are started from.

Build workers and measurement children are started by a tuning process or a farm
worker; if that parent is SIGKILLed, nothing tells them, and a child that waits on a
queue or runs a hung kernel would live on as an orphan. Each child watches its parent
instead and exits as soon as it is gone. They are forked by a fork server
(:func:`child_context`), so each watches the process that asked for it, not the server.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import threading
import time


def exit_with_parent(poll_s: float = 0.5, parent: int | None = None) -> None:
    """Start a daemon thread that ends this process when ``parent`` is gone (default: its
    parent process).

    A child forked by the fork server names the process that started it: its own parent
    is the server, which lives as long as any child it forked holds the server's
    lifeline, so a child that watched the server would keep it, and itself, alive.
    """
    if parent is None:
        parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if _gone(parent):
                os._exit(1)

    threading.Thread(target=watch, name="autosched-lifeline", daemon=True).start()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie not yet reaped has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: whether the pid still names a process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


GUARD = (
    "autosched's build and measurement children import the main module again (they "
    "start from a fork server); a script that tunes must do so under an "
    '`if __name__ == "__main__":` guard'
)


def importing_main() -> bool:
    """Whether this process is a child importing the main module as it starts (spawn or
    a fork server's preload): a script without a main guard runs its tune again there."""
    return bool(getattr(mp.current_process(), "_inheriting", False))


def child_context(*, tvm: bool) -> mp.context.BaseContext:
    """Where build workers and measurement children are started from.

    A fork server: this process's first child starts it, and every later child is forked
    from it. With ``tvm``, a server this call starts imports TVM first, so a child does
    not import it again: TVM's import takes about 3.5 s of a core, which spawned children
    each paid, two build workers and an llvm measurement child per tune (the server holds
    no threads, so forking it is safe). The server ends with this process; it is stopped
    at exit (:func:`_stop_fork_server`), so it never outlives it. Spawn where there is no
    fork server.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if tvm:
        ctx.set_forkserver_preload(["__main__", "tvm"])  # Python's default, and TVM
    return ctx


@atexit.register
def _stop_fork_server() -> None:
    """Close this process's fork server, if it started one, and wait for it (it would see
    this process go, a moment later). Python's stop is private; without it the server
    ends on its own (and where there is no fork server there is none to stop)."""
    with contextlib.suppress(ImportError, OSError, ChildProcessError):
        from multiprocessing import forkserver

        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop is not None:
            stop()
