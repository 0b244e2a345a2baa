"""Greedy generation with a transformers model whose weights live on the CPU (accelerate offload).

Follows accelerate 1.15.0 and transformers 5.17.0. ``--mode cpu_offload``:
``accelerate.cpu_offload(model, execution_device=...)``, "Big Modeling"
(https://huggingface.co/docs/accelerate/en/package_reference/big_modeling): every weight stays in
a CPU state dict and hooks copy each module's weights to the GPU for its forward. ``--mode
device_map``: the model saved with ``save_pretrained`` and loaded back with
``from_pretrained(path, device_map=...)``, half of its decoder layers mapped to "cpu", "Big Model
Inference" (https://huggingface.co/docs/accelerate/en/concept_guides/big_model_inference): those
layers are offloaded and run on the GPU, the rest stay there.

Checks: the generated tokens and a forward's logits equal those of a copy of the model kept whole
on the GPU (logits within 1e-5). The answer is a digest of every generated token id.
"""

import argparse
import copy
import hashlib
import sys
import tempfile
import time

import torch
from accelerate import cpu_offload
from transformers import AutoModelForCausalLM, LlamaConfig

VOCAB = 1024
LAYERS = 4
BATCH = 2
PROMPT_LEN = 12
NEW_TOKENS = 16


def offloaded(model, mode: str, device: torch.device):
    if mode == "cpu_offload":
        return cpu_offload(model, execution_device=device)
    device_map = {"model.embed_tokens": device.index, "model.norm": device.index,
                  "model.rotary_emb": device.index, "lm_head": device.index}
    for i in range(LAYERS):
        device_map[f"model.layers.{i}"] = "cpu" if i >= LAYERS // 2 else device.index
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        return AutoModelForCausalLM.from_pretrained(path, device_map=device_map).eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("cpu_offload", "device_map"), default="cpu_offload")
    parser.add_argument("--iters", type=int, default=20, help="generate calls timed (default 20)")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, eos_token_id=None, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config).eval()
    reference = copy.deepcopy(model).to(device)          # the same weights, whole on the GPU
    model = offloaded(model, args.mode, device)
    prompts = torch.randint(1, VOCAB, (args.iters + 1, BATCH, PROMPT_LEN), device=device)
    mask = torch.ones(BATCH, PROMPT_LEN, dtype=torch.long, device=device)

    def generate(m, ids: torch.Tensor) -> torch.Tensor:
        return m.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                          max_new_tokens=NEW_TOKENS)

    with torch.inference_mode():
        generate(model, prompts[0])                     # warm-up: hooks, cuBLAS, lazy loading
        torch.cuda.synchronize()
        results: list[torch.Tensor] = []
        steps: list[float] = []
        start = time.perf_counter()
        for i in range(1, args.iters + 1):
            t0 = time.perf_counter()
            results.append(generate(model, prompts[i]))
            steps.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        work_s = time.perf_counter() - start

        wrong = [f"call {i}: tokens differ" for i, seq in enumerate(results, 1)
                 if not torch.equal(seq, generate(reference, prompts[i]))]
        logits = model(input_ids=results[-1], attention_mask=torch.ones_like(results[-1])).logits
        ref_logits = reference(input_ids=results[-1],
                               attention_mask=torch.ones_like(results[-1])).logits
        if logits.device != ref_logits.device or not torch.allclose(logits, ref_logits,
                                                                    atol=1e-5, rtol=1e-5):
            wrong.append(f"forward logits differ (on {logits.device})")

    digest = hashlib.sha256(torch.stack(results).cpu().numpy().tobytes())
    print(f"answer={args.mode}:{digest.hexdigest()[:16]}")
    print(f"step_max_s={max(steps):.6f}")
    print(f"work_s={work_s:.6f}")
    if wrong:
        print(f"WRONG: offloaded model ({args.mode}) differs from the model on the GPU: "
              f"{'; '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
