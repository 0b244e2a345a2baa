"""The CuPy source's ndarray: its methods and operators, each call one op.

``cupy.ndarray`` is a Python subclass of the Cython ``_ndarray_base``: a method set on it
overrides the base's, both for the program's calls and for CuPy's own ``cpdef`` calls (Cython
looks for a Python override on heap types). So ``set``/``get`` (and through ``get``: ``item``,
``tolist``, ``bool(a)``, ``repr(a)``, ``cupy.asnumpy``), ``fill``, ``__setitem__``, the
arithmetic, comparison and in-place operators and the kernel-launching methods are all seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.capture.cupy_capture import CallPlan, CupyCapture, named
from harness.capture.cupy_copies import CopyHooks
from harness.capture.extents import is_basic_index

_BINARY = {"add": "add", "sub": "subtract", "mul": "multiply", "matmul": "matmul",
           "truediv": "true_divide", "floordiv": "floor_divide", "mod": "remainder",
           "divmod": "divmod", "pow": "power", "lshift": "left_shift", "rshift": "right_shift",
           "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}
_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
            "gt": "greater", "ge": "greater_equal"}
_UNARY = {"neg": "negative", "pos": "positive", "abs": "absolute", "invert": "invert"}

# ndarray methods that may launch work; the number is where a positional `out` sits after self
# (Cython methods have no signature to read it from).
_METHODS: dict[str, int | None] = {
    "astype": None, "copy": None, "flatten": None, "ravel": None, "reshape": None,
    "take": 2, "repeat": None, "choose": 1, "argsort": None, "argpartition": None,
    "searchsorted": None, "nonzero": None, "compress": 2, "max": 1, "argmax": 1, "min": 1,
    "argmin": 1, "ptp": 1, "clip": 2, "round": 1, "trace": 4, "sum": 2, "cumsum": 2,
    "mean": 2, "var": 2, "std": 2, "prod": 2, "cumprod": 2, "all": 1, "any": 1, "conj": None,
    "conjugate": None, "dot": 1, "__getitem__": None, "__copy__": None, "__deepcopy__": None,
}
_INPLACE_METHODS = ("put", "sort", "partition", "scatter_add", "scatter_max", "scatter_min")
_COPY_METHODS = ("copy", "__copy__", "__deepcopy__")


class NdarrayHooks:
    """``cupy.ndarray``'s methods and operators as watched calls."""

    def __init__(self, capture: CupyCapture, copies: CopyHooks) -> None:
        self.capture = capture
        self.copies = copies

    def install(self) -> None:
        capture, copies = self.capture, self.copies
        spans = capture.spans
        nd, base = capture.cp.ndarray, spans.base
        get, set_, fill, setitem = base.get, base.set, base.fill, base.__setitem__
        hooks = self

        def watched_get(a: Any, stream: Any = None, order: str = "C", out: Any = None,
                        blocking: bool = True) -> Any:
            return copies.get(get, a, stream, order, out, blocking)

        def watched_set(a: Any, arr: Any, stream: Any = None) -> Any:
            return copies.set(set_, a, arr, stream)

        def watched_fill(a: Any, value: Any) -> None:
            # CuPy memsets a contiguous array filled with zero, and runs a kernel otherwise.
            kind = "memset" if _is_zero(value) and a.flags.c_contiguous else "kernel:fill"
            return capture.run("ndarray.fill", kind, fill, (a, value), {},
                               lambda: CallPlan(spans.arg_ranges((value,), {}),
                                                spans.writes_of(a), capture.current_sid()))

        def watched_setitem(a: Any, key: Any, value: Any) -> None:
            return capture.run("ndarray.__setitem__", hooks.setitem_kind(value), setitem,
                               (a, key, value), {}, lambda: hooks.setitem_plan(a, key, value))

        for name, watched, original in (("get", watched_get, get), ("set", watched_set, set_),
                                        ("fill", watched_fill, fill),
                                        ("__setitem__", watched_setitem, setitem)):
            capture.patch(nd, name, named(watched, name, original))
        for name, out_at in _METHODS.items():
            if hasattr(base, name):
                kind = "copy_dtod" if name in _COPY_METHODS else "kernel:" + name.strip("_")
                capture.patch(nd, name, self.method(name, kind, getattr(base, name), out_at,
                                                    False))
        for name in _INPLACE_METHODS:
            if hasattr(base, name):
                capture.patch(nd, name, self.method(name, "kernel:" + name,
                                                    getattr(base, name), None, True))
        operators = [(f"__{s}__", u, False) for s, u in {**_BINARY, **_COMPARE, **_UNARY}.items()]
        operators += [(f"__r{s}__", u, False) for s, u in _BINARY.items()]
        operators += [(f"__i{s}__", u, True) for s, u in _BINARY.items()]
        for dunder, ufunc, inplace in operators:
            if hasattr(base, dunder):  # the reflected ones are the interpreter's slot wrappers
                capture.patch(nd, dunder, self.method(dunder, "kernel:" + ufunc,
                                                      getattr(base, dunder), None, inplace))

    def method(self, name: str, kind: str, original: Callable[..., Any], out_at: int | None,
               inplace: bool) -> Callable[..., Any]:
        """A watched ndarray method: reads self and its array arguments, writes its ``out``
        (keyword, or positional at ``out_at``), self when ``inplace``, and fresh results."""
        capture, label = self.capture, "ndarray." + name
        spans = capture.spans

        def watched(a: Any, *args: Any, **kwargs: Any) -> Any:
            def plan() -> CallPlan:
                out = kwargs.get("out")
                rest = list(args)
                if out is None and out_at is not None and len(args) > out_at:
                    out = rest.pop(out_at)
                writes = list(spans.ranges(out))
                if inplace:
                    writes += spans.writes_of(a)
                reads = spans.arg_ranges((a, *rest), kwargs)
                return CallPlan(reads, writes, capture.current_sid())

            return capture.run(label, kind, original, (a, *args), kwargs, plan)

        return named(watched, name, original)

    def setitem_kind(self, value: Any) -> str:
        return ("copy_htod" if isinstance(value, self.capture.spans.np_ndarray)
                else "kernel:setitem")

    def setitem_plan(self, a: Any, key: Any, value: Any) -> CallPlan:
        """``a[key] = value`` writes the view ``a[key]`` (the whole of ``a`` for an advanced
        key, which may land anywhere in it) and reads ``value`` and any index arrays."""
        spans = self.capture.spans
        target = spans.base.__getitem__(a, key) if is_basic_index(key) else a
        reads = spans.arg_ranges((value, *(key if isinstance(key, tuple) else (key,))), {})
        host = spans.pinned_range(value)
        if host is not None and value.dtype == a.dtype:
            reads.append(host)
        return CallPlan(reads, spans.writes_of(target), self.capture.current_sid())


def _is_zero(value: Any) -> bool:
    try:
        return not hasattr(value, "__cuda_array_interface__") and bool(value == 0)
    except Exception:  # an array-like with no single truth value
        return False
