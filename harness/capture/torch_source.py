"""The PyTorch source: a dispatch mode for what ops touch, PyTorch's GPU trace for the rest.

Every ATen op the program runs passes through :class:`_Mode`, a ``TorchDispatchMode``. Its
schema says what the op does to each tensor: an argument annotated ``Tensor(a!)`` is written, any
other tensor argument read, and a return that aliases nothing is new memory the op writes. (A
return that shares an input's storage without saying so, as ``_unsafe_view``'s does, writes
nothing: memory is written only where an argument says so or where it is new.) Tensors are byte
ranges of their storage: a view at an offset is its own bytes, and a strided view is its runs of
contiguous bytes (or their hull, past :data:`RUNS_MAX`). A CUDA tensor is device memory; a CPU
tensor is memory only when it is pinned, since a stream's copy reads or writes it behind the
host's back; a pageable one is the host's private copy.

An op runs on the current stream of the device its CUDA tensors live on, its results and its
``device=`` argument included: ``pinned.to("cuda", non_blocking=True)`` is a copy on the
current stream that reads the pinned bytes when it runs and writes the new device tensor, not
the host's own access. Only an op that touches no CUDA memory at all is the host's. Under
``inference_mode`` the dispatcher hands the mode composite ops whole (``linear``, and ``.to()``,
which may return its input and so reads as a view); the mode runs their decompositions with
itself on, so that the copies and kernels inside them are seen.

PyTorch's GPU trace callbacks (``torch.cuda._gpu_trace``) give what the dispatcher does not:
event record and wait, stream, event and device synchronize, stream and event creation, and the
caching allocator's frees. ``record_stream`` is an op: the streams it names go with the block's
free, where the allocator defers reuse. Pinned blocks are PyTorch's caching host allocator's: it
records an event on the stream after each copy from or into a block, and hands the block out
again only once those events completed; so the source says such an event after each copy, and
a pinned block seen again is the host waiting for its own copies' events, nothing more. Event
and stream queries are read through their Python methods; ``Tensor.tolist`` and ``Tensor.numpy``
of a pinned tensor are host reads.

The capture never changes what the program does (``source.Failures``): a tensor it cannot read
(a subclass such as DTensor, which the mode lets handle the op and then sees the plain tensors
it runs on; fake and functional tensors; sparse, nested, meta tensors; storages without data) is
left out, any failure of the source's own code is caught, counted and said once in the notes,
and the program's op runs as it would unwatched. A forked child (a DataLoader worker) runs with
the capture off from its first instruction. ``torch.compile`` compiles as it would alone: the
mode steps aside while it traces, and the compiled code's kernels are seen only where they go
through the dispatcher. The mode turns Dynamo's frame hook off around its own code, so that
Dynamo never traces it, without importing Dynamo (:mod:`harness.capture.torch_mode`). The one
change the program may notice is its time: activation checkpointing's early stop is off while
the capture is on (:func:`harness.capture.torch_mode.checkpoint_early_stop_off` says why).

A CUDA graph's capture and each replay are said as they happen
(:mod:`harness.capture.torch_graphs`); the ops seen during a capture are the graph's body,
which the watching side issues again at each replay.

Ops issued in threads the program starts are seen too (each thread enters the mode as it
starts); ops of processes it starts are not.

This module hooks the source into PyTorch; the source's state and its reading of each op are
:class:`harness.capture.torch_capture.Capture`'s.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from harness.capture import events as E
from harness.capture import spin
from harness.capture.amplify import Amplifier
from harness.capture.sites import warm_up
from harness.capture.source import Installed
from harness.capture.torch_capture import Capture
from harness.capture.torch_collectives import Collectives
from harness.capture.torch_mode import (checkpoint_early_stop_off, decompose, dense_device_of,
                                        dynamo_frame_hook, enter_beneath, exit_from_beneath,
                                        mode_backed_tensors, numbers_as_tensors,
                                        subclass_handles, subclass_made_bare)
from harness.capture.torch_patches import patch_calls


class TorchSource:
    """The PyTorch source, as every source is (:class:`harness.capture.source.Source`)."""

    name = "torch"
    module = "torch"
    title = "PyTorch"

    def available(self) -> str | None:
        """PyTorch's version when it imports here, else None."""
        try:
            import torch
        except Exception:  # any failure to import is "not here"
            return None
        return str(torch.__version__)

    def install(self, sink: E.Sink, amplifier: Amplifier | None = None) -> Installed:
        return install(sink, amplifier)


