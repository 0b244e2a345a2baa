"""A tensor freed while a side stream still reads it: the caching allocator hands it out again.

KV offload gathers a request's pages into a fresh tensor on the compute stream
(``staged = kv_cache.index_select(...)``); the transfer stream, after ``wait_stream``, repacks
it into the host layout (a kernel that reads ``staged``) and copies that to pinned memory; then
the host drops ``staged``. PyTorch's caching allocator only knows the stream that allocated a
block: once freed, the block goes to the very next allocation on the compute stream, the next
chunk's gather, which overwrites it while the transfer stream, behind the PCIe copies still
queued, has not yet read it.

Fix (``--fixed``): ``staged.record_stream(transfer)`` before ``del staged``; the allocator then
keeps the block until the work queued on ``transfer`` by then is done.

Race: the transfer stream's read ``packed = staged.transpose(0, 1).contiguous()`` (line 89)
of chunk c and the compute stream's write ``staged = kv_cache.index_select(0, page_ids[c])``
(line 85) of chunk c+1 into the same block, freed at ``del staged`` (line 97). The fix is
line 96.
"""

import argparse
import sys
import time

import numpy as np
import torch

NUM_PAGES = 512          # the device page pool
PAGE_ELEMS = 2048        # per K and per V: a page is 2 x 2048 fp32, 16 KiB
CHUNK_PAGES = 256        # pages offloaded at a time: 4 MiB
CHUNKS = 4               # chunks per request
RING = 4                 # pinned host slots in flight


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    dev = torch.device("cuda")
    compute = torch.cuda.current_stream()   # the engine computes on the default stream
    transfer = torch.cuda.Stream()          # the offload stream (non-blocking)
    # Device layout: page-major [page][K|V][elems]. Every element of page p holds p.
    kv_cache = torch.arange(NUM_PAGES, dtype=torch.float32, device=dev)
    kv_cache = kv_cache[:, None, None].expand(NUM_PAGES, 2, PAGE_ELEMS).contiguous()
    rng = np.random.default_rng(3)
    chunks = args.iters * CHUNKS
    ids = np.stack([rng.permutation(NUM_PAGES)[:CHUNK_PAGES] for _ in range(chunks)])
    page_ids = torch.from_numpy(ids).to(dev)                 # each chunk's page ids
    want = torch.from_numpy(ids.astype(np.float32))          # what each chunk's pages hold
    # Host layout: K-major [K|V][page][elems], in pinned slots the transfer stream fills.
    host_ring = torch.zeros(RING, 2, CHUNK_PAGES, PAGE_ELEMS, pin_memory=True)
    ring_done = [torch.cuda.Event() for _ in range(RING)]
    ring_chunk = [-1] * RING
    wrong = []

    def commit(slot: int) -> None:
        """The host: the chunk in ``slot`` has landed; check it before the slot is reused."""
        c = ring_chunk[slot]
        ring_done[slot].synchronize()
        k_first = host_ring[slot, 0, :, 0]      # the first K element of every page
        v_last = host_ring[slot, 1, :, -1]      # the last V element of every page
        if not (torch.equal(k_first, want[c]) and torch.equal(v_last, want[c])):
            bad = int(((k_first != want[c]) | (v_last != want[c])).sum())
            wrong.append(f"request {c // CHUNKS}: {bad} of {CHUNK_PAGES} offloaded pages of "
                         f"chunk {c % CHUNKS} hold another chunk's KV")
        ring_chunk[slot] = -1

    torch.cuda.synchronize()
    with torch.cuda.stream(transfer):       # warm-up: the kernels load on first use
        kv_cache[:CHUNK_PAGES].transpose(0, 1).contiguous()
    kv_cache.index_select(0, page_ids[0])
    torch.cuda.synchronize()

    start = time.perf_counter()
    for r in range(args.iters):
        for chunk in range(CHUNKS):
            c = r * CHUNKS + chunk
            slot = c % RING
            if ring_chunk[slot] >= 0:
                commit(slot)
            # Compute stream: gather the chunk's pages into a new tensor.
            staged = kv_cache.index_select(0, page_ids[c])        # RACE: writes the block
            transfer.wait_stream(compute)     # the repack waits for the gather: that is right
            with torch.cuda.stream(transfer):
                # Repack to the host layout (a kernel on transfer reading staged), then copy.
                packed = staged.transpose(0, 1).contiguous()      # RACE: reads staged
                host_ring[slot].copy_(packed, non_blocking=True)
                ring_done[slot].record()
            ring_chunk[slot] = c
            if args.fixed:
                # FIX: tell the allocator that transfer uses the block; it will not hand the
                # block out again until the work queued on transfer by now has finished.
                staged.record_stream(transfer)
            del staged   # BUG without the fix: the next gather on compute gets this block
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    for slot in sorted(range(RING), key=lambda s: ring_chunk[s]):  # the last chunks, in order
        if ring_chunk[slot] >= 0:
            commit(slot)
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {chunks} chunks wrong)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
