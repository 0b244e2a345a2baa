"""The CuPy source's streams and events: what orders the device's work and the host's waits.

``cupy.cuda.Stream`` and ``Event`` are Python classes: their methods are replaced in place
(``record``, ``wait_event``, ``synchronize``, ``done``); ``cupy.cuda.Device`` by a Python
subclass, for its ``synchronize``; and ``cupy.cuda.runtime``'s event, wait and synchronize calls
by wrappers. An event recorded inside a watched call follows that call's op, and a host wait
writes everything out before it waits (a dead context or a hang is found right there).
"""

from __future__ import annotations

from typing import Any

from harness.capture.cupy_capture import CupyCapture, named
from harness.capture.sites import program_site


class StreamHooks:
    """Streams, events, the device's synchronize and the runtime's own event calls."""

    def __init__(self, capture: CupyCapture) -> None:
        self.capture = capture

    def install_streams(self) -> None:
        capture = self.capture
        stream_mod = capture.cp.cuda.stream
        base, stream_cls = stream_mod._BaseStream, stream_mod.Stream
        init = stream_cls.__init__
        record, wait_event = base.record, base.wait_event
        synchronize, done = base.synchronize, base.done

        def watched_init(stream: Any, *args: Any, **kwargs: Any) -> None:
            init(stream, *args, **kwargs)
            capture.stream_created(stream.ptr)

        def watched_record(stream: Any, event: Any = None) -> Any:
            if not capture.active:
                return record(stream, event)
            capture.ordered()
            event = record(stream, event)
            capture.emit(["record", event.ptr, capture.sid(stream.ptr), program_site()])
            return event

        def watched_wait(stream: Any, event: Any) -> None:
            wait_event(stream, event)
            if capture.active:
                capture.emit(["wait", event.ptr, capture.sid(stream.ptr), program_site()])

        def watched_sync(stream: Any) -> None:
            capture.on_sync(["sync_stream", capture.sid(stream.ptr), program_site()])
            synchronize(stream)

        def watched_done(stream: Any) -> bool:
            finished = done.fget(stream)
            if finished and capture.active:
                # The vocabulary has no stream query: a stream seen idle orders the host after
                # its work exactly as a synchronize that returned at once would.
                capture.emit(["sync_stream", capture.sid(stream.ptr), program_site()])
            return finished

        capture.patch(stream_cls, "__init__", watched_init)
        capture.patch(base, "record", watched_record)
        capture.patch(base, "wait_event", watched_wait)
        capture.patch(base, "synchronize", watched_sync)
        capture.patch(base, "done", property(watched_done, doc=done.__doc__))

    def install_events(self) -> None:
        capture = self.capture
        event_cls = capture.cp.cuda.Event
        record, synchronize, done = event_cls.record, event_cls.synchronize, event_cls.done

        def watched_record(event: Any, stream: Any = None) -> None:
            if not capture.active:
                return record(event, stream)
            capture.ordered()
            record(event, stream)
            capture.emit(["record", event.ptr, capture.stream_sid(stream), program_site()])

        def watched_sync(event: Any) -> None:
            capture.on_sync(["sync_event", event.ptr, program_site()])
            synchronize(event)

        def watched_done(event: Any) -> bool:
            finished = done.fget(event)
            if capture.active:
                capture.emit(["query", event.ptr, bool(finished), program_site()])
            return finished

        capture.patch(event_cls, "record", watched_record)
        capture.patch(event_cls, "synchronize", watched_sync)
        capture.patch(event_cls, "done", property(watched_done, doc=done.__doc__))

    def install_device(self) -> None:
        capture = self.capture
        base = capture.cp.cuda.Device

        class Device(base):
            __doc__ = base.__doc__

            def synchronize(self) -> None:
                capture.on_sync(["sync_device", program_site()])
                return base.synchronize(self)

        Device.__module__, Device.__qualname__ = base.__module__, base.__qualname__
        capture.patch(capture.cp.cuda, "Device", Device)
        capture.patch(capture.cp.cuda.device, "Device", Device)

    def install_runtime(self) -> None:
        """``cupy.cuda.runtime``'s event, wait and synchronize calls."""
        capture = self.capture
        rt = capture.cp.cuda.runtime
        originals = {name: getattr(rt, name) for name in (
            "eventRecord", "streamWaitEvent", "eventSynchronize", "eventQuery",
            "streamSynchronize", "streamQuery", "deviceSynchronize")}

        def event_record(event: int, stream: int) -> Any:
            capture.ordered()
            result = originals["eventRecord"](event, stream)
            capture.emit(["record", event, capture.sid(stream), program_site()])
            return result

        def stream_wait_event(stream: int, event: int, flags: int = 0) -> Any:
            result = originals["streamWaitEvent"](stream, event, flags)
            capture.emit(["wait", event, capture.sid(stream), program_site()])
            return result

        def event_synchronize(event: int) -> Any:
            capture.on_sync(["sync_event", event, program_site()])
            return originals["eventSynchronize"](event)

        def event_query(event: int) -> Any:
            status = originals["eventQuery"](event)
            capture.emit(["query", event, status == 0, program_site()])
            return status

        def stream_synchronize(stream: int) -> Any:
            capture.on_sync(["sync_stream", capture.sid(stream), program_site()])
            return originals["streamSynchronize"](stream)

        def stream_query(stream: int) -> Any:
            status = originals["streamQuery"](stream)
            if status == 0:  # idle: as a synchronize that returned at once (see Stream.done)
                capture.emit(["sync_stream", capture.sid(stream), program_site()])
            return status

        def device_synchronize() -> Any:
            capture.on_sync(["sync_device", program_site()])
            return originals["deviceSynchronize"]()

        for name, wrapper in (("eventRecord", event_record),
                              ("streamWaitEvent", stream_wait_event),
                              ("eventSynchronize", event_synchronize),
                              ("eventQuery", event_query),
                              ("streamSynchronize", stream_synchronize),
                              ("streamQuery", stream_query),
                              ("deviceSynchronize", device_synchronize)):
            capture.patch(rt, name, named(wrapper, name, originals[name]))