def available() -> str | None:
    """PyTorch's version when it imports here, else None."""
    return SOURCE.available()


def install(sink: E.Sink, amplifier: Amplifier | None = None) -> Installed:
    """Capture the program's PyTorch work into ``sink`` from now on, queueing the delays
    ``amplifier`` asks for; returns what stops it (its ``capture``: the source's state)."""
    import torch
    import torch.cuda._gpu_trace as trace
    from torch.utils._python_dispatch import TorchDispatchMode

    cap = Capture(sink)
    cap.amplifier = amplifier
    sink.on_quiet.append(cap.name_when_quiet)
    mode_backed = mode_backed_tensors()
    subclasses: dict[Any, bool | None] = {}  # an op's tensor types -> subclass_handles
    plans = cap.plans

    hook: Callable[[Any], Any] | None = None  # Dynamo's frame hook setter, once known
    function_modes_on = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
    no_torch_function = torch._C.DisableTorchFunction

    # Whether Dynamo is tracing now (a PyTorch without torch.compiler never is).
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (
        lambda: False)

    def outside_dynamo(made: Callable[..., Any], original: Callable[..., Any]
                       ) -> Callable[..., Any]:
        # A method the source patches runs where the program calls it, also inside a function
        # torch.compile traces (Dynamo then sees PyTorch's own method, as without the watch)
        # and at its graph breaks with Dynamo's frame hook on (kept from Dynamo as the mode's
        # entry is, below).
        @functools.wraps(made)
        def call(*a: Any, **k: Any) -> Any:
            if compiling():
                return original(*a, **k)
            if hook is None:
                return made(*a, **k)
            prior = hook(None)
            try:
                return made(*a, **k)
            finally:
                hook(prior)
        return call

    class _Mode(TorchDispatchMode):
        # A higher-order op (torch.cond, scan, out_dtype, an eager flex_attention) comes to a
        # mode only where it says so; otherwise PyTorch raises in the program. It runs as it
        # would unwatched (Capture.plan).
        supports_higher_order_operators = True

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True  # torch.compile compiles as it would alone, the mode off meanwhile

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # Unless a mode opts out, PyTorch wraps its __torch_dispatch__ in
            # torch._dynamo.disable, so that Dynamo never traces the mode's code inside a
            # compiled region: a wrapper that imports dynamo and sympy at its first call
            # (seconds). The mode does what that wrapper does without them (below); where
            # this PyTorch does not let it, it puts PyTorch's wrapper on itself.
            return False

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            prior = None if hook is None else hook(None)
            try:
                if function_modes_on():
                    # An op PyTorch runs without Python (TorchScript's, the autograd
                    # engine's) comes here with the program's torch-function modes on.
                    # Alone, those modes see none of it: nor the capture's reads of its
                    # tensors, nor the op called again from here.
                    with no_torch_function():
                        return self.run_op(func, types, args, kwargs)
                return self.run_op(func, types, args, kwargs)
            finally:
                if hook is not None:
                    hook(prior)

        def run_op(self, func: Any, types: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any] | None) -> Any:
            try:
                return self.handle(func, types, args, kwargs)
            except RuntimeError:
                mended = numbers_as_tensors(func, args, kwargs)
                if mended is None:
                    raise  # the program's own error, as it would have it alone
                return self.handle(func, types, *mended)

        def handle(self, func: Any, types: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any] | None) -> Any:
            if not cap.on:
                return func(*args, **(kwargs or {}))
            if types:
                handles = subclasses.get(types)
                if handles is None:
                    handles = subclasses[types] = subclass_handles(types, mode_backed)
                if handles is not None:
                    return NotImplemented if handles else func(*args, **(kwargs or {}))
            plan = plans.get(id(func)) or cap.plan(func)
            if plan is None:
                return func(*args, **(kwargs or {}))
            if plan.decomposes and dense_device_of(args, cap.Tensor) in plan.decomposes:
                # Under inference_mode the dispatcher hands the mode composite ops whole
                # (linear, and .to(), whose schema says it may return its input): their
                # copies and kernels run inside it, unseen. Run the decomposition with the
                # mode on, where PyTorch runs it without the mode, so each of them is seen.
                with self:
                    return decompose(func, args, kwargs or {})
            return cap.dispatch(plan, func, args, kwargs or {})

    def guarded(name: str, callback: Callable[..., None]) -> Callable[..., None]:
        # PyTorch logs a callback's exception on the program's stderr: none may escape. A
        # callback may fire inside a compiled function's work, with Dynamo's frame hook on:
        # kept from Dynamo as the mode's entry is.
        def run(*a: Any) -> None:
            if not cap.on:
                return
            prior = None if hook is None else hook(None)
            try:
                callback(*a)
            except Exception as exc:
                cap.guard.failed(f"PyTorch's {name} callback", exc)
            finally:
                if hook is not None:
                    hook(prior)
        return run

    entry = _Mode.__dict__["__torch_dispatch__"]
    hook = dynamo_frame_hook(entry.__code__, outside_dynamo(len, len).__code__,
                             guarded("", len).__code__)
    disable = getattr(torch, "_disable_dynamo", None)  # a PyTorch older than Dynamo: neither
    if hook is None and disable is not None:
        _Mode.__torch_dispatch__ = disable(entry, recursive=True)

    torch._C._activate_gpu_trace()
    for register, name, callback in (
            (trace.register_callback_for_stream_creation, "stream creation",
             cap.on_stream_creation),
            (trace.register_callback_for_event_creation, "event creation", cap.on_event_creation),
            (trace.register_callback_for_event_record, "event record", cap.on_event_record),
            (trace.register_callback_for_event_wait, "event wait", cap.on_event_wait),
            (trace.register_callback_for_memory_deallocation, "free", cap.on_free),
            (trace.register_callback_for_device_synchronization, "device synchronize",
             cap.on_sync_device),
            (trace.register_callback_for_stream_synchronization, "stream synchronize",
             cap.on_sync_stream),
            (trace.register_callback_for_event_synchronization, "event synchronize",
             cap.on_sync_event)):
        register(guarded(name, callback))

    early_stop = checkpoint_early_stop_off()
    patched: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        # What the owner only inherited is deleted again at the end, not made its own.
        patched.append((owner, name, original if name in vars(owner) else None))
        setattr(owner, name, outside_dynamo(make(original), original))

    if torch.distributed.is_available():
        try:
            cap.collectives = Collectives(cap)
        except Exception as exc:  # a torch.distributed without what the model reads
            cap.guard.failed("torch.distributed's Work and ProcessGroup", exc)
    patch_calls(cap, torch, patch)

    # Each thread the program starts enters a mode of its own (modes are per thread).
    def bootstrap(original: Any) -> Any:
        def run(self: Any) -> None:
            with _Mode():
                original(self)
        return run

    patch(threading.Thread, "_bootstrap_inner", bootstrap)
    patch(torch.Tensor, "__new__", subclass_made_bare(_Mode))

    def in_child() -> None:
        cap.on = False  # a forked child (a DataLoader worker): not watched, never touched

    os.register_at_fork(after_in_child=in_child)
    quiet = spin.while_calibrating(lambda on: setattr(cap, "on", on))
    mode = _Mode()
    enter_beneath(mode)
    # Whatever the first op through the mode sets up (PyTorch's dynamo and sympy, where its
    # own wrapper stays) is paid here, before the program's first line, not between two of
    # its ops.
    cap.on = False
    try:
        torch.empty(0)
        warm_up()
    finally:
        cap.on = True
    sink.emit(["note", "PyTorch: kernels that do not go through PyTorch's dispatcher "
                       "(custom extensions' own launches; Triton kernels, torch.compile's "
                       "included, are the Triton source's) are not seen; a kernel "
                       "that reads through an index is taken to read the whole tensor it "
                       "indexes; numpy views of pinned tensors are seen only where .numpy() "
                       "makes them"])

    def uninstall() -> None:
        cap.flush_inflight()
        if cap.to_name:
            cap.name_pending()
        cap.on = False
        cap.graphs.close()
        quiet()
        exit_from_beneath(mode)
        if early_stop is not None:
            early_stop.__exit__(None, None, None)
        for owner, name, original in reversed(patched):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        if cap.collectives is not None:
            for line in cap.collectives.notes():
                sink.emit(["note", line])
        for counts, what in (
                (cap.unannotated, "extension ops whose schema marks no argument written and "
                                  "that return nothing ran; what they write is not known, so "
                                  "only their reads were checked"),
                (cap.higher_order, "higher-order ops ran as they would unwatched; the ops "
                                   "they ran inside were not seen")):
            if counts:
                sink.emit(["note", f"PyTorch: {what}: " + ", ".join(
                    f"{name} ({count}x)" for name, count in sorted(counts.items()))])
        cap.guard.say_summary()
        sink.emit(cap.stats())

    return Installed(uninstall, cap.guard, cap)


SOURCE = TorchSource()
