"""The CuPy source's kernels: RawKernel, RawModule, ElementwiseKernel and ReductionKernel.

Each kernel class is replaced by a Python subclass whose launches are ops, so what the program
builds after install is seen. A raw launch reads the arrays its CUDA source declares as pointers
to const and writes its other pointers (every array, where the source does not say); an
elementwise or reduction kernel reads and writes by its parameter strings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from harness.capture.cupy_capture import CallPlan, CupyCapture
from harness.capture.events import Span
from harness.capture.kernel_params import (READ, WRITE, kernel_identifier, kernel_param_roles,
                                           kernel_params)
from harness.capture.sites import program_site


class Accesses(NamedTuple):
    """What a launch reads and what it writes."""

    reads: list[Span]
    writes: list[Span]


class KernelHooks:
    """CuPy's kernel classes as subclasses whose launches are watched calls."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture

    def install(self) -> None:
        capture = self.capture
        cp = capture.cp
        core = cp._core
        raw = self.raw_kernel_class(core.RawKernel)
        module = self.raw_module_class(core.RawModule, raw)
        elementwise = self.elementwise_class(core.ElementwiseKernel)
        reduction = self.reduction_class(cp._core._reduction.ReductionKernel)
        for namespace in (cp, core):
            capture.patch(namespace, "RawKernel", raw)
            capture.patch(namespace, "RawModule", module)
            capture.patch(namespace, "ElementwiseKernel", elementwise)
            if hasattr(namespace, "ReductionKernel"):
                capture.patch(namespace, "ReductionKernel", reduction)

    # -- raw kernels --------------------------------------------------------------------------

    def raw_kernel_class(self, base: type) -> type:
        """``cupy.RawKernel`` as a subclass whose launches are ops; the roles of its parameters
        come from its CUDA source, read once."""
        hooks = self

        class RawKernel(base):
            __doc__ = base.__doc__

            def __init__(self, code: str, name: str, *args: Any, **kwargs: Any) -> None:
                super().__init__(code, name, *args, **kwargs)
                self._gpurace_roles = kernel_param_roles(code, name)

            def __call__(self, grid: Any, block: Any, args: Any, **kwargs: Any) -> Any:
                return hooks.raw_call(self, base.__call__, grid, block, args, kwargs)

        RawKernel.__module__, RawKernel.__qualname__ = "cupy", "RawKernel"
        return RawKernel

    def raw_module_class(self, base: type, kernel_class: type) -> type:
        """``cupy.RawModule`` whose ``get_function`` hands out watched RawKernels (CuPy builds
        its own from C, so each is cloned into the subclass through its pickling state)."""
        class RawModule(base):
            __doc__ = base.__doc__

            def get_function(self, name: str) -> Any:
                kernel = super().get_function(name)
                clone = kernel_class.__new__(kernel_class)
                clone.__setstate__(kernel.__getstate__())
                clone._gpurace_roles = kernel_param_roles(self.code, name)
                return clone

        RawModule.__module__, RawModule.__qualname__ = "cupy", "RawModule"
        return RawModule

    def raw_call(self, kernel: Any, call: Callable[..., Any], grid: Any, block: Any, args: Any,
                 kwargs: dict[str, Any]) -> Any:
        """A RawKernel launch: written after it is issued (a launch that raised issued
        nothing). Pointers to const are read, other pointers written."""
        capture = self.capture
        if not capture.active or capture.frame is not None:
            return call(kernel, grid, block, args, **kwargs)
        try:
            sid, site = capture.stream_sid(kwargs.get("stream")), program_site()
            name = kernel_identifier(kernel.name)
        except Exception as exc:
            capture.failed("RawKernel", exc)
            return call(kernel, grid, block, args, **kwargs)
        if capture.amplifier is not None:
            capture.amplify(site, "kernel:" + name, sid)
        result = call(kernel, grid, block, args, **kwargs)
        try:
            found = self.kernel_accesses(name, getattr(kernel, "_gpurace_roles", None),
                                         tuple(args))
            capture.op(sid, "kernel:" + name, found.reads, found.writes, site,
                       f"RawKernel({kernel.name})")
        except Exception as exc:
            capture.failed("RawKernel", exc)
        return result

    def kernel_accesses(self, name: str, roles: tuple[str, ...] | None,
                        args: tuple[Any, ...]) -> Accesses:
        """The reads and writes of a raw launch's arguments, by the parameters' roles."""
        if roles is not None and len(roles) != len(args):
            roles = None
        if roles is None:
            self.capture.note(
                f"kernel {name}: its parameters' read/write roles are unknown (no CUDA source "
                f"to read them from); every array argument is counted as written",
                key=("roles", name))
        reads: list[Span] = []
        writes: list[Span] = []
        spans = self.capture.spans
        for i, arg in enumerate(args):
            role = WRITE if roles is None else roles[i]
            r = spans.pointer_range(arg, role)
            if r is not None:
                (reads if role == READ else writes).append(r)
        return Accesses(reads, writes)

    # -- elementwise and reduction kernels ----------------------------------------------------

    def elementwise_class(self, base: type) -> type:
        """``cupy.ElementwiseKernel`` as a subclass whose calls are ops."""
        hooks = self

        class ElementwiseKernel(base):
            __doc__ = base.__doc__

            def __init__(self, in_params: str, out_params: str, operation: str,
                         name: str = "kernel", *args: Any, **kwargs: Any) -> None:
                super().__init__(in_params, out_params, operation, name, *args, **kwargs)
                self._gpurace_params = kernel_params(in_params, out_params)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return hooks.elementwise_call(self, base.__call__, args, kwargs)

        ElementwiseKernel.__module__, ElementwiseKernel.__qualname__ = "cupy", "ElementwiseKernel"
        return ElementwiseKernel

    def reduction_class(self, base: type) -> type:
        """``cupy.ReductionKernel`` as a subclass whose calls are ops."""
        hooks = self

        class ReductionKernel(base):
            __doc__ = base.__doc__

            def __init__(self, in_params: str, out_params: str, *args: Any,
                         **kwargs: Any) -> None:
                super().__init__(in_params, out_params, *args, **kwargs)
                self._gpurace_params = kernel_params(in_params, out_params)

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                return hooks.elementwise_call(self, base.__call__, args, kwargs)

        ReductionKernel.__module__, ReductionKernel.__qualname__ = "cupy", "ReductionKernel"
        return ReductionKernel

    def elementwise_call(self, kernel: Any, call: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
        """An ElementwiseKernel/ReductionKernel call: arguments by their parameters' roles,
        ``out=`` and fresh outputs written."""
        capture = self.capture
        spans = capture.spans

        def plan() -> CallPlan:
            params = getattr(kernel, "_gpurace_params", None) or ()
            reads: list[Span] = []
            writes = list(spans.ranges(kwargs.get("out")))
            for i, arg in enumerate(args):
                written = params[i].written if i < len(params) else True  # unknown: written
                (writes if written else reads).extend(spans.ranges(arg))
            return CallPlan(reads, writes, capture.stream_sid(kwargs.get("stream")))

        name = kernel_identifier(kernel.name)
        return capture.run(f"{type(kernel).__name__}({kernel.name})", "kernel:" + name, call,
                           (kernel, *args), kwargs, plan)
