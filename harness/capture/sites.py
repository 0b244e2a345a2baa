"""Where in the program's own code a call came from: its ``file:line``, never a library frame.

A finding names each side by the user's line (``serve.py:41``), as a traceback would: the first
frame, walking out from the call, whose code is not PyTorch's, CuPy's, NumPy's, gpurace's own,
torch.compile's generated code or the standard library's. Whether code is the program's is
worked out once per file, and a frame's ``file:line`` once per instruction, so the walk costs
a few attribute reads a frame.

Whether code is the program's depends on its file alone, so it is remembered by file name (a
string, whose hash Python keeps). A frame's ``file:line`` is remembered by the code object's
``id``, never by the code object itself: a code object's hash is worked out from its whole
body at every call (14 µs for a 2,000-line function, measured), and a dict keyed by code
would pay that for every frame of every op. The entry keeps its code object alive, so the
``id`` cannot be handed to another.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

_HARNESS_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
LIBRARIES = frozenset({"torch", "cupy", "cupyx", "cupy_backends", "numpy", "triton", "cuda",
                       "nvidia", "functorch", "fastrlock", "typing_extensions", "_pytest",
                       "pytest", "pluggy"})
"""Installed packages whose frames are never the program's: the frameworks a source hooks and
what they call through. Any other installed package (an engine installed with pip) is."""
_GENERATED = f"{os.sep}torchinductor_"
"""A folder of torch.compile's generated code (``/tmp/torchinductor_USER``): its lines are
torch.compile's, and a kernel it launches is named by the program's line that called it."""
_files: dict[str, bool] = {}  # a code object's file name -> whether it is the program's
_stdlib: tuple[str, ...] = ()


def _stdlib_roots() -> tuple[str, ...]:
    global _stdlib
    if not _stdlib:
        paths = sysconfig.get_paths()
        _stdlib = tuple(sorted({os.path.join(p, "") for p in (
            paths.get("stdlib"), paths.get("platstdlib"), os.path.dirname(os.__file__)) if p}))
    return _stdlib


def is_program_code(code: CodeType) -> bool:
    """Whether ``code`` is the program's: not gpurace's own, not the standard library's, not one
    of the :data:`LIBRARIES`' and not frozen or generated code."""
    name = code.co_filename
    mine = _files.get(name)
    if mine is None:
        mine = _files[name] = _is_program_file(name)
    return mine


_own: dict[str, bool] = {}  # a code object's file name -> whether it is the program's own source


def is_own_code(code: CodeType) -> bool:
    """Whether ``code`` is the program's own source, not an installed package's (transformers,
    an engine installed with pip): what is worth naming by the program's variables. Looking up
    a variable costs a scan of a frame's names, which a library's busy frames cannot afford."""
    path = code.co_filename
    mine = _own.get(path)
    if mine is None:
        mine = _own[path] = is_program_code(code) and not any(
            marker in path for marker in ("/site-packages/", "/dist-packages/"))
    return mine


def _is_program_file(name: str) -> bool:
    if name.startswith("<"):
        return False
    path = os.path.abspath(name)
    if path.startswith(_HARNESS_ROOT) or _GENERATED in path:
        return False
    for marker in ("/site-packages/", "/dist-packages/"):
        at = path.find(marker)
        if at >= 0:
            top = path[at + len(marker):].split("/", 1)[0]
            return top.split(".")[0] not in LIBRARIES
    return not path.startswith(_stdlib_roots())


def program_frame(depth: int = 1) -> FrameType | None:
    """The innermost frame of the program's own code above the caller's ``depth``-th frame
    (None where there is none: a callback from a library's own thread, or one fired near the
    bottom of the stack, has fewer frames than asked for)."""
    try:
        frame: FrameType | None = sys._getframe(depth + 1)
    except ValueError:  # fewer frames than that
        return None
    # is_program_code, inline: this walk runs for every op and every free, through every
    # library frame between the op and the program (a dozen and more in a model's forward).
    files = _files
    while frame is not None:
        name = frame.f_code.co_filename
        mine = files.get(name)
        if mine is None:
            mine = files[name] = _is_program_file(name)
        if mine:
            return frame
        frame = frame.f_back
    return None


def warm_up() -> None:
    """Work out now what the first call would (the standard library's folders), so that a
    source's first op costs no more than its others."""
    _stdlib_roots()
    is_program_code(warm_up.__code__)


_sites: dict[tuple[int, int], tuple[CodeType, str]] = {}  # (id(code), instruction) -> site


def site_of(frame: FrameType | None) -> str | None:
    """``file:line`` of a frame, the file relative to the current folder when under it.

    Remembered by instruction: a frame's line number is found by a scan of its code's line
    table (10 µs at the end of a 2,000-line function, measured), and a loop's ops come from
    the same few instructions again and again."""
    if frame is None:
        return None
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    known = _sites.get(key)
    if known is None:
        known = _sites[key] = (code, f"{shown_path(code.co_filename)}:{frame.f_lineno}")
    return known[1]


def program_site(depth: int = 1) -> str | None:
    """The program's ``file:line`` that led to the caller's call (None: none of the program's
    code is on the stack, as in a callback from a library's own thread)."""
    return site_of(program_frame(depth + 1))


_shown: dict[str, str] = {}


def shown_path(path: str) -> str:
    shown = _shown.get(path)
    if shown is None:
        try:
            rel = os.path.relpath(path)
            shown = path if rel.startswith("..") else rel
        except ValueError:
            shown = path
        _shown[path] = shown
    return shown


def thread_name() -> str:
    """The host thread's name (MainThread for most programs)."""
    return threading.current_thread().name


def variable_for(frame: FrameType | None, wanted: Callable[[object], bool]) -> str | None:
    """The name the program's frame gives a value ``wanted`` accepts (its locals first, then
    its module's globals), or None: how a finding names a stream or a tensor as the program
    does."""
    if frame is None:
        return None
    try:
        for scope in (frame.f_locals, frame.f_globals):
            for key, value in scope.items():
                if not key.startswith("_") and wanted(value):
                    return key
    except Exception:  # a frame gone, a value that cannot be asked: no name
        return None
    return None


def names_in(frame: FrameType | None, types: frozenset[type],
             key: Callable[[Any], Any]) -> dict[Any, str]:
    """The names a program's frame gives its values of ``types``, by ``key(value)`` (the first
    name of each key wins): how the tensors a line made get the program's names, all of one
    frame in one pass. Its locals only, or its module's globals for module-level code: a
    value made in a function is held by that function's names, and a scan of a module's
    globals for each of its temporaries costs more than the op that made it."""
    found: dict[Any, str] = {}
    try:
        scope = frame.f_locals if frame is not None else {}
    except Exception:  # a frame gone: no names
        return found
    for name, value in scope.items():
        if type(value) in types and not name.startswith("_"):
            try:
                found.setdefault(key(value), name)
            except Exception:  # a value that cannot be asked (a storage freed): not named
                continue
    return found
