"""Request-level workloads: the conversation (a retained catalog re-activated every request)
and a recorded ticket's replay (its requests over its lanes, as an engine's batch slots)."""

from __future__ import annotations

import kvcore
from harness.traces import batching
from harness.lang.model import PlaneSpec, PoolSpec
from harness.results.outcome import Outcome
from harness.traces.ticket import Ticket

from harness.run.steps import Trials
from harness.run.world import World


class _RequestLoop:
    """What request-level workloads share: each request's phases label the ops (and may carry
    the amplifying delay), and a fault is attributed to the request it surfaced in."""

    def __init__(self, executor: Trials, world: World) -> None:
        self.ex = executor
        self.w = world

    def _phase(self, name: str, number: int) -> None:
        self.w.device.oplog.step = f"request {number} {name}"
        self.ex.amplifier(self.w, name)

    @staticmethod
    def _crashed_in(exc: kvcore.DeviceFaultError, number: int) -> None:
        exc.gpurace_step = f"request {number}"  # type: ignore[attr-defined]
        exc.gpurace_request = number  # type: ignore[attr-defined]


class _Conversation(_RequestLoop):
    """One trial of the conversation workload (#210's shape): a retained catalog re-activated
    every request, the decode reading its row, while a second lane churns pages."""

    def __init__(self, executor: Trials, world: World) -> None:
        super().__init__(executor, world)
        assert executor.scenario.workload is not None
        self.wl = executor.scenario.workload

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w, wl = self.w, self.wl
        pool, device, compute, transfer = w.pool, w.device, w.context.stream, \
            w.context.transfer_stream
        fill = w.scratch
        fill.fill(0x5A)
        conversation = kvcore.KVConversationCatalog(w.table, "conversation")
        conversation.retain(pool.materialize(wl.initial_pages))
        pool.copy_from_host(fill, conversation.handles, compute)
        conversation.bind()
        request = 0
        try:
            for request in range(1, wl.requests + 1):
                self._phase("churn", request)
                churn = pool.materialize(wl.churn_pages)
                pool.copy_from_host(fill, [lease.handle for lease in churn], transfer)
                if churn:  # churn_pages: 0 (no second lane); kvcore releases no empty list
                    pool.release(churn)
                self._phase("prefill", request)
                fresh = pool.materialize(wl.pages_per_turn)
                pool.copy_from_host(fill, [lease.handle for lease in fresh], compute)
                conversation.retain(fresh)
                self._phase("activate", request)
                entries = conversation.activate(compute)
                self._phase("decode", request)
                w.table.read(conversation.rows[0], entries, compute, result=w.counters)
                # The engine waits for each decode step's result before sampling: the
                # assert, if one fired, surfaces here.
                device.synchronize_stream(compute)
        except kvcore.DeviceFaultError as exc:
            self._crashed_in(exc, request)
            raise
        finally:
            device.oplog.step = None
        w.context.synchronize()
        conversation.release()
        w.context.synchronize()
        return Outcome.CLEAN, "", None, wl.requests


def pool_for(ticket: Ticket) -> PoolSpec:
    """The pool a ticket describes: its KV geometry and page count, a table row per lane."""
    h = ticket.header
    return PoolSpec(pages=h.pool_pages, page_tokens=h.page_tokens,
                    planes=(PlaneSpec(h.dtype, h.leading, h.heads, 256),),
                    table_rows=h.lanes, max_pages_per_row=h.pool_pages)


class _TicketReplay(_RequestLoop):
    """One trial of a recorded ticket: its requests in order over its lanes, like an engine's
    batch slots. A conversation's pages stay retained in its catalog between turns and are
    re-activated every turn; prefill writes the new pages; each decode step reads the lane's
    table row with the asserting reader; a finished conversation releases its pages, which other
    lanes then reuse."""

    def __init__(self, executor: Trials, world: World, ticket: Ticket) -> None:
        super().__init__(executor, world)
        self.ticket = ticket

    def run(self) -> tuple[Outcome, str, str | None, int | None]:
        w = self.w
        pool, device, compute = w.pool, w.device, w.context.stream
        fill = w.scratch
        fill.fill(0x5A)
        rows = [w.table.acquire() for _ in range(self.ticket.header.lanes)]
        live: dict[str, kvcore.KVConversationCatalog] = {}
        entries: dict[str, int] = {}  # conversation -> entries its row holds
        step = None
        try:
            for step in batching.plan(self.ticket):
                for work in step.work:
                    req = work.request
                    if work.opens:
                        live[req.conversation] = kvcore.KVConversationCatalog(
                            w.table, req.conversation)
                        live[req.conversation].bind(rows[req.lane])
                    catalog = live[req.conversation]
                    if work.new_pages:
                        self._phase("prefill", work.number)
                        fresh = pool.materialize(work.new_pages)
                        pool.copy_from_host(fill, [lease.handle for lease in fresh], compute)
                        catalog.retain(fresh)
                    if work.activate:
                        self._phase("activate", work.number)
                        entries[req.conversation] = catalog.activate(compute)
                    self._phase("decode", work.number)
                    w.table.read(rows[req.lane], entries[req.conversation], compute,
                                 result=w.counters)
                # The engine waits for the step's tokens before it schedules the next one.
                device.synchronize_stream(compute)
                for conversation in step.releases:
                    pool.release(live.pop(conversation).leases)
                    del entries[conversation]
        except kvcore.DeviceFaultError as exc:
            if step is not None:
                # Several requests were in flight; the fault names none of them. Say how far
                # into the ticket the engine had got, and which were in the batch.
                self._crashed_in(exc, step.admitted)
                exc.gpurace_step = (  # type: ignore[attr-defined]
                    f"request {step.admitted} (in flight: requests "
                    f"{', '.join(map(str, step.in_flight))})")
            raise
        finally:
            device.oplog.step = None
        w.context.synchronize()
        for catalog in live.values():
            pool.release(catalog.leases)
        for row in rows:
            w.table.release_row(row)
        w.context.synchronize()
        return Outcome.CLEAN, "", None, len(self.ticket.requests)
