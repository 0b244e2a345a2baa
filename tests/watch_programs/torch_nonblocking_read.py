"""The host reads sampled tokens from pinned memory before their non-blocking copy has landed.

A decode loop samples each sequence's next token on the GPU and brings the tokens back with
``tokens_cpu.copy_(next_tokens, non_blocking=True)`` into a pinned buffer, then appends
``tokens_cpu.tolist()`` to the outputs. A ``non_blocking`` device-to-host copy into pinned
memory returns at once; the host's read races with the copy and sees the previous step's
tokens (or a mix), while the device goes on from the right ones.

Fix (``--fixed``): ``torch.cuda.current_stream().synchronize()`` (or an event recorded after
the copy, synchronized) before the host reads the buffer.

Race: the copy ``tokens_cpu.copy_(next_tokens, non_blocking=True)`` (line 61) and the host's
read ``tokens_cpu.tolist()`` (line 65). The fix is line 64.
"""

import argparse
import sys
import time

import numpy as np
import torch

BATCH = 256         # sequences decoded together
VOCAB = 1024        # the toy model's vocabulary, also its hidden size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixed", action="store_true", help="run the fixed twin")
    parser.add_argument("--iters", type=int, default=8, help="decode steps (default 8)")
    args = parser.parse_args()
    if args.iters < 1:
        parser.error("--iters must be at least 1")

    torch.manual_seed(5)
    dev = torch.device("cuda")
    rng = np.random.default_rng(5)
    # A toy model whose greedy choice is known: one-hot embeddings and an output projection
    # whose row for token t peaks at succ[t], one cycle through the vocabulary, so every
    # sequence's token changes at every step.
    order = rng.permutation(VOCAB)
    succ = np.empty(VOCAB, dtype=np.int64)
    succ[order] = np.roll(order, -1)
    embed = torch.eye(VOCAB, device=dev)
    w_out = torch.rand(VOCAB, VOCAB, device=dev)
    w_out[torch.arange(VOCAB, device=dev), torch.from_numpy(succ).to(dev)] = 2.0
    tokens = torch.from_numpy(rng.integers(0, VOCAB, BATCH)).to(dev)   # the prompts' last
    history = torch.zeros(args.iters, BATCH, dtype=torch.int64, device=dev)
    tokens_cpu = torch.zeros(BATCH, dtype=torch.int64, pin_memory=True)
    torch.matmul(embed.index_select(0, tokens), w_out).argmax(-1)   # warm-up: kernels load

    outputs = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(args.iters):
        h = embed.index_select(0, tokens)
        logits = h @ w_out
        next_tokens = logits.argmax(-1)
        history[step].copy_(next_tokens)      # the device's record, to check the host's against
        # BUG without the fix: non_blocking into pinned memory returns before the copy is done.
        tokens_cpu.copy_(next_tokens, non_blocking=True)              # RACE: the copy writes
        if args.fixed:
            # FIX: wait for the stream the copy is on before the host touches the buffer.
            torch.cuda.current_stream().synchronize()
        outputs.append(tokens_cpu.tolist())                           # RACE: the host reads
        tokens = next_tokens
    torch.cuda.synchronize()
    work_s = time.perf_counter() - start

    truth = history.cpu().tolist()
    wrong = []
    for step in range(args.iters):
        bad = sum(a != b for a, b in zip(outputs[step], truth[step]))
        if bad:
            wrong.append(f"decode step {step}: the host read {bad} of {BATCH} sampled tokens "
                         "before the copy landed")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: {wrong[0]} ({len(wrong)} of {args.iters} steps wrong)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
