"""The program's calls that order its work or read its memory and that PyTorch's dispatcher
does not see: an event's or a stream's query, a tensor read by the host through ``tolist`` or
``numpy``, a CUDA graph's capture and replay, and a collective's ``Work.wait``, ``synchronize`` and
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

    def graph_call(event: str) -> Callable[[Any], Any]:
        """A CUDA graph's ``capture_begin``, ``capture_end`` or ``replay``: said once it is
        done (an end also when it failed: the capture is over either way). A graph is known
        by its object's id: a graph captured anew is a new body. A replay may be delayed
        first, where a delay is asked for at one of the graph's ops."""
        def make(original: Any) -> Any:
            def call(self: Any, *a: Any, **k: Any) -> Any:
                if cap.on and event in ("graph_replay", "graph_begin"):
                    try:
                        if event == "graph_begin":
                            cap.graphs.before_capture()
                        else:
                            cap.graphs.before_replay(id(self))
                    except Exception as exc:
                        cap.guard.failed(f"a delay before CUDAGraph.{original.__name__}", exc)
                done = False
                try:
                    out = original(self, *a, **k)
                    done = True
                    return out
                finally:
                    if cap.on and (done or event == "graph_end"):
                        try:
                            cap.graphs.call(event, id(self))
                        except Exception as exc:
                            cap.guard.failed(f"CUDAGraph.{original.__name__}", exc)
            return call
        return make

    patch(torch.cuda.Event, "query", event_query)
    patch(torch.cuda.Stream, "query", stream_query)
    patch(torch.Tensor, "tolist", host_reader)
    patch(torch.Tensor, "numpy", host_reader)
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is not None:
        for name, event in (("capture_begin", "graph_begin"), ("capture_end", "graph_end"),
                            ("replay", "graph_replay")):
            patch(graph, name, graph_call(event))

    collectives = cap.collectives
    if collectives is None:
        return

    def then(say: Callable[[Any, Any], None]) -> Callable[[Any], Any]:
        """What wraps a call to run it, then say what it did (``say(self, its result)``);
        a failure to say it is counted, never the program's."""
        def make(original: Any) -> Any:
            def wrapped(self: Any, *a: Any, **k: Any) -> Any:
                out = original(self, *a, **k)
                if cap.on:
                    try:
                        say(self, out)
                    except Exception as exc:
                        cap.guard.failed(f"{type(self).__name__}.{original.__name__}", exc)
                return out
            return wrapped
        return make

    work_wait = then(lambda work, _: collectives.waited(work))
    work_completed = then(lambda work, done: collectives.queried(work, bool(done)))
    work_future = then(lambda work, _: collectives.future_taken(work))

    group = collectives.ProcessGroup
    if hasattr(group, "_start_coalescing") and hasattr(group, "_end_coalescing"):
        patch(group, "_start_coalescing",
              then(lambda pg, _: collectives.coalescing_started(pg)))
        patch(group, "_end_coalescing", then(collectives.coalescing_ended))
    for name, make in (("get_future", work_future), ("wait", work_wait),
                       ("synchronize", work_wait), ("is_completed", work_completed)):
        if hasattr(collectives.Work, name):  # each, where this PyTorch's Work has it
            patch(collectives.Work, name, make)
