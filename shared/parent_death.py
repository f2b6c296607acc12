"""A spawned process's tie to its parent: on Linux the kernel SIGTERMs it when the parent dies, so no orphans.

A gateway's local workers (``workers.main``) and its sibling gateway processes
(``gateway.sibling``) call ``die_with_parent`` first thing. The kernel ties the
signal to the parent's thread that spawned the child, so a parent spawns them
from the thread that lives as long as it does (its event loop thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None) -> None:
    """For a process its parent spawned (``parent_pid``): ask Linux to SIGTERM us when the parent exits, and exit
    at once if it is gone already. None: a process started on its own outlives the shell that started it."""
    if parent_pid is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        sys.exit(f"parent {parent_pid} is gone; not starting")
