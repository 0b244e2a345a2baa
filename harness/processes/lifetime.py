"""A child process's life tied to its maker's: a worker, or the GPU watcher, dies with the run's
parent whatever kills the parent (SIGKILL included), and lets go of the fork server's life line
so the server ends with the parent too; and whether a process is alive."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys


def die_with_parent(parent: int) -> None:
    """Tie this process's life to the run's parent, ``parent``: whatever kills it (SIGKILL
    included) kills this one, even a worker blocked in a hung kernel, which would otherwise
    hold the GPU. The signal comes when the process that made this one dies: the parent, or
    the fork server, which ends with the parent (see :func:`leave_fork_server`). Ctrl-C is
    the parent's to handle: it stops the run and writes what finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    maker = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != maker or not pid_alive(parent):  # gone before the line above took effect
        os._exit(1)


def leave_fork_server() -> None:
    """Let go of the fork server's life line. Every child of Python's fork server holds the
    pipe end whose closing tells the server its clients are gone, so the server would live as
    long as a worker does, and a worker (hung in a kernel) as long as the server does: neither
    would end with the run's parent. A worker never asks the server for children, so it
    closes its end; the server then ends with the parent, and the parent-death signal reaches
    the worker."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # type: ignore[attr-defined]
    fd = server._forkserver_alive_fd
    if fd is not None:
        server._forkserver_alive_fd = None
        with contextlib.suppress(OSError):
            os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (someone else's counts: it is alive, not ours to
    signal). A reused pid reads as alive; callers that care compare start times."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_PR_SET_PDEATHSIG = 1
