"""A hand-written greedy decode loop over transformers' offloaded ``DynamicCache``.

Follows transformers 5.17.0, "Cache strategies", offloaded cache
(https://huggingface.co/docs/transformers/en/kv_cache) and the ``DynamicCache`` example of
"Caching" (https://huggingface.co/docs/transformers/en/cache_explanation): the cache is made by
the user, ``DynamicCache(config=model.config, offloading=True)``, and passed to
``model(input_ids=..., past_key_values=cache, use_cache=True)`` one token at a time, as one does
when writing one's own decode loop. The offloaded cache keeps each layer's keys and values on the
CPU and prefetches the next layer on a side stream while the current one computes.

Checks: the tokens and the last step's logits equal those of the same loop over a plain
``DynamicCache`` (logits within 1e-4). The answer is a digest of every generated token id.
"""

import argparse
import hashlib
import sys
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

VOCAB = 1024
BATCH = 2
PROMPT_LEN = 16
NEW_TOKENS = 32


def decode(model, prompt: torch.Tensor, offloading: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decode of NEW_TOKENS tokens; returns the tokens and the last step's logits."""
    cache = DynamicCache(config=model.config, offloading=offloading)
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)   # prefill
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(NEW_TOKENS - 1):
        out = model(input_ids=tokens[-1], past_key_values=cache, use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1), out.logits[:, -1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="decodes timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    model = AutoModelForCausalLM.from_config(config).to(device).eval()
    prompts = torch.randint(0, VOCAB, (args.iters + 1, BATCH, PROMPT_LEN), device=device)

    with torch.inference_mode():
        decode(model, prompts[0], offloading=True)      # warm-up: cuBLAS, pinned buffers
        torch.cuda.synchronize()
        results: list[tuple[torch.Tensor, torch.Tensor]] = []
        steps: list[float] = []
        start = time.perf_counter()
        for i in range(1, args.iters + 1):
            t0 = time.perf_counter()
            results.append(decode(model, prompts[i], offloading=True))
            steps.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        work_s = time.perf_counter() - start

        wrong = []
        for i, (tokens, logits) in enumerate(results, 1):
            ref_tokens, ref_logits = decode(model, prompts[i], offloading=False)
            if not torch.equal(tokens, ref_tokens):
                wrong.append(f"decode {i}: tokens differ")
            elif not torch.allclose(logits, ref_logits, atol=1e-4, rtol=1e-4):
                wrong.append(f"decode {i}: logits differ by "
                             f"{(logits - ref_logits).abs().max().item():.3g}")

    digest = hashlib.sha256(torch.stack([t for t, _ in results]).cpu().numpy().tobytes())
    print(f"answer={digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: offloaded DynamicCache differs from DynamicCache: {'; '.join(wrong)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
