"""Preloaded by the fork server (:func:`autosched.measure.lifeline.child_context`): the
server removes its parent's multiprocessing folder when it ends after the parent died.

The parent's folder (``pymp-*`` under the temporary directory) holds the server's
listening socket. A parent that exits removes it itself; a parent that is SIGKILLed
cannot, and the folder stayed behind, one per killed tune or farm worker. The server
sees its parent go (its lifeline pipe closes) and exits normally, so its exit handler
can remove the folder then. The parent names the folder in :data:`ENV` (``pid:path``)
before the server starts; a process removes it only where it is that parent's direct
child (the server, not a child the server forks) and that parent is gone.
"""

from __future__ import annotations

import atexit
import os
import shutil

ENV = "AUTOSCHED_FORK_SERVER_DIR"


def _parent_folder() -> tuple[int, str] | None:
    """(parent pid, folder) where this process is the fork server that the parent named
    in :data:`ENV`; else None."""
    pid, sep, path = os.environ.get(ENV, "").partition(":")
    if not sep or not pid.isdigit() or int(pid) != os.getppid():
        return None
    return int(pid), path


def _remove(server: int, parent: int, path: str) -> None:
    from autosched.measure.lifeline import _gone

    if os.getpid() == server and _gone(parent):  # not a forked child; the parent died
        shutil.rmtree(path, ignore_errors=True)


_named = _parent_folder()
if _named is not None and os.path.basename(_named[1]).startswith("pymp-"):
    atexit.register(_remove, os.getpid(), *_named)
