"""torch.distributed's functional collectives (``torch.ops._c10d_functional``), as the stream
work they are: what DTensor, ``torch.distributed._functional_collectives`` and torch.compile's
generated code issue.

A functional collective returns its result at once and hands its Work to no one: PyTorch keeps
it for the result tensor, and ``wait_tensor(result)`` waits for it. So, as for c10d's own
collectives (:mod:`harness.capture.torch_collectives`), the collective runs on its process
group's stream, which waits for the current stream when it is issued, and the current stream
(NCCL; the host for gloo) is ordered after it only at ``wait_tensor`` of its result. Eager code
gets an ``AsyncCollectiveTensor``, which calls ``wait_tensor`` at its first use; torch.compile's
code calls it where its scheduler put it (pytorch/pytorch#152252 shows that code), so a use of
the result placed before the wait races with the collective.

What each op touches follows PyTorch's implementation of them: ``all_reduce``,
``all_reduce_coalesced`` and ``broadcast`` copy their input on the current stream and run in
place on the copy, so their input is not read by the collective; the ``_``-suffixed ones run in
place on their input; the others (``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_to_all_single`` and their ``_out`` and ``_coalesced`` forms) read their input and write
their output on the group's stream. Point-to-point ones (``isend``, ``irecv``,
``batch_p2p_ops``) are taken as ops of the current stream, in the program's order: a race with
them is missed, none is made up.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any, NamedTuple

from harness.capture.sites import program_frame, site_of
from harness.capture.torch_ops import Pending, Plan, byte_spans, tensors_in
from harness.races.kinds import FUNCTIONAL_COLLECTIVE

WAIT = "wait_tensor"
_COPY_FIRST = frozenset({"all_reduce", "all_reduce_coalesced", "broadcast"})
_IN_PLACE = frozenset({"all_reduce_", "all_reduce_coalesced_", "broadcast_"})

WAITS_KNOWN = 4096
"""Results not yet waited for that the source follows; past this, the oldest is forgotten
(its wait, if it comes, is then not seen: a missed race, never a made-up one)."""


class Outstanding(NamedTuple):
    """A functional collective not waited for yet: the event recorded after it, its CUDA device
    (None: host memory), and whether its wait is a stream's (NCCL) or the host's."""

    event: int
    device: int | None
    stream_wait: bool


class Functional:
    """The functional collectives of one capture (``collectives``: its c10d part, whose group
    streams and events they share)."""

    def __init__(self, collectives: Any) -> None:
        self.collectives = collectives
        self.cap = collectives.cap
        self.outstanding: dict[int, Outstanding] = {}  # a result's storage -> its collective
        self.forgotten = 0
        c10d = collectives.c10d
        self.resolve = getattr(c10d, "_resolve_process_group", None)

    def dispatch(self, plan: Plan, func: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """Run the op; then say it (a collective) or its wait (``wait_tensor``)."""
        out = func(*args, **kwargs)  # the program's own errors are its own
        t0 = perf_counter_ns()
        site = None
        try:
            if plan.name == WAIT:
                site = self._waited(args[0] if args else kwargs.get("tensor"))
            else:
                site = self._issued(plan, args, kwargs, out, t0)
        except Exception as exc:  # never the program's failure: it runs on unwatched
            self.cap.guard.failed(f"the functional collective {plan.name}", exc)
        self.cap.account(perf_counter_ns() - t0, site, plan.name)
        return out

    def _spans(self, value: Any) -> tuple[list[list[Any]], int | None, list[int]]:
        """A tensor's (or a list's) watched byte spans, its CUDA device and its storages."""
        spans: list[list[Any]] = []
        device, bases = None, []
        for t in tensors_in(value, self.cap.Tensor):
            where = self.cap.memory(t)
            if where is None:
                continue
            if device is None and t.is_cuda:
                device = t.get_device()
            spans += byte_spans(where[0], t, t.data_ptr())
            bases.append(where[1])
        return spans, device, bases

    def _issued(self, plan: Plan, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                t0: int) -> str | None:
        name = plan.name
        given = args[0] if args else kwargs.get("input", kwargs.get("inputs"))
        result = kwargs.get("out", out)
        inputs, device, in_bases = self._spans(given)
        outputs, out_device, bases = self._spans(result)
        device = device if device is not None else out_device
        group = kwargs.get("group_name", args[-1] if args else None)
        if not (inputs or outputs) or group is None:
            return None  # no watched memory: nothing to order
        pg = self.resolve(group) if isinstance(group, str) and self.resolve else group
        collectives = self.collectives
        frame = program_frame(1)
        site = site_of(frame)
        meta: dict[str, Any] = {"site": site, "op": name, "source": "torch", "t": t0}
        kind = FUNCTIONAL_COLLECTIVE + name.rstrip("_")
        current = None if device is None else collectives.current(device, frame)
        if "out" not in kwargs and name not in _IN_PLACE:
            # A new result, made on the current stream as the op was issued: its allocation
            # is said first, named as the program names it, as any op's new memory is.
            made = Pending([], [], set(in_bases), frame, site, meta)
            made.sid = current
            self.cap.outputs(plan, out, made)
        if name in _COPY_FIRST:
            # The copy it runs in place on, made on the current stream as it is issued.
            copy = "kernel:clone" if current is not None else (
                "host_write" if outputs else "host_read")
            self.cap.emit(["op", current, copy, inputs, outputs, dict(meta)])
            reads = writes = outputs
        elif name in _IN_PLACE:
            reads = writes = inputs
        else:
            reads, writes = inputs, outputs
        issue = collectives.on_group_stream(pg, device, frame, name.rstrip("_"),
                                            ["op", None, kind, reads, writes, meta])
        for base in bases:  # the result's storages, which wait_tensor is given
            if len(self.outstanding) >= WAITS_KNOWN:
                self.outstanding.pop(next(iter(self.outstanding)))
                self.forgotten += 1
            self.outstanding[base] = Outstanding(issue.event, issue.device, issue.stream_wait)
        return site

    def _waited(self, tensor: Any) -> str | None:
        where = self.cap.memory(tensor) if isinstance(tensor, self.cap.Tensor) else None
        outstanding = None if where is None else self.outstanding.pop(where[1], None)
        if outstanding is None:
            return None  # waited before, or not a result watched
        frame = program_frame(1)
        self.collectives.wait_for((outstanding.event,), outstanding.device,
                                  outstanding.stream_wait, frame)
        return site_of(frame)

    def notes(self) -> list[str]:
        if not self.forgotten:
            return []
        return [f"{self.forgotten} functional collectives' results were not waited for while "
                f"{WAITS_KNOWN} newer ones were outstanding: a wait_tensor on one of them "
                "later was not seen"]
