"""Every model architecture transformers ships, built small and run on the CPU bare and under
the PyTorch source: the capture must never change what a model does, nor what it says.

    python tests/hf_sweep.py [--types llama,gpt2] [--limit N] [--json out.json]

The model types are the causal language models' first (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``),
then the base models' (``MODEL_MAPPING_NAMES``). Each type's default config is made small
(hidden size 64, 4 heads, 2 layers, a vocabulary of 128, nested configs likewise), its
parameters counted on the meta device (over ``--max-params`` it is skipped), and then, from one
seed, in float32:

- build: the model is built bare and again with the capture on; its parameters and buffers;
- forward: a forward pass in eval mode without grad, on random ``input_ids`` (left-padded by an
  ``attention_mask``), or ``pixel_values``, ``input_values`` or ``input_features`` where the
  model takes those instead;
- generate (causal models): greedy ``generate`` of 4 tokens, its sequences and logits;
- train (causal models): one step in train mode (dropout on), ``loss.backward()`` and SGD:
  the loss, the gradients and the parameters after the step;
- inference: generate (causal models) or forward (the others) under ``inference_mode``, as
  transformers' pipelines run a model.

Each run is bare (the capture's dispatch mode off the mode stack, as in a program not watched:
the mode installed but off is not bare, since its mere presence changes some results under
``inference_mode``) and watched (``cap.on``, every CPU tensor taken for pinned memory so that
the whole per-op path runs, as on a GPU), from identical copies of the model and its inputs.
The two must raise the same exception, or give the same values bit for bit (NaNs at the same
places); values within 1e-4 are said as "differs (tiny)", since the capture changing which ops
run is a bug of its own.
What the watched run writes on stdout or stderr (file descriptors 1 and 2) that the bare one
did not is "output added", and each failure of the capture to read an op (its ``guard``) is
"capture failed". A difference is checked by running bare once more: where the two bare runs
differ too, the model is not deterministic, which is said per model and is not a problem. Then
once more under the capture's mode switched off, a dispatch mode that does nothing: where that
run gives the watched run's values bit for bit, the difference is any mode's, PyTorch's own
(inside a mode's handler a view of a parameter loses ``requires_grad``, and ``matmul`` then
folds a non-contiguous input another way), which is listed and is not a problem. A
model whose bare run takes over ``--slow`` seconds is skipped, and a watched run that takes 50
times its bare run (at least a minute) is stopped and said as "timed out".

It prints one line per problem and a summary, and exits 1 when there is a problem. Needs
PyTorch and transformers; a sweep of everything takes about 6 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import inspect
import io
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SEED = 1234
BATCH, LENGTH, PADDED = 2, 8, 2  # input_ids of [BATCH, LENGTH], the first row left-padded
NEW_TOKENS = 4
IMAGE = 64  # the side of an image for a model whose config names no image_size
TINY = 1e-4  # a difference at most this large (absolute and relative) is "differs (tiny)"

# What a config's numbers become (where they are larger). Only arguments of the config's own
# __init__ are given, so that what it works out from them (head_dim from hidden_size and heads,
# DeepSeek's qk_head_dim) is worked out anew.
HIDDEN = 64
HEADS = 4
LAYERS = 2
VOCAB = 128
SMALL: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim",
                     "model_dim", "word_embed_proj_dim", "embedding_size", "hidden_dim",
                     "d_embed", "text_embed_dim", "vision_embed_dim", "emb_dim",
                     "entity_emb_size", "codebook_dim"), HIDDEN),
    "projection_dim": 32,
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads",
                     "encoder_attention_heads", "decoder_attention_heads"), HEADS),
    **dict.fromkeys(("head_dim", "kv_channels", "d_kv", "attention_head_dim", "v_head_dim"),
                    HIDDEN // HEADS),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "d_ff", "n_inner", "ffn_hidden_size", "inner_hidden_size", "mlp_dim"), 64),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size",
                     "expert_intermediate_size"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers",
                     "decoder_layers", "num_decoder_layers", "num_encoder_layers"), LAYERS),
    **dict.fromkeys(("vocab_size", "entity_vocab_size", "vocab_size_per_layer_input"), VOCAB),
    "expand": 1,  # Mamba 2: hidden_size * expand must be num_heads * head_dim
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts",
                     "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "num_experts_per_token"), 2),
    **dict.fromkeys(("n_shared_experts", "n_group", "topk_group", "first_k_dense_replace"), 1),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"), 8),
    **dict.fromkeys(("state_size", "ssm_state_size", "d_state", "mamba_d_state",
                     "time_step_rank"), 8),
}
# Per-stage sizes of convolutional and hierarchical models: stage i at most first * growth**i.
SMALL_LISTS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("hidden_sizes", "embed_dims", "dims", "neck_hidden_sizes"), (16, 2)),
    "depths": (1, 1)}
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")


class Problem(NamedTuple):
    """What the sweep found wrong with one model's run: which model and run, and what."""

    model: str
    run: str  # "build", "forward", "generate", "train" or "inference"
    kind: str  # "differs", "differs (tiny)", "capture failed", "output added", "timed out"
    what: str

    def line(self) -> str:
        return f"{self.kind}: {self.model} ({self.run}): {self.what}"


