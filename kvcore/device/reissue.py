"""The reissuer: issues a captured device program again, on the device that captured it.

It makes the program's calls again and hands the op log's observers the same records,
numbered and stamped now. When every observer takes segments, the records go out unbuilt,
as :class:`~kvcore.device.oplog.Segment` s, cut wherever something must come between them:
a record a call captured as itself writes, a blocking hook, an error.

This is a hot path: it is the host's part of a reissued trial's race window. So the loops
bind what they read to locals, and unpack records rather than read them field by field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kvcore.device.handles import Buffer, Stream
from kvcore.device.oplog import OpLog, OpRecord, Segment, live_detail
from kvcore.device.program import CALL, CALLS, Apart, Live, Program, Run
from kvcore.errors import DeviceFaultError, DeviceUsageError

_new = tuple.__new__  # builds a named tuple without its Python-level __new__


class _Device(Protocol):
    """What a reissuer reads of its device (a ``kvcore.device.base.Device``, which builds the
    reissuer and so is not imported here), besides the calls the program holds."""

    oplog: OpLog
    fault: DeviceFaultError | None
    _run: Reissuer | None  # set while a run goes out as segments (see Reissuer.in_call)

    def _clock_ns(self) -> int: ...

    def _blocking(self) -> None: ...

    def _translate_error(self, exc: Exception) -> BaseException: ...


class Reissuer:
    """Issues programs again on ``device`` (see ``Device.reissue``)."""

    def __init__(self, device: _Device) -> None:
        self.device = device
        self.live: list[int] = []  # the bytes reissued Live memsets set, in order
        # The run being handed out as segments: the records sent so far, the first of those
        # not yet issued, and the call captured as itself now running (see in_call).
        self._run: Run | None = None
        self._sent = self._upto = 0
        self._call: Apart | None = None

    def issue(self, program: Program, start: int, stop: int | None) -> None:
        device = self.device
        log = device.oplog
        if program.refused is not None:
            raise DeviceUsageError(f"a program that captured {program.refused} cannot be "
                                   "issued again; run the code instead")
        if program.observed != log.active:
            raise DeviceUsageError("the op log's observers changed since the program was "
                                   "captured; capture it again")
        if device.fault is not None:
            raise device.fault
        calls = program.calls
        stop = len(calls) if stop is None else stop
        self.live.clear()
        i = start
        try:
            if not program.observed and not log.blocking_hooks:
                # Nobody reads the op log: the calls alone.
                for fn, args, i in program.bare(start, stop):  # noqa: B007 - i: see except
                    fn(*args)
                return
            if log.segmented:
                i = -1  # the item that raised is set by _segments
                self._segments(program, start, stop)
                return
            items, new, clock, observers = program.items, _new, device._clock_ns, log.observers
            for i in range(start, stop):
                fn, args, kind, blocking, template = calls[i]
                if kind == CALL:
                    log.step, log.origin, log.thread = items[i].where
                    fn(*args)  # type: ignore[misc]
                    continue
                if blocking:
                    device._blocking()
                times = fn(*args) if fn is not None else None
                if template is None:
                    continue
                stream, what, reads, writes, records, waits, syncs, step, detail, timed, live = \
                    template
                start_ns, end_ns = times if timed and times is not None else (None, None)
                if live is not None:
                    detail = live_detail(template, self.live.pop(0))
                seq = log.seq = log.seq + 1
                record = new(OpRecord, (seq, stream, what, reads, writes, records, waits, syncs,
                                        step, clock(), start_ns, end_ns, detail))
                for observer in observers:
                    observer(record)
        except BaseException as exc:
            if i >= 0:
                program.failed_at = i
            err = device._translate_error(exc) if isinstance(exc, Exception) else exc
            if err is not exc:
                raise err  # noqa: B904 - its cause is set
            raise

    def _segments(self, program: Program, start: int, stop: int) -> None:
        """:meth:`issue` for observers that all take segments: the calls, and the records
        as one segment, unbuilt (the device's times left out). What comes between splits it:
        a record a call writes (see :meth:`in_call`), a blocking hook, an error (the records
        of the items before the one that raised go out)."""
        device = self.device
        run = program.run(start, stop, bool(device.oplog.blocking_hooks))
        self._run, self._sent, self._call = run, 0, None
        device._run = self  # a record written meanwhile comes through in_call
        i = start
        try:
            for plain, apart in run.chunks:
                for fn, args, i in plain:  # noqa: B007 - i: see except
                    fn(*args)
                if apart is not None:
                    i = apart.index
                    if apart.how == CALLS:
                        # Its records, if it writes any, say where it is (see in_call).
                        self._call = apart
                    else:
                        self._upto = apart.before
                        self._flush()
                        device._blocking()
                    apart.fn(*apart.args)
            i = stop
        except BaseException:
            program.failed_at = i
            raise
        finally:
            self._upto = run.before.get(i, len(run.templates))
            self._flush()
            self._run = self._call = None
            device._run = None

    def in_call(self) -> None:
        """A record of a call in a reissued run: the run's records before the call go out
        first, and the op log says where the call is."""
        call = self._call
        if call is not None:
            log = self.device.oplog
            log.step, log.origin, log.thread = call.where
            self._upto = call.before
        self._flush()

    def _flush(self) -> None:
        """Hand the observers the records of the run's items issued so far (as far as
        ``_upto``), numbered now."""
        run = self._run
        sent, upto = self._sent, self._upto
        if run is None or upto <= sent:
            return
        self._sent = upto
        templates, m = run.cut(sent, upto)
        values: tuple[int, ...] = ()
        if m:  # the bytes the run's Live memsets set, for their records
            values = tuple(self.live[:m])
            del self.live[:m]
        log = self.device.oplog
        segment = _new(Segment, (templates, log.seq + 1, values, self.device._clock_ns()))
        log.seq += upto - sent
        for observer in log.segment_observers:
            observer(segment)

    def memset_live(self, do_memset: Callable[..., Any], dst: Buffer, off: int, nbytes: int,
                    value: Live, stream: Stream) -> Any:
        """A reissued memset of the byte a :class:`Live` holds now."""
        return do_memset(dst, off, nbytes, self.live_byte(value), stream)

    def live_byte(self, value: Live) -> int:
        """The byte a reissued memset of ``value`` sets now, kept for its record."""
        byte = value.value & 0xFF
        self.live.append(byte)
        return byte
