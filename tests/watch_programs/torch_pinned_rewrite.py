"""A persistent pinned staging buffer rewritten by the host while its upload is still queued.

Engines keep one pinned host tensor for each step's input ids and upload it with
``input_ids.copy_(input_ids_cpu, non_blocking=True)``. The copy is asynchronous to the host: it
reads the pinned bytes only when its stream gets to it, and the forward stream is busy with the
previous request's layers. The host writes the next request's ids into the same buffer right
away, so an upload still queued sends the next request's tokens (or a mix) to the device.

Fix (``--fixed``): record an event after the upload and ``uploaded.synchronize()`` before the
host writes the staging buffer again.

Race: the host's write ``input_ids_cpu.copy_(prompts[r])`` (line 63) for request r+1 and the
upload ``input_ids.copy_(input_ids_cpu, non_blocking=True)`` (line 68) of request r, still
queued on the forward stream. The fix is line 62, the wait on the event that line 69
records.
"""

import argparse
import sys
import time

import numpy as np
import torch

TOKENS = 1024       # tokens in one request
VOCAB = 1024
HIDDEN = 1024
LAYERS = 4          # the forward: enough matmuls that the stream runs behind the host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="requests to serve (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(2)
    dev = torch.device("cuda")
    forward = torch.cuda.Stream()           # the engine runs uploads and the model on it
    embed = torch.randn(VOCAB, HIDDEN, device=dev)
    # Column 0 of each embedding row holds its token id: the answer says what was embedded.
    embed[:, 0] = torch.arange(VOCAB, device=dev, dtype=torch.float32)
    layers = [torch.randn(HIDDEN, HIDDEN, device=dev) / HIDDEN ** 0.5 for _ in range(LAYERS)]
    input_ids_cpu = torch.zeros(TOKENS, dtype=torch.int64, pin_memory=True)  # staging buffer
    input_ids = torch.zeros(TOKENS, dtype=torch.int64, device=dev)
    answers = torch.zeros(args.iters, TOKENS, device=dev)
    rng = np.random.default_rng(2)
    prompts = [torch.from_numpy(rng.integers(0, VOCAB, TOKENS)) for _ in range(args.iters)]
    uploaded = torch.cuda.Event()
    torch.cuda.synchronize()                # the forward stream reads what the default one made
    with torch.cuda.stream(forward):        # warm-up: cuBLAS and the kernels load on first use
        torch.relu(embed.index_select(0, input_ids) @ layers[0])
    torch.cuda.synchronize()

    start = time.perf_counter()
    for r in range(args.iters):
        if args.fixed and r > 0:
            # FIX: the previous request's upload has read the staging buffer before the host
            # overwrites it.
            uploaded.synchronize()
        input_ids_cpu.copy_(prompts[r])                           # RACE: the host rewrites it
        with torch.cuda.stream(forward):
            # BUG without the fix: non_blocking returns at once; the copy reads the pinned
            # buffer only when the stream reaches it, behind the previous request's layers,
            # and by then the host may have written the next request's ids there.
            input_ids.copy_(input_ids_cpu, non_blocking=True)     # RACE: the queued upload
            uploaded.record()
            x = embed.index_select(0, input_ids)
            answers[r].copy_(x[:, 0])         # the token ids this request embedded
            h = x
            for w in layers:
                h = torch.relu(h @ w)
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    got = answers.cpu()
    wrong = []
    for r in range(args.iters):
        bad = int((got[r] != prompts[r].to(torch.float32)).sum())
        if bad:
            wrong.append(f"request {r}: {bad} of {TOKENS} embedded token ids are not the "
                         "request's (the upload read the staging buffer after it was rewritten)")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} requests wrong)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
