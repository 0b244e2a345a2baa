"""What a backend implements: the ``_do_*`` hooks :class:`~kvcore.device.base.Device` calls.

The device checks every call and writes the op log; a backend (``cuda.py``: CuPy, ``sim.py``:
the simulated device) only acts. Each hook takes arguments the device has checked already.
A stream op's hook returns the op's device times when it knows them (the simulated device),
else None, or something the backend reads the times from later (see ``_do_times``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from kvcore.device.graph import START, Graph
from kvcore.device.handles import Buffer, Event, Stream
from kvcore.device.kernels import Kernel


@dataclass(frozen=True)
class DeviceInfo:
    """What a run report says about the device it ran on."""

    backend: str
    name: str
    details: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "name": self.name, **self.details}


class Backend(ABC):
    """The hooks a backend implements, and the defaults of those it may leave alone."""

    @abstractmethod
    def _legacy_handle(self) -> object: ...

    @abstractmethod
    def _do_stream(self, blocking: bool, priority: int) -> object: ...

    @abstractmethod
    def _do_alloc(self, nbytes: int, space: str) -> object: ...

    @abstractmethod
    def _do_event(self) -> object: ...

    @abstractmethod
    def _do_record(self, event: Event, stream: Stream) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_wait(self, stream: Stream, event: Event) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_copy(
        self, dst: Buffer, dst_off: int, src: Buffer, src_off: int, nbytes: int, stream: Stream
    ) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_copy_2d(
        self, dst: Buffer, dst_off: int, dst_pitch: int, src: Buffer, src_off: int,
        src_pitch: int, width: int, height: int, stream: Stream,
    ) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_memset(
        self, dst: Buffer, off: int, nbytes: int, value: int, stream: Stream
    ) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_launch(self, kernel: Kernel, stream: Stream) -> tuple[int, int] | None: ...

    @abstractmethod
    def _do_graph_end(self, graph: Graph) -> object:
        """What launches the captured ``graph`` (a CUDA graph's executable on the GPU)."""

    @abstractmethod
    def _do_graph_launch(self, graph: Graph, stream: Stream) -> None:
        """Run the ended ``graph``'s nodes on ``stream``, in order, as one unit."""

    @abstractmethod
    def _do_host_view(self, buf: Buffer) -> np.ndarray:
        """The pinned buffer as a uint8 array, after every device action that precedes 'now'."""

    @abstractmethod
    def _do_host_written(self, buf: Buffer, off: int, nbytes: int) -> None:
        """The host wrote these bytes (lets the simulator account host time)."""

    def _do_fill(self, buf: Buffer, off: int, nbytes: int, value: int) -> None:
        """The host sets these bytes of pinned memory to ``value``."""
        self._do_host_view(buf)[off:off + nbytes] = value
        self._do_host_written(buf, off, nbytes)

    def _do_write(self, buf: Buffer, off: int, raw: np.ndarray) -> None:
        """The host stores ``raw`` (bytes) into pinned memory at ``off``."""
        self._do_host_view(buf)[off:off + raw.size] = raw
        self._do_host_written(buf, off, raw.size)

    def as_reissued(self) -> None:
        """What this device runs from now on stands in for a program issued again (see
        :meth:`reissue`): a simulated device, new every trial and so never given the program an
        earlier trial captured, runs the code but times the host's steps as a reissued trial's.
        Real time passes as it does on the GPU, where this does nothing."""

    def _do_host_step(self) -> None:
        """The harness goes on to a scenario's next step (see ``Device.host_step``): nothing
        to do where real time passes."""

    def _do_host_thread_switch(self, start: bool) -> None:
        """The host goes on in another of its threads (see ``Device.host_thread_switch``):
        nothing to do where real time passes."""

    @abstractmethod
    def _do_sync_device(self) -> None: ...

    @abstractmethod
    def _do_sync_stream(self, stream: Stream) -> None: ...

    @abstractmethod
    def _do_sync_event(self, event: Event) -> None: ...

    @abstractmethod
    def _do_query(self, event: Event) -> bool:
        """cudaEventQuery: whether ``event``'s latest record has completed (an event never
        recorded counts as completed, as in CUDA). Must not block."""

    def _do_times(self, pending: list[tuple[int, object]]) -> list[tuple[int, int, int]]:
        """The times of ``pending`` ops (a backend that times ops after the fact)."""
        return []

    @abstractmethod
    def _clock_ns(self) -> int:
        """The host's clock for op records: virtual on sim, perf_counter on cuda."""

    def _translate_error(self, exc: Exception) -> BaseException:
        """The kvcore error for a backend's exception (``exc`` itself when it is not the
        backend's): what a reissued call raises."""
        return exc

    @abstractmethod
    def info(self) -> DeviceInfo: ...

    def close(self) -> None:
        """Release what the backend holds. Safe to call twice."""

    def _issue_nodes(self, graph: Graph, lanes: dict[str, Stream], marks: dict[int, Event],
                     head: Stream) -> None:
        """A backend's issue of ``graph``'s nodes, each on its branch's lane, with the launch's
        edges between them (:meth:`Graph.plan`): the start marked on ``head`` (the launching
        stream, or the capture's), each marked node's event recorded after it, each wait before
        the node that needs it, and ``head`` waiting for the branches' tail. The class's
        actions are called, not the instance's: a backend may wrap its own (the GPU's timeline
        times each op with events), and a graph holds none of those wrappers."""
        plan, cls = graph.plan(), type(self)
        if START in plan.marked:
            cls._do_record(self, marks[START], head)
        for i, node in enumerate(graph.nodes):
            lane = lanes[node.branch]
            for dep in plan.waits[i]:
                cls._do_wait(self, lane, marks[dep])
            getattr(cls, node.name)(self, *node.on(lane))
            if i in plan.marked:
                cls._do_record(self, marks[i], lane)
        for dep in plan.tail:
            cls._do_wait(self, head, marks[dep])
