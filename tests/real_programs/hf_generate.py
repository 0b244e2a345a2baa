"""Greedy ``model.generate(..., cache_implementation=IMPL)`` for each KV cache transformers ships.

Follows transformers 5.17.0, "Cache strategies"
(https://huggingface.co/docs/transformers/en/kv_cache) and "Caching"
(https://huggingface.co/docs/transformers/en/cache_explanation): a causal LM built
from a small config with random weights generates greedily with the named cache. The structure of
a static cache is inferred from the config, so each implementation gets the model family it was
made for: sliding_window a Mistral config with a sliding window, the hybrid family a Gemma 3
config whose ``layer_types`` mix sliding and full attention, the rest a Llama config. On CUDA a
static cache makes ``generate`` compile the decoding step (``torch.compile``, CUDA graphs), as
transformers does by default; the offloaded static ones run eagerly (``disable_compile=True``),
since compiling their prefetch-stream handoff crashes torch 2.11.

Checks: every prompt's tokens equal those of ``generate(..., use_cache=False)``, which recomputes
the whole sequence at each step. ``quantized`` needs optimum-quanto or hqq; without either it
exits 77. The answer is the cache class used and a digest of all generated token ids.
"""

import argparse
import hashlib
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig
from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS
from transformers.utils import is_hqq_available, is_optimum_quanto_available

VOCAB = 1024
PROMPT_LEN = 10
NEW_TOKENS = 20      # prompt + new tokens (30) exceed the sliding window (12)
BATCH = 2
COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              bos_token_id=1, eos_token_id=None, pad_token_id=0)  # no EOS: every call makes 20


def build_config(impl: str):
    if impl == "sliding_window":
        return MistralConfig(**COMMON, sliding_window=12)
    if "hybrid" in impl:
        return Gemma3TextConfig(**COMMON, head_dim=64, sliding_window=12,
                                layer_types=["sliding_attention", "full_attention"] * 2)
    return LlamaConfig(**COMMON)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, choices=ALL_CACHE_IMPLEMENTATIONS)
    parser.add_argument("--iters", type=int, default=20, help="generate calls timed (default 20)")
    args = parser.parse_args()

    generate_kwargs: dict = {}
    if args.cache == "quantized":
        backends = [name for name, present in (("quanto", is_optimum_quanto_available()),
                                               ("hqq", is_hqq_available())) if present]
        if not backends:
            print("SKIP: cache_implementation='quantized' needs optimum-quanto or hqq, neither is "
                  "installed", file=sys.stderr)
            return 77
        # The default residual_length (128) keeps these 30 tokens in full precision, so the
        # check against use_cache=False stays exact.
        generate_kwargs["cache_config"] = {"backend": backends[0], "nbits": 4}
    if args.cache.startswith("offloaded_"):
        # transformers compiles the decoding step of any static cache, but compiling the
        # offloaded one's stream handoff (Cache.update's wait_stream) segfaults in torch 2.11's
        # Dynamo, so these run eagerly, with the documented switch.
        generate_kwargs["disable_compile"] = True

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_config(build_config(args.cache)).to(device).eval()
    # One batch of prompts per timed call, plus one for the warm-up.
    prompts = torch.randint(3, VOCAB, (args.iters + 1, BATCH, PROMPT_LEN), device=device)
    mask = torch.ones(BATCH, PROMPT_LEN, dtype=torch.long, device=device)

    def generate(ids: torch.Tensor, **kwargs):
        return model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              max_new_tokens=NEW_TOKENS, **kwargs)

    with torch.inference_mode():
        out = generate(prompts[0], cache_implementation=args.cache, return_dict_in_generate=True,
                       **generate_kwargs)      # warm-up: compilation, cuBLAS, lazy loading
        cache_class = type(out.past_key_values).__name__
        torch.cuda.synchronize()
        results: list[torch.Tensor] = []
        steps: list[float] = []
        start = time.perf_counter()
        for i in range(1, args.iters + 1):
            t0 = time.perf_counter()
            results.append(generate(prompts[i], cache_implementation=args.cache, **generate_kwargs))
            steps.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        work_s = time.perf_counter() - start

        # Reference: no cache at all, the whole sequence recomputed each step.
        wrong = [i for i, seq in enumerate(results, 1)
                 if not torch.equal(seq, generate(prompts[i], use_cache=False))]

    tokens = torch.stack(results).cpu().numpy().tobytes()
    print(f"answer={args.cache}:{cache_class}:{hashlib.sha256(tokens).hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: cache_implementation={args.cache!r} ({cache_class}) generated other tokens "
              f"than use_cache=False for calls {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
