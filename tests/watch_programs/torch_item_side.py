"""``.item()`` of a count computed on a side stream: it waits for the current stream only.

Speculative decoding verifies the draft tokens on a side stream, counting the drafts the
target model accepts, and the host reads the count with ``num_accepted.item()``. ``.item()``
copies on the *current* stream (here the legacy default stream) and synchronizes that stream
only; the non-blocking verify stream is not waited for, so the copy may read the count before
the verify kernels wrote it and the host advances the sequences by a stale number.

Fix (``--fixed``): ``torch.cuda.current_stream().wait_stream(verify)`` before ``.item()``.

Race: the count's write ``num_accepted = matches.cumprod(dim=1).sum()`` on the verify stream
(line 78) and its read ``num_accepted.item()`` on the default stream (line 82). The fix is
line 81.
"""

import argparse
import sys
import time

import numpy as np
import torch

BATCH = 256         # sequences verified together
DRAFT = 8           # draft tokens per sequence
VOCAB = 1024        # the toy target model's vocabulary, also its hidden size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="verify steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(12)
    dev = torch.device("cuda")
    verify = torch.cuda.Stream()            # the verify stream (non-blocking)
    rng = np.random.default_rng(12)
    # A toy target model whose greedy choice is known: one-hot embeddings and an output
    # projection whose row for token t peaks at succ[t].
    succ = rng.permutation(VOCAB)
    embed = torch.eye(VOCAB, device=dev)
    w_out = torch.rand(VOCAB, VOCAB, device=dev)
    w_out[torch.arange(VOCAB, device=dev), torch.from_numpy(succ).to(dev)] = 2.0
    # Each step's drafts: sequence b's first accept[b] drafts are what the target would choose,
    # the next one is not. The total differs from one step to the next.
    inputs = np.empty((args.iters, BATCH, DRAFT), dtype=np.int64)
    drafts = np.empty((args.iters, BATCH, DRAFT), dtype=np.int64)
    expected = []
    for step in range(args.iters):
        accept = rng.integers(0, DRAFT + 1, BATCH)
        if expected and int(accept.sum()) == expected[-1]:
            accept[0] = (accept[0] + 1) % (DRAFT + 1)
        expected.append(int(accept.sum()))
        token = rng.integers(0, VOCAB, BATCH)
        for d in range(DRAFT):
            inputs[step, :, d] = token
            miss = (succ[token] + 1 + rng.integers(0, VOCAB - 1, BATCH)) % VOCAB
            token = np.where(d < accept, succ[token], miss)
            drafts[step, :, d] = token
    inputs_dev = torch.from_numpy(inputs).to(dev)
    drafts_dev = torch.from_numpy(drafts).to(dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(verify):         # warm-up: cuBLAS and the kernels load on first use
        h = embed.index_select(0, inputs_dev[0].view(-1))
        (h @ w_out).argmax(-1).view(BATCH, DRAFT).eq(drafts_dev[0]).long().cumprod(dim=1).sum()
    torch.cuda.synchronize()

    wrong = []
    start = time.perf_counter()
    for step in range(args.iters):
        with torch.cuda.stream(verify):
            h = embed.index_select(0, inputs_dev[step].view(-1))     # (BATCH * DRAFT, VOCAB)
            logits = h @ w_out
            target = logits.argmax(-1).view(BATCH, DRAFT)            # the target's choices
            matches = (target == drafts_dev[step]).long()
            num_accepted = matches.cumprod(dim=1).sum()              # RACE: writes the count
        if args.fixed:
            # FIX: the current stream waits for verify's work before .item() copies on it.
            torch.cuda.current_stream().wait_stream(verify)
        got = num_accepted.item()           # RACE: copies the count on the current stream
        if got != expected[step]:
            wrong.append(f"verify step {step}: .item() gave {got} accepted tokens, the verify "
                         f"stream counted {expected[step]}")
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} steps wrong)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
