"""Questions for the GPU asked in a short-lived child process: is the cuda backend usable, and
who else is using the GPU.

Asking in the parent would load CuPy, the CUDA driver and NVML into the process that supervises
a whole run (about 200 MB, and whatever those libraries keep per process for as long as it
lives). The workers and the NVML helper are the only processes of a run that touch the GPU; the
parent stays a plain Python program.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

PROBE_TIMEOUT_S = 60.0
"""How long a probe may take: importing CuPy and initializing the driver, on a loaded host."""


def _answer(conn: Connection, question: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", question(*args)))
    except Exception as exc:  # the parent says what failed; the child's traceback is noise
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def ask(question: Callable[..., Any], *args: Any, what: str) -> tuple[Any, str]:
    """``(answer, "")`` from ``question(*args)`` run in a spawned child (``question`` must be a
    module-level function), or ``(None, why)`` when the child could not answer. ``what`` names
    the question in that reason. Never raises."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_answer, args=(child, question, args), name="gpurace-probe",
                       daemon=True)
    try:
        proc.start()
    except Exception as exc:  # OSError, or a question that does not pickle
        parent.close()
        child.close()
        return None, f"{what} could not start a process: {exc}"
    child.close()
    try:
        if not parent.poll(PROBE_TIMEOUT_S):
            return None, f"{what} gave no answer within {PROBE_TIMEOUT_S:g} s"
        status, answer = parent.recv()
        return (answer, "") if status == "ok" else (None, f"{what} failed: {answer}")
    except (EOFError, OSError):
        proc.join(5)
        return None, f"{what} died (exit code {proc.exitcode})"
    finally:
        parent.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


@functools.cache
def cuda_state() -> tuple[bool, str, list[str | None], list[str]]:
    """What the one probe says: whether the cuda backend can run here and why not, the UUIDs of
    the GPUs CUDA shows this process (in CUDA's order), and those of the GPUs NVML sees that
    CUDA_VISIBLE_DEVICES leaves it, usable or not (a GPU that needs a reset is missing from the
    first list only). Never raises. Asked once per process: the pytest plugin makes a runner
    per scenario variant, and a child that imports CuPy takes a second or two."""
    if importlib.util.find_spec("cupy") is None:
        # Nothing to load: asking here costs nothing and says what to install.
        from kvcore.device import cuda_available

        return (*cuda_available(), [], [])
    answer, why = ask(_cuda_state, what="the CUDA probe")
    return tuple(answer) if answer is not None else (False, why, [], [])  # type: ignore[return-value]


def _cuda_state() -> tuple[bool, str, list[str | None], list[str]]:
    """In the probe child: see :func:`cuda_state`."""
    from harness.gpu.nvml import visible_uuids
    from kvcore.device import cuda_available

    ok, why = cuda_available()
    if not ok:
        return ok, why, [], []
    from kvcore.device.cuda import device_uuids

    return ok, why, device_uuids(), visible_uuids()


def cuda_usable() -> tuple[bool, str]:
    """``(True, "N CUDA device(s)")`` when the cuda backend can run here, else ``(False, why)``.
    Never raises."""
    ok, why, _, _ = cuda_state()
    return ok, why


def gpu_uuids() -> list[str | None]:
    """The UUIDs of the GPUs CUDA shows this process, in CUDA's order (empty when none is
    usable; None for one whose UUID CUDA does not give)."""
    return cuda_state()[2]


def gpu_count() -> int:
    """How many GPUs CUDA shows this process (0 when none is usable), from the one probe."""
    return len(gpu_uuids())


def other_gpu_users(visible: str | None = None) -> tuple[list[int], str]:
    """PIDs of other processes with a compute context on the GPU a worker uses: this process's
    first GPU, or the one a lane's ``CUDA_VISIBLE_DEVICES`` value ``visible`` names; and a note
    when NVML could not tell (see :func:`harness.gpu.nvml.other_gpu_processes`). Never raises."""
    # The question runs in a child: the asker, not the child, is the process to leave out (a
    # pytest process that drove the GPU in-process is not "another user" of its own run).
    answer, why = ask(_users_seen_as, visible, os.getpid(), what="the GPU process check")
    return answer if answer is not None else ([], why)


def _users_seen_as(visible: str | None, me: int) -> tuple[list[int], str]:
    """In the probe child: the other users of the GPU a worker given ``visible`` sees first."""
    from harness.gpu.nvml import other_gpu_processes

    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return other_gpu_processes(None, None, me)
