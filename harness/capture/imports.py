"""Doing something the moment a module's import has executed it.

A source switches on when the program imports its framework (:class:`harness.capture.boot.
InstallOnImport`), and a source may wrap a module of its framework that the program imports
later (the Triton source wraps torch.compile's kernel launcher, imported at the first compiled
call). Both wait the same way: a finder at the front of ``sys.meta_path`` wraps the module's
loader so that, once the module's code has run, :meth:`OnExec.executed` is called. A library
that only looks the module up (``importlib.util.find_spec``, as transformers does to see what
is installed) uses up nothing: the wait ends when the module is executed, not found.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class OnExec(importlib.abc.MetaPathFinder):
    """A finder that calls :meth:`executed` once a module named in ``waiting`` has been
    executed by an import."""

    def __init__(self) -> None:
        self.waiting: dict[str, Any] = {}  # module name -> what waits for it
        self._finding: set[str] = set()  # names being looked up by the real finders

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.waiting or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)  # the real one, without us
        finally:
            self._finding.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.executed(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def executed(self, fullname: str) -> None:
        """The module ``fullname`` has just been executed."""
        raise NotImplementedError


class _Callbacks(OnExec):
    def executed(self, fullname: str) -> None:
        callbacks = self.waiting.pop(fullname, ())
        if not self.waiting and self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in callbacks:
            callback()


_callbacks = _Callbacks()


def after_import(module: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` once ``module`` is imported: now, if it is already. Returns what
    cancels the wait (nothing, once it was called)."""
    if module in sys.modules:
        callback()
        return lambda: None
    _callbacks.waiting.setdefault(module, []).append(callback)
    if _callbacks not in sys.meta_path:
        sys.meta_path.insert(0, _callbacks)

    def cancel() -> None:
        waiting = _callbacks.waiting.get(module, [])
        if callback in waiting:
            waiting.remove(callback)
            if not waiting:
                del _callbacks.waiting[module]
        if not _callbacks.waiting and _callbacks in sys.meta_path:
            sys.meta_path.remove(_callbacks)
    return cancel
