"""Runs of a watched program forked from a process that has its libraries imported already.

Each run of a watched program is a process of its own, and most of a PyTorch program's start is
not the program: the interpreter, ``import torch`` and what PyTorch imports lazily take seconds
before the program's first line runs. Runs after the first start from a *fork server*: a
process of the program's own interpreter (with its flags and the watch's environment) that
imports the library modules the first run imported (its standard library and installed
packages; never the program's own modules), without
touching CUDA (a CUDA context does not survive a fork; each run makes its own, as a process of
its own does). A server whose imports initialised the CUDA driver says so, and is not used.
For each run the server forks a child that becomes its own session, takes the run's standard
output and error (pipes the watch passes it) and the watch's standard input, and runs
:mod:`harness.capture.boot` as a fresh interpreter would; the server reports the child's pid at
once and its exit status when it ends.

The watch's side is :class:`ForkServer`; what it starts behaves as a ``subprocess.Popen`` of
the same command does for the watch (``pid``, ``wait``, ``returncode``, ``stdout``, ``stderr``;
the child's process group is its pid, so a timeout stops it and what it started). A server that
cannot start, or dies, is said once, and the runs go on as fresh processes.

Run as ``python -m harness.capture.forkserver FD`` with ``FD`` one end of a Unix socket pair,
whose first line names the modules to import (``{"preload": [...]}``); it imports nothing of
gpurace but the boot.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import IO, Any

_MAX_MESSAGE = 1 << 20
_CUDA_ERROR_NOT_INITIALIZED = 3


# ---- the server, in the program's interpreter ------------------------------------------------

def serve(fd: int) -> int:
    """Import the modules the first message names, say ready, then fork a run for each request
    until the socket closes."""
    sock = socket.socket(fileno=fd)
    buffered = b""
    while b"\n" not in buffered:
        data = sock.recv(_MAX_MESSAGE)
        if not data:
            return 0
        buffered += data
    line, buffered = buffered.split(b"\n", 1)
    preloaded = []
    for name in json.loads(line)["preload"]:
        if name in sys.modules:  # a package's import brought it in already
            preloaded.append(name)
            continue
        try:
            importlib.import_module(name)
            preloaded.append(name)
        except Exception:  # the run imports it itself, and says why if it cannot
            pass
    # One thread of ours only: a process that forks with threads running may hand its
    # children a lock held for ever. A child's end wakes the loop through the signal's wake-up
    # pipe instead. Threads a library starts when imported (a BLAS's pool) are its own to make
    # safe across a fork, as they do with at-fork handlers; Python 3.12 and later would warn
    # of them at every fork, into the watch's output.
    warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                            category=DeprecationWarning)
    wake_r, wake_w = os.pipe()
    for end in (wake_r, wake_w):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # handled, so that its byte is written

    def send(message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(json.dumps(message).encode() + b"\n")

    runs: set[int] = set()  # only the runs are reaped: a library's own children are its own

    def reap() -> None:
        with contextlib.suppress(OSError):
            while os.read(wake_r, 4096):
                pass
        for pid in list(runs):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                runs.discard(pid)
                continue
            if done:
                runs.discard(pid)
                send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    send({"ready": preloaded, "pid": os.getpid(), "cuda_initialized": _cuda_initialized()})
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            reap()
        if sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except OSError:
            break
        if not data:
            break
        buffered += data
        if b"\n" not in buffered:
            for extra in fds:
                os.close(extra)
            continue
        line, buffered = buffered.split(b"\n", 1)
        request = json.loads(line)
        if len(fds) not in (2, 3):
            for extra in fds:
                os.close(extra)
            send({"refused": "a run needs its standard output and error"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(sock, fds, request, (wake_r, wake_w))  # never returns
        runs.add(pid)
        for extra in fds:
            os.close(extra)
        send({"pid": pid})
        reap()  # a run that ended at once: its signal came before it was a run of ours
    return 0


def _cuda_initialized() -> bool:
    """Whether this process has initialised the CUDA driver (which a forked child cannot
    use): a driver call before ``cuInit`` answers CUDA_ERROR_NOT_INITIALIZED, and asking
    initialises nothing. False where there is no driver."""
    import ctypes
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_ERROR_NOT_INITIALIZED


def _child(sock: socket.socket, fds: list[int], request: dict[str, Any],
           wake: tuple[int, int]) -> None:
    """The forked run: its own session, its own output, the run's environment and folder, and
    the boot's main, ending as the boot's ``__main__`` ends."""
    code = 1
    try:
        sock.close()
        # The server's way of hearing of its children is not the run's.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for end in wake:
            os.close(end)
        os.setsid()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.dup2(fds[2] if len(fds) > 2 else os.open(os.devnull, os.O_RDONLY), 0)
        for extra in fds:
            os.close(extra)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from harness.capture import boot
        code = boot.main(list(request["argv"]))
        boot.wind_down()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the boot's own failure: said as a fresh interpreter would
        import traceback
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


# ---- the watch's side ----------------------------------------------------------------------

class Forked:
    """One run the server forked, as the watch uses a ``Popen``."""

    def __init__(self, server: ForkServer, pid: int, stdout: IO[bytes],
                 stderr: IO[bytes]) -> None:
        self._server = server
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.exit_code(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        self.returncode = code
        return code


class ForkServer:
    """The watch's end of a fork server: start it, start runs from it, close it."""

    def __init__(self, python: str, flags: Sequence[str], env: dict[str, str],
                 modules: Sequence[str], ready_s: float = 120.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._closed = False
        try:
            self._proc = subprocess.Popen(
                [python, *flags, "-m", "harness.capture.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            theirs.close()
        threading.Thread(target=self._read, daemon=True).start()
        with contextlib.suppress(OSError):  # a server already gone is said just below
            self._sock.sendall(json.dumps({"preload": list(modules)}).encode() + b"\n")
        ready = self._reply(ready_s)
        if ready is None or "ready" not in ready:
            self.close()
            raise OSError(f"the fork server did not start ({ready or 'no answer'})")
        if ready.get("cuda_initialized"):
            self.close()
            raise OSError("a module the fork server imported initialised CUDA, which a "
                          "forked run cannot use")
        self.preloaded: list[str] = list(ready["ready"])

    def _read(self) -> None:
        buffered = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._changed:
                    self._closed = True
                    self._changed.notify_all()
                return
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                message = json.loads(line)
                with self._changed:
                    if "exit" in message:
                        self._exits[int(message["exit"])] = int(message["code"])
                    else:
                        self._replies.append(message)
                    self._changed.notify_all()

    def _reply(self, timeout: float) -> dict[str, Any] | None:
        with self._changed:
            self._changed.wait_for(lambda: self._replies or self._closed, timeout)
            return self._replies.pop(0) if self._replies else None

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def start(self, argv: Sequence[str], env: dict[str, str], cwd: str) -> Forked:
        """Fork a run of the boot with ``argv`` (its own arguments, after ``-m
        harness.capture.boot``); OSError when the server cannot."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._lock:
                message = json.dumps({"argv": list(argv), "env": env, "cwd": cwd}).encode()
                # The watch's own standard input, as a fresh process would inherit it.
                ours = [0] if _usable(0) else []
                socket.send_fds(self._sock, [message + b"\n"], [out_w, err_w, *ours])
                reply = self._reply(30.0)
        except OSError:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if reply is None or "pid" not in reply:
            os.close(out_r)
            os.close(err_r)
            raise OSError(f"the fork server did not start the run ({reply or 'no answer'})")
        return Forked(self, int(reply["pid"]), os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """The run's exit code as ``Popen.returncode`` gives it (negative: the signal), once it
        ended; None when it did not within ``timeout``. A server gone with its run still
        unreported is said as the run killed (-9)."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._closed, timeout)
            if pid in self._exits:
                return self._exits[pid]
            return -9 if self._closed else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _usable(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
