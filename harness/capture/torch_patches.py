"""The program's calls that order its work or read its memory and that PyTorch's dispatcher
does not see: an event's or a stream's query, a tensor read by the host through ``tolist`` or
``numpy``, a CUDA graph's replay, and a collective's ``Work.wait``, ``synchronize`` and
``is_completed``. Each is wrapped (by the PyTorch source's ``patch``, which puts the original
back when the capture stops) to say what it did, then do it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def patch_calls(cap: Any, torch: Any, patch: Callable[[Any, str, Callable[[Any], Any]], None]
                ) -> None:
    """Wrap the calls, for the capture ``cap`` (the PyTorch source's state)."""

    def event_query(original: Any) -> Any:
        def query(self: Any) -> bool:
            done = original(self)
            if cap.on:
                try:
                    _, site = cap._edge()
                    cap.emit(["query", self.cuda_event, bool(done), site])
                except Exception as exc:
                    cap.guard.failed("Event.query", exc)
            return done
        return query

    def stream_query(original: Any) -> Any:
        def query(self: Any) -> bool:
            done = original(self)
            if cap.on and done:  # all the stream's work is done: as a synchronize orders
                try:
                    frame, site = cap._edge()
                    cap._seen_stream(self.cuda_stream, frame)
                    cap.emit(["sync_stream", self.cuda_stream, site])
                except Exception as exc:
                    cap.guard.failed("Stream.query", exc)
            return done
        return query

    def host_reader(original: Any) -> Any:
        def read(self: Any, *a: Any, **k: Any) -> Any:
            if cap.on:
                try:
                    cap.host_read(self)
                except Exception as exc:
                    cap.guard.failed(f"Tensor.{original.__name__}", exc)
            return original(self, *a, **k)
        return read

    def graph_replay(original: Any) -> Any:
        def replay(self: Any, *a: Any, **k: Any) -> Any:
            if cap.on:
                cap.emit(["note", "the program replayed a CUDA graph (torch.cuda.CUDAGraph."
                                  "replay): its kernels run as one launch that no source "
                                  "sees; what they read and write is not checked"])
            return original(self, *a, **k)
        return replay

    patch(torch.cuda.Event, "query", event_query)
    patch(torch.cuda.Stream, "query", stream_query)
    patch(torch.Tensor, "tolist", host_reader)
    patch(torch.Tensor, "numpy", host_reader)
    if hasattr(torch.cuda, "CUDAGraph"):
        patch(torch.cuda.CUDAGraph, "replay", graph_replay)

    collectives = cap.collectives
    if collectives is None:
        return

    def work_wait(original: Any) -> Any:
        def wait(self: Any, *a: Any, **k: Any) -> Any:
            out = original(self, *a, **k)
            if cap.on:
                try:
                    collectives.waited(self)
                except Exception as exc:
                    cap.guard.failed(f"Work.{original.__name__}", exc)
            return out
        return wait

    def work_completed(original: Any) -> Any:
        def is_completed(self: Any) -> bool:
            done = original(self)
            if cap.on:
                try:
                    collectives.queried(self, bool(done))
                except Exception as exc:
                    cap.guard.failed("Work.is_completed", exc)
            return done
        return is_completed

    def work_future(original: Any) -> Any:
        def get_future(self: Any) -> Any:
            future = original(self)
            if cap.on:
                try:
                    collectives.future_taken(self)
                except Exception as exc:
                    cap.guard.failed("Work.get_future", exc)
            return future
        return get_future

    def coalescing(original: Any) -> Any:
        started = original.__name__ == "_start_coalescing"

        def bracket(self: Any, *a: Any, **k: Any) -> Any:
            out = original(self, *a, **k)
            if cap.on:
                try:
                    if started:
                        collectives.coalescing_started(self)
                    else:
                        collectives.coalescing_ended(self, out)
                except Exception as exc:
                    cap.guard.failed(f"ProcessGroup.{original.__name__}", exc)
            return out
        return bracket

    group = collectives.ProcessGroup
    if hasattr(group, "_start_coalescing") and hasattr(group, "_end_coalescing"):
        patch(group, "_start_coalescing", coalescing)
        patch(group, "_end_coalescing", coalescing)
    for name, make in (("get_future", work_future), ("wait", work_wait),
                       ("synchronize", work_wait), ("is_completed", work_completed)):
        if hasattr(collectives.Work, name):  # each, where this PyTorch's Work has it
            patch(collectives.Work, name, make)