class Record(NamedTuple):
    """One model type's sweep: ``status`` is "ok", "failed bare" (a bare run raised; the
    watched one was compared all the same), "nondeterministic" or "skipped"."""

    model: str
    status: str
    reason: str  # why skipped, what the bare run raised, or which runs were not deterministic
    params: int
    ops: int  # op events the watched runs emitted
    bare_s: float
    watched_s: float
    failures: list[str]  # the capture's failures to read an op, as its guard keys them


class Timeout(BaseException):
    """A run past its time: a BaseException, so that neither the model's nor the capture's
    ``except Exception`` takes it for an error of theirs."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Timeout(f"over {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def outputs_to(files: dict[int, Any]) -> Iterator[None]:
    """File descriptors 1 and 2 into ``files`` (what C code and logging handlers holding the
    original streams write goes there too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in files}
    for fd, f in files.items():
        os.dup2(f.fileno(), fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, old in saved.items():
            os.dup2(old, fd)
            os.close(old)


def message(exc: BaseException) -> str:
    """An exception as compared: its type and first line, addresses left out."""
    text = str(exc).strip().splitlines()
    return re.sub(r"0x[0-9a-f]+", "0x?", f"{type(exc).__name__}: {text[0][:200] if text else ''}")


def leaves(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """A result's tensors and plain values, each with its path: ModelOutputs and dicts by key,
    lists by index, and transformers' own objects (a cache, its layers) by attribute."""
    import torch
    from transformers import GenerationConfig, PreTrainedConfig
    if isinstance(value, torch.Tensor):
        yield path, value.detach()
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from leaves(v, f"{path}.{k}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]", depth + 1)
    elif value is None or isinstance(value, (bool, int, float, str)):
        yield path, value
    elif depth < 6 and type(value).__module__.startswith("transformers") and \
            hasattr(value, "__dict__") and \
            not isinstance(value, (torch.nn.Module, PreTrainedConfig, GenerationConfig)):
        for k, v in vars(value).items():
            yield from leaves(v, f"{path}.{k}", depth + 1)


class Outcome(NamedTuple):
    values: list[tuple[str, Any]] | None  # leaves of the result, None when it raised
    error: str | None
    seconds: float
    said: Counter[str]  # lines written on stdout and stderr, addresses left out


def differ(a: Outcome, b: Outcome) -> tuple[str, str] | None:
    """(kind, what) where ``b`` differs from ``a``; None when they are the same."""
    import torch
    if a.error != b.error:
        return "differs", f"bare {a.error or 'returned'}, watched {b.error or 'returned'}"
    if a.values is None or b.values is None:
        return None
    if [p for p, _ in a.values] != [p for p, _ in b.values]:
        return "differs", f"{len(a.values)} result values against {len(b.values)}"
    tiny: list[tuple[float, str]] = []
    for (path, x), (_, y) in zip(a.values, b.values):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            if x != y and not (x != x and y != y):  # a float NaN is the same as a NaN
                return "differs", f"{path}: {x!r} against {y!r}"
            continue
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            return "differs", f"{path}: {x.dtype}{list(x.shape)} against {y.dtype}{list(y.shape)}"
        if torch.equal(x, y) or torch.allclose(x, y, rtol=0, atol=0, equal_nan=True):
            continue
        if not x.is_floating_point() or not torch.allclose(x, y, rtol=TINY, atol=TINY,
                                                           equal_nan=True):
            where = (x != y) & ~(x.isnan() & y.isnan()) if x.is_floating_point() else x != y
            return "differs", f"{path}: {int(where.sum())} of {x.numel()} values differ"
        tiny.append((float((x - y).abs().nan_to_num().max()), path))
    if tiny:
        worst, path = max(tiny)
        return "differs (tiny)", f"{len(tiny)} tensors, max abs diff {worst:.3g} (at {path})"
    return None


def read(config: Any, name: str) -> Any:
    """A config's attribute, None where it has none or will not say (Gemma 4's per-layer
    attributes raise when read as one value)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001 - any failure to read is "not known"
        return None


def kept_layers(config: Any, params: Any, layers: int) -> list[int]:
    """Which of ``layers`` layers a small config keeps: the first of each kind its layer types
    name (a hybrid model's linear and full attention both), then the first others."""
    kinds = next((v for v in (read(config, n) for n in params) if isinstance(v, (list, tuple))
                  and len(v) == layers and all(isinstance(k, str) for k in v)), None)
    firsts = sorted({k: i for i, k in reversed(list(enumerate(kinds or [])))}.values())[:LAYERS]
    return sorted(firsts + [i for i in range(layers) if i not in firsts][:LAYERS - len(firsts)])


def small_config(config: Any, ids: dict[int, int]) -> Any:
    """``config`` made small: a new config of its class from the smaller numbers, its nested
    configs made small likewise; special token ids past the vocabulary are moved to its end
    (``ids``: old id -> new, shared by the nested configs so that they agree)."""
    from transformers import PreTrainedConfig
    params = inspect.signature(type(config).__init__).parameters
    layers = next((v for v in (read(config, k) for k in LAYER_COUNTS) if isinstance(v, int)),
                  None)
    heads = next((v for v in (read(config, k) for k in ("num_attention_heads", "n_head"))
                  if isinstance(v, int)), None)
    kept = kept_layers(config, params, layers) if layers and layers > LAYERS else None
    kwargs: dict[str, Any] = {}
    for name in params:
        value = read(config, name)
        small = SMALL.get(name, HIDDEN if name.endswith("hidden_size") else None)
        if isinstance(value, PreTrainedConfig):
            kwargs[name] = small_config(value, ids)
        elif isinstance(value, bool) or value is None:
            continue
        elif name in KV_HEADS and isinstance(value, int):
            # Multi-head stays multi-head, multi-query stays multi-query; grouped has 2.
            kwargs[name] = HEADS if value == heads else min(value, 2)
        elif small is not None and isinstance(value, int) and value > small:
            kwargs[name] = small
        elif name in SMALL_LISTS and isinstance(value, list) and \
                all(isinstance(v, int) for v in value):
            first, growth = SMALL_LISTS[name]
            kwargs[name] = [min(v, first * growth ** i) for i, v in enumerate(value)]
        elif kept and isinstance(value, (list, tuple)) and len(value) == layers:
            kwargs[name] = type(value)(value[i] for i in kept)  # one item a layer
        elif name == "image_size" and isinstance(read(config, "patch_size"), int):
            kwargs[name] = min(value, 4 * config.patch_size) if isinstance(value, int) else [
                min(v, 4 * config.patch_size) for v in value]
        elif name == "rope_parameters" and isinstance(value, dict) and "mrope_section" in (
                *value, *getattr(type(config), "ignore_keys_at_rope_validation", ())):
            # Qwen-VL's rotary sections split a head's half (the model's own default where the
            # config has none): scaled to the smaller head.
            sections = value.get("mrope_section") or [16, 24, 24]
            half = HIDDEN // HEADS // 2
            scaled = [v * half // sum(sections) for v in sections]
            scaled[-1] += half - sum(scaled)
            kwargs[name] = {**value, "mrope_section": scaled}
    vocab = kwargs.get("vocab_size", read(config, "vocab_size")) or VOCAB
    for name in params:
        value = read(config, name)
        if name.endswith(("token_id", "token_index", "token_ids")) and value is not None:
            def moved(i: Any) -> Any:
                if isinstance(i, int) and not isinstance(i, bool) and i >= vocab:
                    return ids.setdefault(i, vocab - 1 - len(ids))
                return i
            kwargs[name] = [moved(i) for i in value] if isinstance(value, list) else moved(value)
    return type(config)(**kwargs)


class Sweep:
    """The capture installed once for the whole sweep (off but between watched runs, and its
    mode off the stack for the bare ones), and what the sweep found."""

    def __init__(self, max_params: int, slow_s: float) -> None:
        import torch
        from torch.utils._python_dispatch import _pop_mode_temporarily

        from harness.capture import events as E
        from harness.capture import torch_source

        self.torch = torch
        self.popped = _pop_mode_temporarily
        self.max_params = max_params
        self.slow_s = slow_s
        self.out = io.StringIO()
        self.sink = E.Sink(self.out)
        self.stop = torch_source.install(self.sink)
        self.cap = self.stop.capture  # type: ignore[attr-defined]
        self.cap.on = False
        # A CPU has no device memory, and the capture watches only pinned host memory: taking
        # every host storage for pinned runs each op's whole path, as on a GPU.
        self.cap.pinned = type("AllHost", (dict,), {"__contains__": lambda self, k: True,
                                                 "__len__": lambda self: 1})()
        self.problems: list[Problem] = []
        self.records: list[Record] = []
        # Runs that differ as much under a dispatch mode that does nothing (the capture's own
        # mode, switched off): PyTorch's doing, not the capture's.
        self.any_mode: list[str] = []

    def seed(self) -> None:
        random.seed(SEED)
        self.torch.manual_seed(SEED)

    def once(self, watched: bool, make: Callable[[], Any], act: Callable[[Any], Any],
             limit: float, mode_only: bool = False) -> Outcome:
        """``act(make())``, made and run from the seed, bare or watched (or, ``mode_only``,
        under the capture's mode switched off), with what it wrote on fd 1 and 2; ``make`` runs
        bare, outside the time."""
        with self.popped():
            self.seed()
            subject = make()
        self.seed()
        files = {fd: tempfile.TemporaryFile() for fd in (1, 2)}
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            stack.enter_context(outputs_to(files))
            if not watched and not mode_only:
                stack.enter_context(self.popped())
            try:
                with time_limit(limit):
                    if watched:
                        self.cap.on = True
                    try:
                        result, error = act(subject), None
                    finally:
                        self.cap.on = False
            except Exception as exc:  # noqa: BLE001 - the model's own error is its outcome
                result, error = None, message(exc)
            except Timeout as exc:
                result, error = None, f"Timeout: {exc}"
        seconds = time.perf_counter() - start
        said: Counter[str] = Counter()
        for fd, f in files.items():
            f.seek(0)
            for line in f.read().decode(errors="replace").splitlines():
                said[f"fd {fd}: " + re.sub(r"0x[0-9a-f]+", "0x?", line)] += 1
            f.close()
        values = None if error else list(leaves(result))
        return Outcome(values, error, seconds, said)

    def compare(self, model: str, run: str, make: Callable[[], Any], act: Callable[[Any], Any],
                totals: list[float], notes: list[str]) -> str | None:
        """Run ``act`` bare and watched and say how they differ; the bare run's error, if it
        raised. ``totals``: [bare s, watched s, op events], added to."""
        bare = self.once(False, make, act, 3 * self.slow_s)
        if bare.seconds > self.slow_s:
            raise Timeout(f"{run} bare took {bare.seconds:.1f} s")
        self.cap.guard.counts.clear()  # what is in it after the run is the run's
        self.sink.flush()
        self.out.seek(0)
        self.out.truncate()
        watched = self.once(True, make, act, max(60.0, 50 * bare.seconds))
        self.sink.flush()
        ops = sum(1 for line in self.out.getvalue().splitlines() if line.startswith('["op",'))
        totals[0] += bare.seconds
        totals[1] += watched.seconds
        totals[2] += ops
        for key in self.cap.guard.counts:
            self.problems.append(Problem(model, run, "capture failed", key))
        if watched.error and watched.error.startswith("Timeout") and not bare.error:
            self.problems.append(Problem(model, run, "timed out", f"watched run {watched.error}"
                                         f"; bare {bare.seconds:.2f} s"))
            return None
        found = differ(bare, watched)
        added = watched.said - bare.said
        if found or added:
            again = self.once(False, make, act, 3 * self.slow_s)  # is the bare run its own?
            if found and differ(bare, again):
                notes.append(run)
                found = None
            added -= again.said
        if found:
            plain = self.once(False, make, act, 3 * self.slow_s, mode_only=True)
            if differ(bare, plain) and not differ(plain, watched):
                self.any_mode.append(f"{model} ({run})")
                found = None
        if found:
            self.problems.append(Problem(model, run, *found))
        for line, n in added.items():
            self.problems.append(Problem(model, run, "output added",
                                         f"{line[:300]}" + (f" ({n} times)" if n > 1 else "")))
        return bare.error

    def sweep(self, model_type: str, causal: bool) -> None:
        """One model type: made small, built, and each of its runs compared."""
        torch = self.torch
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
        auto = AutoModelForCausalLM if causal else AutoModel

        def skip(reason: str, params: int = 0) -> None:
            self.records.append(Record(model_type, "skipped", reason, params, 0, 0.0, 0.0, []))

        try:
            config = small_config(AutoConfig.for_model(model_type), {})
        except Exception as exc:  # noqa: BLE001 - a config this generic shrinking cannot make
            return skip(f"config: {message(exc)}")
        with self.popped(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # meta tensors' own advice, not a run's output
            try:
                with torch.device("meta"):
                    params = sum(p.numel() for p in
                                 auto.from_config(copy.deepcopy(config)).parameters())
            except Exception as exc:  # noqa: BLE001 - a model this config cannot build
                return skip(f"build: {message(exc)}")
        if params > self.max_params:
            return skip(f"over {self.max_params // 10**6}M parameters", params)

        def build() -> Any:
            return auto.from_config(copy.deepcopy(config), dtype=torch.float32).eval()

        def built(_: Any) -> dict[str, Any]:
            return state_of(build())

        with self.popped(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said again, and compared, by the build run
            self.seed()
            try:
                model = build()
            except Exception as exc:  # noqa: BLE001 - built on meta, but not on the CPU
                return skip(f"build: {message(exc)}", params)
            inputs = self.inputs_for(model, config)
        if isinstance(inputs, str):
            return skip(inputs, params)

        runs: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]] = [
            ("build", lambda: None, built),
            ("forward", lambda: (copy.deepcopy(model), clone(inputs)), self.forward)]
        if causal:
            runs += [("generate", lambda: (copy.deepcopy(model), clone(inputs)), self.generate),
                     ("train", lambda: (copy.deepcopy(model), clone(inputs)), self.train)]
        runs.append(("inference", lambda: (copy.deepcopy(model), clone(inputs)),
                     functools.partial(self.inference, self.generate if causal else self.forward)))
        self.compare_runs(model_type, runs, params)

    def compare_runs(self, name: str,
                     runs: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]],
                     params: int) -> None:
        """Each of a model's runs (name, what it is made from, what it does) compared bare
        against watched, and the model's record: ok, nondeterministic (its bare runs differ),
        failed bare, or skipped where a run is slower than the sweep waits for."""
        totals = [0.0, 0.0, 0.0]
        found = len(self.problems)
        notes: list[str] = []
        errors: list[str] = []
        try:
            for run, make, act in runs:
                error = self.compare(name, run, make, act, totals, notes)
                if error:
                    errors.append(f"{run}: {error}")
        except Timeout as exc:
            self.records.append(Record(name, "skipped", f"slow: {exc}", params, 0, 0.0, 0.0,
                                       []))
            return
        status = "failed bare" if errors else "nondeterministic" if notes else "ok"
        reason = "; ".join(errors) if errors else (
            "bare runs differ: " + ", ".join(notes) if notes else "")
        failures = sorted({p.what for p in self.problems[found:] if p.kind == "capture failed"})
        self.records.append(Record(name, status, reason, params, int(totals[2]),
                                   totals[0], totals[1], failures))

    def inputs_for(self, model: Any, config: Any) -> dict[str, Any] | str:
        """What the model's forward is given, or why it is skipped (it needs what is not made
        here)."""
        torch = self.torch
        generator = torch.Generator().manual_seed(SEED)
        params = inspect.signature(model.forward).parameters
        inputs: dict[str, Any] = {}
        try:
            vocab = model.get_input_embeddings().num_embeddings
        except Exception:  # noqa: BLE001 - a model that does not say (CLIP's): its text config
            vocab = read(config.get_text_config(), "vocab_size")

        def ids(length: int) -> Any:
            # Clear of the low ids (pad, bos, eos, unk) and of the special ids moved to the
            # vocabulary's end (an image token among them would want an image).
            return torch.randint(4, max(vocab - 16, 5), (BATCH, length), generator=generator)

        if "input_ids" in params and isinstance(vocab, int):
            inputs["input_ids"] = ids(LENGTH)
            if "attention_mask" in params:
                mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
                mask[0, :PADDED] = 0
                inputs["attention_mask"] = mask
        vision = read(config, "vision_config") or config
        size = read(vision, "image_size") or IMAGE
        # An image beside the text only where no image token says where its features go (a
        # dual encoder such as CLIP): a model with one wants as many tokens as features.
        if "pixel_values" in params and isinstance(size, (int, list, tuple)) and not (
                inputs and any(read(config, n) is not None
                               for n in ("image_token_id", "image_token_index"))):
            height, width = (size, size) if isinstance(size, int) else size[-2:]
            inputs["pixel_values"] = torch.randn(BATCH, read(vision, "num_channels") or 3,
                                                 height, width, generator=generator)
        if "input_values" in params and not inputs:
            inputs["input_values"] = torch.randn(BATCH, 1600, generator=generator)
        if "input_features" in params and not inputs:
            bins = next((v for v in (read(config, k) for k in (
                "num_mel_bins", "input_feat_per_channel", "feature_size", "input_feat_size"))
                if isinstance(v, int)), 80)
            frames = 2 * (read(config, "max_source_positions") or 32)
            inputs["input_features"] = torch.randn(BATCH, bins, frames, generator=generator)
        if inputs and config.is_encoder_decoder and "decoder_input_ids" in params and \
                isinstance(vocab, int):
            inputs["decoder_input_ids"] = ids(LENGTH // 2)
        if not inputs:
            return "inputs: takes none of input_ids, pixel_values, input_values, input_features"
        needed = [name for name, p in params.items() if p.default is p.empty and
                  p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in inputs]
        if needed:
            return f"inputs: needs {', '.join(needed)}"
        return inputs

    def forward(self, subject: tuple[Any, dict[str, Any]]) -> Any:
        model, inputs = subject
        with self.torch.no_grad():
            return model(**inputs)

    def generate(self, subject: tuple[Any, dict[str, Any]]) -> Any:
        model, inputs = subject
        return model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                              return_dict_in_generate=True, output_logits=True)

    def inference(self, act: Callable[[Any], Any], subject: tuple[Any, dict[str, Any]]) -> Any:
        """``act`` under ``inference_mode``, as transformers' pipelines run a model: there the
        dispatcher hands the capture's mode composite ops whole (``linear``, ``matmul``)."""
        with self.torch.inference_mode():
            return act(subject)

    def train(self, subject: tuple[Any, dict[str, Any]]) -> Any:
        model, inputs = subject
        model.train()
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        self.torch.optim.SGD(model.parameters(), lr=0.1).step()
        return {"loss": loss, "grads": {n: p.grad for n, p in model.named_parameters()},
                "after": dict(model.named_parameters())}


def state_of(model: Any) -> dict[str, Any]:
    """A model's parameters and buffers by name: what its build run compares."""
    return dict([*model.named_parameters(), *model.named_buffers()])


def clone(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() for k, v in inputs.items()}


def sweep_each(sweep: Sweep, items: list[Any], one: Callable[[Any], None],
               name: Callable[[Any], str], what: str, every: int) -> None:
    """``one`` of each item, then the sweep stopped. The sweep's own trouble with an item is
    its record (skipped), never the end of the sweep; progress every ``every`` items."""
    began = time.perf_counter()
    for n, item in enumerate(items, 1):
        if n % every == 0:
            print(f"{n} of {len(items)} {what}, {len(sweep.problems)} problems so far, "
                  f"{time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
        try:
            one(item)
        except Exception as exc:  # noqa: BLE001 - the sweep's own trouble with one model
            sweep.records.append(Record(name(item), "skipped", f"sweep: {message(exc)}",
                                        0, 0, 0.0, 0.0, []))
        gc.collect()
    sweep.stop()


def report(sweep: Sweep, count: int, what: str) -> None:
    """The problems, one line each, what differs under any mode, and the summary line."""
    for problem in sweep.problems:
        print(problem.line())
    if sweep.any_mode:
        print(f"differ as much under any dispatch mode (PyTorch's, not a problem): "
              f"{', '.join(sweep.any_mode)}")
    statuses = Counter(r.status for r in sweep.records)
    kinds = Counter(p.kind for p in sweep.problems)
    ratios = sorted((r.watched_s / r.bare_s, r.model) for r in sweep.records if r.bare_s > 0)
    print(f"{count} {what}: "
          + (", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none swept")
          + f"; {sum(r.ops for r in sweep.records)} ops captured; "
          + (f"watched/bare time median {statistics.median(r for r, _ in ratios):.2f}x, "
             f"worst {ratios[-1][0]:.2f}x ({ratios[-1][1]}); " if ratios else "")
          + (f"{len(sweep.any_mode)} runs differ under any mode; " if sweep.any_mode else "")
          + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no problem"))


def model_types(chosen: set[str] | None) -> list[tuple[str, bool]]:
    """(model type, causal) for each type to sweep: the causal LMs first."""
    from transformers.models.auto import modeling_auto
    causal = dict(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    base = [t for t in modeling_auto.MODEL_MAPPING_NAMES if t not in causal]
    return [(t, t in causal) for t in [*causal, *base] if chosen is None or t in chosen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", help="comma-separated model types (all of them by default)")
    parser.add_argument("--limit", type=int, help="sweep the first N types only")
    parser.add_argument("--max-params", type=int, default=20_000_000,
                        help="skip models with more parameters than this (20M)")
    parser.add_argument("--slow", type=float, default=20.0,
                        help="skip a model whose bare run takes longer, in seconds (20)")
    parser.add_argument("--json", help="write the problems and each model's record here")
    args = parser.parse_args(argv)
    # Every warning each time, so that one said by the bare run is said by the watched run too.
    warnings.simplefilter("always")
    import transformers
    transformers.logging.set_verbosity_error()  # the loaders' progress bars and advice

    types = model_types(set(args.types.split(",")) if args.types else None)[:args.limit]
    sweep = Sweep(args.max_params, args.slow)
    sweep_each(sweep, types, lambda t: sweep.sweep(*t), lambda t: t[0], "model types", 20)
    report(sweep, len(types), "model types")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"problems": [p._asdict() for p in sweep.problems],
             "models": [r._asdict() for r in sweep.records]}, indent=1))
    return 1 if sweep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
