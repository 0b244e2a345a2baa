"""The CuPy source's module functions: ufuncs, ``cupy.asarray`` and kin, every public function.

The functions of ``cupy``, ``cupy.linalg``, ``cupy.fft`` and ``cupy.random`` are replaced by
wrappers, each call one op: a ufunc (``cupy.add(a, b, out=c)``, and its ``reduce``,
``accumulate``, ``reduceat``, ``outer`` and ``at``) reads its inputs and writes its outputs;
``cupy.asarray`` and its kin copy host data to the device; ``cupy.copyto`` copies or fills;
every other function reads its array arguments and writes its ``out=`` and fresh results.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from harness.capture.cupy_capture import CallPlan, CupyCapture
from harness.capture.kernel_params import kernel_identifier

# Module functions with a role of their own; every other public function of the watched
# modules is a generic op (reads its array arguments, writes its out= and fresh results).
_HOST_TO_DEVICE = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray",
                   "require", "asarray_chkfinite", "asfarray", "frombuffer", "fromfile",
                   "fromiter", "fromstring", "fromfunction", "loadtxt", "genfromtxt", "load")
_MEMSET_FUNCTIONS = ("zeros", "zeros_like")
_COPY_FUNCTIONS = ("copy",)
_INPLACE_FUNCTIONS = ("put", "place", "putmask", "fill_diagonal", "put_along_axis", "shuffle")
_NOT_WATCHED = ("asnumpy", "empty", "empty_like", "get_array_module", "get_default_memory_pool",
                "get_default_pinned_memory_pool", "is_available", "show_config", "fuse",
                "from_dlpack", "fromDlpack", "shape", "ndim", "size", "result_type", "can_cast",
                "may_share_memory", "isscalar", "who", "printoptions", "set_printoptions",
                "get_printoptions")
_WATCHED_MODULES = ("cupy", "cupy.linalg", "cupy.fft", "cupy.random")


class FunctionHooks:
    """The watched modules' public functions and ufuncs as watched calls."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture

    def install(self) -> None:
        for module_name in _WATCHED_MODULES:
            module = importlib.import_module(module_name)
            for name in dir(module):
                if name.startswith("_") or name in _NOT_WATCHED:
                    continue
                value = getattr(module, name)
                wrapped = self.function(module_name, name, value)
                if wrapped is not None:
                    self.capture.patch(module, name, wrapped)

    def function(self, module_name: str, name: str, value: Any) -> Any:
        """The watched stand-in for one module attribute, or None to leave it alone."""
        capture = self.capture
        label = f"{module_name}.{name}"
        if isinstance(value, capture.cp.ufunc):
            return UfuncProxy(capture, value, label)
        if module_name == "cupy" and name == "copyto":
            return self.copyto_wrapper(value)
        if callable(value) and type(value).__name__ == "_GUFunc":  # cupy.matmul
            return CallProxy(capture, value, label, "kernel:" + name, None)
        home = str(getattr(value, "__module__", None) or "")
        if not inspect.isfunction(value) or not home.startswith(("cupy", "cupyx")):
            return None  # NumPy's own functions re-exported, classes, constants
        if name in _HOST_TO_DEVICE and module_name == "cupy":
            return self.host_to_device_wrapper(value, label)
        kind = ("memset" if name in _MEMSET_FUNCTIONS else
                "copy_dtod" if name in _COPY_FUNCTIONS else "kernel:" + name)
        out_at = _out_position(value)
        return _wraps(value, CallProxy(capture, value, label, kind, out_at,
                                       inplace=name in _INPLACE_FUNCTIONS))

    def copyto_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``cupy.copyto(dst, src, casting, where)``: a copy between arrays, a fill from a
        scalar, a masked kernel with ``where``."""
        capture = self.capture
        spans = capture.spans

        @functools.wraps(original)
        def copyto(dst: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
            where = kwargs.get("where", args[1] if len(args) > 1 else None)
            array = isinstance(src, spans.base)
            kind = "copy_dtod" if array and where is None else "kernel:copyto"
            return capture.run("cupy.copyto", kind, original, (dst, src, *args), kwargs,
                               lambda: CallPlan(spans.arg_ranges((src, where), {}),
                                                spans.writes_of(dst), capture.current_sid()))

        return copyto

    def host_to_device_wrapper(self, original: Callable[..., Any],
                               label: str) -> Callable[..., Any]:
        """``cupy.asarray`` and its kin: from host data, a copy to the device (through a
        pinned staging buffer CuPy fills first, unless the data is pinned already); from a
        CuPy array, a device copy or none."""
        capture = self.capture
        spans = capture.spans

        @functools.wraps(original)
        def to_device(obj: Any, *args: Any, **kwargs: Any) -> Any:
            def plan() -> CallPlan:
                reads = list(spans.ranges(obj))
                dtype = kwargs.get("dtype", args[0] if args else None)
                host = spans.pinned_range(obj)
                if host is not None and (dtype is None or obj.dtype == dtype):
                    reads.append(host)  # CuPy copies straight from it
                return CallPlan(reads, [], capture.current_sid())

            on_device = isinstance(obj, spans.base) or hasattr(
                obj, "__cuda_array_interface__") or (isinstance(obj, (list, tuple)) and any(
                    isinstance(x, spans.base) for x in obj))
            kind = "copy_dtod" if on_device else "copy_htod"
            return capture.run(label, kind, original, (obj, *args), kwargs, plan)

        return to_device


class CallProxy:
    """A watched stand-in for a module function or callable object: calls it as one op, and
    hands every other attribute through."""

    def __init__(self, capture: CupyCapture, original: Any, label: str, kind: str,
                 out_at: int | None, inplace: bool = False, outs_from: int | None = None,
                 ) -> None:
        self._capture, self._original, self._label = capture, original, label
        self._kind, self._out_at, self._inplace, self._outs_from = kind, out_at, inplace, outs_from

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        capture = self._capture
        spans = capture.spans

        def plan() -> CallPlan:
            rest, outs = list(args), [kwargs.get("out")]
            if self._outs_from is not None:  # a ufunc: every positional past nin is an output
                rest, outs = rest[:self._outs_from], outs + rest[self._outs_from:]
            elif outs[0] is None and self._out_at is not None and len(rest) > self._out_at:
                outs = [rest.pop(self._out_at)]
            writes = [r for out in outs for r in spans.ranges(out)]
            if self._inplace and args:
                writes += list(spans.ranges(args[0]))
            return CallPlan(spans.arg_ranges(rest, kwargs), writes, capture.current_sid())

        return capture.run(self._label, self._kind, self._original, args, kwargs, plan)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("_original")  # absent while copy or pickle build one
        if original is None:
            raise AttributeError(name)
        return getattr(original, name)

    def __repr__(self) -> str:
        return repr(self._original)


class UfuncProxy(CallProxy):
    """A watched CuPy ufunc: ``cupy.add(a, b, out=c)`` and its ``reduce``, ``accumulate``,
    ``reduceat``, ``outer`` and ``at`` (which writes its first argument)."""

    _METHODS = ("reduce", "accumulate", "reduceat", "outer", "at")

    def __init__(self, capture: CupyCapture, ufunc: Any, label: str) -> None:
        name = kernel_identifier(str(ufunc.name).removeprefix("cupy_"))
        super().__init__(capture, ufunc, label, "kernel:" + name, None, outs_from=ufunc.nin)
        self.__name__ = ufunc.__name__
        self.__doc__ = ufunc.__doc__
        self._methods: dict[str, CallProxy] = {}

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance(cupy.add, cupy.ufunc) stays true (cupyx.jit and fusion ask); Cython's
        # own type tests look at the real type and refuse the proxy instead.
        return type(self._original)

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods")
        if methods is None or name not in UfuncProxy._METHODS:
            return super().__getattr__(name)
        method = methods.get(name)
        if method is None:
            method = methods[name] = CallProxy(
                self._capture, getattr(self._original, name), f"{self._label}.{name}",
                self._kind, None, inplace=name == "at")
        return method


def _out_position(function: Callable[..., Any]) -> int | None:
    """Where a function's positional ``out`` parameter is (``cupy.dot(a, b, out)``)."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == "out" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return i
    return None


def _wraps(original: Callable[..., Any], proxy: CallProxy) -> Callable[..., Any]:
    """A plain function around a proxy, with the original's name, doc and signature (a
    function, unlike an object, keeps working where CuPy or the program inspects it)."""
    @functools.wraps(original)
    def watched(*args: Any, **kwargs: Any) -> Any:
        return proxy(*args, **kwargs)

    return watched
