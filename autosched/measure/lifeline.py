"""Children that die with their parent.

Build workers and measurement children are started by a tuning process or a farm
worker; if that parent is SIGKILLed, nothing tells them, and a child that waits on a
queue or runs a hung kernel would live on as an orphan. Each child watches its parent
instead and exits as soon as it is gone (it has been re-parented).
"""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(poll_s: float = 0.5) -> None:
    """Start a daemon thread that ends this process when its parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="autosched-lifeline", daemon=True).start()
