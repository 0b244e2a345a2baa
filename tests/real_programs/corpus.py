"""The corpus of real programs: one entry per program variant, for the runner and the benchmark.

Plain Python (no torch import). Each entry runs as
``python tests/real_programs/<script> <args...> [--iters N]`` on one CUDA GPU and ends its stdout
with ``answer=...``, ``step_max_s=...`` and ``work_s=...``. Exit 0: the program's own check
passed; 1: it failed (a ``WRONG: ...`` line on stderr); 77: the variant cannot run here (a
``SKIP: ...`` line on stderr says why; README.md lists which and where).
"""

from __future__ import annotations

from typing import NamedTuple

TRANSFORMERS = "transformers 5.17.0"
TORCH = "torch 2.11"


class Entry(NamedTuple):
    name: str                   # unique, e.g. "hf_generate-offloaded"
    script: str                 # file name in this folder, e.g. "hf_generate.py"
    args: tuple[str, ...]       # e.g. ("--cache", "offloaded")
    needs: tuple[str, ...]      # modules that must import, e.g. ("transformers",)
    library: str                # e.g. "transformers 5.17.0"
    # "clean": the library is correct, the watch must find nothing and change nothing.
    # "race": the library races (README.md shows how), the watch must report it.
    expect: str = "clean"


# transformers.generation.configuration_utils.ALL_CACHE_IMPLEMENTATIONS in 5.17.0
CACHE_IMPLEMENTATIONS = ("static", "offloaded_static", "sliding_window", "hybrid", "hybrid_chunked",
                         "offloaded_hybrid", "offloaded_hybrid_chunked", "dynamic", "offloaded",
                         "quantized")

# The offloaded caches race in 5.17.0: the offload copy into pinned memory and its prefetch
# back are unordered, and so are the cat and the prefetch block the allocator hands out again
# (probes/hf_offload_notes.md; on an H200, delays placed by hand made the answers wrong).
OFFLOADED = ("offloaded", "offloaded_static", "offloaded_hybrid", "offloaded_hybrid_chunked")

CORPUS: tuple[Entry, ...] = (
    *(Entry(f"hf_generate-{impl}", "hf_generate.py", ("--cache", impl), ("torch", "transformers"),
            TRANSFORMERS, "race" if impl in OFFLOADED else "clean")
      for impl in CACHE_IMPLEMENTATIONS),
    Entry("hf_offloaded_forward", "hf_offloaded_forward.py", (), ("torch", "transformers"),
          TRANSFORMERS, "race"),
    *(Entry(f"accelerate_cpu_offload-{mode}", "accelerate_cpu_offload.py", ("--mode", mode),
            ("torch", "transformers", "accelerate"), f"accelerate 1.15.0, {TRANSFORMERS}")
      for mode in ("cpu_offload", "device_map")),
    Entry("fsdp2_train", "fsdp2_train.py", (), ("torch", "torch.distributed.fsdp"), TORCH),
    Entry("ddp_train", "ddp_train.py", (), ("torch", "torch.distributed"), TORCH),
    Entry("dataloader_train", "dataloader_train.py", (), ("torch",), TORCH),
    *(Entry(f"compile_train-{mode}", "compile_train.py", ("--mode", mode), ("torch", "triton"),
            f"{TORCH}, triton 3.6") for mode in ("default", "reduce-overhead")),
    Entry("lightning_fit", "lightning_fit.py", (), ("torch", "pytorch_lightning"),
          "pytorch-lightning 2.6.6"),
    Entry("amp_gradscaler", "amp_gradscaler.py", (), ("torch",), TORCH),
    Entry("activation_checkpointing", "activation_checkpointing.py", (), ("torch",), TORCH),
    *(Entry(f"optimizers-{impl}", "optimizers.py", ("--impl", impl), ("torch",), TORCH)
      for impl in ("fused", "foreach", "forloop")),
    *(Entry(f"sdpa-{backend}", "sdpa.py", ("--backend", backend), ("torch",), TORCH)
      for backend in ("flash", "efficient", "math", "cudnn")),
    *(Entry(f"flex_attention-{mode}", "flex_attention.py", ("--mode", mode), needs, TORCH)
      for mode, needs in (("eager", ("torch",)), ("compiled", ("torch", "triton")))),
    Entry("item_loop", "item_loop.py", (), ("torch", "numpy"), TORCH),
    Entry("item_loop-all_reduce", "item_loop.py", ("--all-reduce",),
          ("torch", "numpy", "torch.distributed"), TORCH),
)

assert len({entry.name for entry in CORPUS}) == len(CORPUS), "entry names must be unique"
