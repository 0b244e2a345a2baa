#!/usr/bin/env python
"""Hand-placed sleep probe for transformers' offloaded DynamicCache
(written against transformers 5.17.0, torch 2.11).

Question: does `cache_implementation="offloaded"` race?  The cache
(transformers/cache_utils.py, 5.17.0) does

    Cache.update (1370):
      1394  default_stream.wait_stream(prefetch_stream)  # default waits for prefetch
      1395  self.prefetch(layer_idx + 1)                 # H2D of the NEXT layer, prefetch stream
      1397  layers[layer_idx].update(...)                # DynamicLayer.update: cat 146-147, default
      1400  self.offload(layer_idx)                      # D2H 79-80, default stream
    Cache.prefetch (1338):
      1358  with self.prefetch_stream: layers[i].prefetch()
            # H2D 85-86; wraps to layer 0 at the last layer

Nothing ever makes the prefetch stream wait for the default stream, and nothing calls
record_stream.  This probe queues a GPU spin (torch.cuda._sleep) BY HAND on the stream an
operation runs on, right before it, so that any unordered partner gets a window of --sleep-ms
milliseconds:

  --where offload   spin on the default stream before each offload D2H (cache_utils 79-80)
  --where prefetch  spin on the prefetch stream before each prefetch H2D (cache_utils 85-86)
  --where consumer  spin on the default stream before DynamicLayer.update's cat
                    (cache_utils 146-147), the consumer of the prefetched tensors
  --where none      no spin (control)

and, to attribute a wrong answer to one ordering gap, can add the missing edge (--fix):

  d2h     the prefetch of a layer waits for an event recorded after that layer's own offload D2H
          (closes: D2H into the pinned block vs the H2D that reads it)
  record  the prefetched tensors get record_stream(default) before the cat consumes them
          (closes: cat reading a prefetch-stream block vs the caching allocator handing that
          block to the next prefetch)
  both    d2h + record
  wait    prefetch_stream.wait_stream(default_stream) before every prefetch (closes both)

It runs the same greedy decode with the plain DynamicCache (reference) and with the offloaded
one, through `generate(cache_implementation="offloaded")` and/or a manual forward loop (no host
sync between steps), and compares token ids and logits (and, for the loop, the final cache
bytes).  Differences -> `WRONG: <summary>` on stderr, exit 1; else `answer=<summary>` on stdout,
exit 0.

The summary also counts the structural preconditions seen (meaningful with --fix none):
h2d_then_cat_no_wait (only with a single offloaded layer), h2d_after_same_fwd_d2h (the
wrap-around prefetch of layer 0 reads the pinned block whose D2H was queued earlier in the same
forward), h2d_into_cat_read_block_same_fwd (the caching allocator handed a block a cat had read
to the next prefetch H2D, within one forward: no host sync in between).  See
hf_offload_notes.md.

--cpu-dry-run runs everything on the CPU with torch.Stream / torch.cuda stream & event /
torch.cuda._sleep replaced by fakes, to check that the monkeypatch targets exist, are called,
and see the streams they expect.
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings

import torch

C = collections.Counter()  # what the wrappers saw / did
ST = {
    "active": False,  # sleeps/fixes apply only while the offloaded run is going
    "in_offloaded_update": False,
    "where": "none",
    "fix": "none",
    "cycles": 0,
    "sleep_layers": None,  # None = all
    "dry": False,
    "fwd": 0,  # forward counter of the offloaded run (bumped at Cache.update of layer 0)
    "cat_read": {},  # data_ptr of a prefetched block a cat consumed -> forward it was consumed in
}


def _layer_selected(idx):
    return ST["sleep_layers"] is None or idx in ST["sleep_layers"]


def _spin(tag):
    torch.cuda._sleep(ST["cycles"])
    C["sleep:" + tag] += 1


def _on_default_stream():
    return torch.cuda.current_stream() == torch.cuda.default_stream()


# --------------------------------------------------------------------------------------------------
# CPU dry-run fakes (only installed with --cpu-dry-run)
# --------------------------------------------------------------------------------------------------
class _FakeEvent:
    def __init__(self, *a, **k):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = stream or _FAKE["current"]
        C["dry:event_record"] += 1

    def synchronize(self):
        pass


class _FakeStream:
    n = 0

    def __init__(self, *a, **k):
        _FakeStream.n += 1
        self.name = "default" if k.get("_default") else f"side{_FakeStream.n}"
        self._prev = []

    def __enter__(self):
        self._prev.append(_FAKE["current"])
        _FAKE["current"] = self
        return self

    def __exit__(self, *exc):
        _FAKE["current"] = self._prev.pop()
        return False

    def wait_stream(self, other):
        C[f"dry:wait_stream {self.name}<-{other.name}"] += 1

    def wait_event(self, ev):
        C[f"dry:wait_event on {self.name}"] += 1

    def record_event(self, ev=None):
        ev = ev or _FakeEvent()
        ev.record(self)
        return ev

    def synchronize(self):
        pass

    def __eq__(self, other):
        return self is other

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<FakeStream {self.name}>"


_FAKE = {}


def install_cpu_fakes():
    default = _FakeStream(_default=True)
    _FAKE["default"] = default
    _FAKE["current"] = default
    torch.Stream = _FakeStream  # Cache.__init__: torch.Stream() (torch >= 2.7)
    torch.cuda.Stream = _FakeStream
    torch.cuda.Event = _FakeEvent
    torch.cuda.default_stream = lambda device=None: _FAKE["default"]
    torch.cuda.current_stream = lambda device=None: _FAKE["current"]
    torch.cuda.synchronize = lambda device=None: None

    def fake_sleep(cycles):
        C["dry:_sleep_on " + _FAKE["current"].name] += 1

    torch.cuda._sleep = fake_sleep


# --------------------------------------------------------------------------------------------------
# The monkeypatches
# --------------------------------------------------------------------------------------------------
def install_patches():
    from transformers import cache_utils as cu

    targets = {
        "Cache.update": cu.Cache.update,
        "Cache.offload": cu.Cache.offload,
        "Cache.prefetch": cu.Cache.prefetch,
        "CacheLayerMixin.offload": cu.CacheLayerMixin.offload,
        "CacheLayerMixin.prefetch": cu.CacheLayerMixin.prefetch,
        "DynamicLayer.update": cu.DynamicLayer.update,
    }
    # DynamicLayer must inherit offload/prefetch from CacheLayerMixin (5.17.0: it does), else the
    # patch would miss it.
    assert cu.DynamicLayer.prefetch is cu.CacheLayerMixin.prefetch, (
        "DynamicLayer overrides prefetch: re-read cache_utils"
    )
    assert cu.DynamicLayer.offload is cu.CacheLayerMixin.offload, (
        "DynamicLayer overrides offload: re-read cache_utils"
    )
    assert (
        "update" in cu.DynamicCache.__mro__[1].__dict__ and "update" not in cu.DynamicCache.__dict__
    ), "DynamicCache overrides Cache.update: re-read cache_utils"

    orig_cache_update = targets["Cache.update"]
    orig_cache_offload = targets["Cache.offload"]
    orig_layer_prefetch = targets["CacheLayerMixin.prefetch"]
    orig_dyn_update = targets["DynamicLayer.update"]

    def cache_update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if not (ST["active"] and getattr(self, "offloading", False)):
            return orig_cache_update(self, key_states, value_states, layer_idx, *args, **kwargs)
        C["Cache.update(offloading)"] += 1
        for i, layer in enumerate(self.layers):  # layers know no index; tag them
            layer._probe_idx = i
        if layer_idx == 0:
            ST["fwd"] += 1
        ST["cur_layer"] = layer_idx
        ST["in_offloaded_update"] = True
        try:
            return orig_cache_update(self, key_states, value_states, layer_idx, *args, **kwargs)
        finally:
            ST["in_offloaded_update"] = False

    def cache_offload(self, layer_idx, only_non_sliding=True):
        if not (ST["active"] and getattr(self, "offloading", False)):
            return orig_cache_offload(self, layer_idx, only_non_sliding)
        C["Cache.offload"] += 1
        layer = self.layers[layer_idx]
        will_copy = not (only_non_sliding and self.is_sliding[layer_idx]) and layer.is_initialized
        if will_copy:
            C["offload D2H"] += 1
            C["offload on default stream"] += int(_on_default_stream())
            layer._probe_d2h_fwd = ST["fwd"]
            if ST["where"] == "offload" and _layer_selected(layer_idx):
                _spin(
                    "offload"
                )  # default stream, right before keys/values .to("cpu", non_blocking=True)
        out = orig_cache_offload(self, layer_idx, only_non_sliding)
        if will_copy and ST["fix"] in ("d2h", "both"):
            ev = torch.cuda.Event()
            ev.record()  # current (= default) stream, after the D2H
            layer._probe_d2h_event = ev
        return out

    def layer_prefetch(self):
        if not (ST["active"] and ST["in_offloaded_update"]):
            return orig_layer_prefetch(self)
        C["CacheLayerMixin.prefetch"] += 1
        will_copy = self.is_initialized and (ST["dry"] or self.keys.device != self.device)
        if will_copy:
            idx = getattr(self, "_probe_idx", -1)
            C["prefetch H2D"] += 1
            C["prefetch on non-default stream"] += int(not _on_default_stream())
            if idx == 0:
                C["prefetch of layer 0 (wrap-around)"] += 1
            if idx == ST.get(
                "cur_layer"
            ):  # only with one offloaded layer: its cat follows this H2D with no wait
                C["hazard: H2D consumed by the cat of the same update (no wait in between)"] += 1
            if getattr(self, "_probe_d2h_fwd", None) == ST["fwd"]:
                C["hazard: H2D reads a pinned block whose D2H was queued in the same forward"] += 1
            cur = torch.cuda.current_stream()
            if ST["fix"] == "wait":
                cur.wait_stream(torch.cuda.default_stream())
            if ST["fix"] in ("d2h", "both"):
                ev = getattr(self, "_probe_d2h_event", None)
                if ev is not None:
                    cur.wait_event(ev)
                self._probe_d2h_event = None
            if ST["where"] == "prefetch" and _layer_selected(idx):
                _spin(
                    "prefetch"
                )  # prefetch stream, right before keys/values .to(device, non_blocking=True)
        out = orig_layer_prefetch(self)
        if will_copy and not ST["dry"]:
            for t in (self.keys, self.values):
                fwd = ST["cat_read"].pop(t.data_ptr(), None)
                if fwd is not None:
                    C["hazard: H2D writes a block a cat read (any forward)"] += 1
                    if fwd == ST["fwd"]:
                        C["hazard: H2D writes a block a cat read in the same forward"] += 1
        if will_copy and ST["fix"] in ("record", "both"):
            self._probe_prefetched = (self.keys, self.values)
        return out

    def dyn_update(self, key_states, value_states, *args, **kwargs):
        if not (ST["active"] and ST["in_offloaded_update"]):
            return orig_dyn_update(self, key_states, value_states, *args, **kwargs)
        C["DynamicLayer.update"] += 1
        pre = getattr(self, "_probe_prefetched", None)
        self._probe_prefetched = None  # hold no extra reference past this point
        consumer = self.is_initialized and self.keys is not None and self.keys.numel() > 0
        if consumer:
            C["cat consumes prefetched kv"] += 1
            C["cat on default stream"] += int(_on_default_stream())
            if not ST["dry"]:
                ST["cat_read"][self.keys.data_ptr()] = ST["fwd"]
                ST["cat_read"][self.values.data_ptr()] = ST["fwd"]
            if pre is not None and pre[0] is self.keys:
                if ST["dry"]:
                    C["dry:record_stream"] += 1
                else:
                    self.keys.record_stream(torch.cuda.current_stream())
                    self.values.record_stream(torch.cuda.current_stream())
                    C["record_stream"] += 1
            if ST["where"] == "consumer" and _layer_selected(getattr(self, "_probe_idx", -1)):
                _spin(
                    "consumer"
                )  # default stream, right before torch.cat([self.keys, key_states]) (146-147)
        del pre
        return orig_dyn_update(self, key_states, value_states, *args, **kwargs)

    cu.Cache.update = cache_update
    cu.Cache.offload = cache_offload
    cu.CacheLayerMixin.prefetch = layer_prefetch
    cu.DynamicLayer.update = dyn_update
    assert cu.DynamicCache.update is cache_update and cu.DynamicLayer.prefetch is layer_prefetch
    return targets


# --------------------------------------------------------------------------------------------------
def calibrate_cycles_per_ms():
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    best = None
    for n in (2_000_000, 20_000_000):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(n)
        e.record()
        e.synchronize()
        best = n / s.elapsed_time(e)
    return best


def prewarm_pinned(args):
    """Fill PyTorch's CachingHostAllocator with free pinned blocks of every size the offload D2H
    will ask for.

    Without it, an offload whose size class has no free block (or whose free blocks still have
    pending copy events) calls cudaHostAlloc, and the CUDA programming guide lists a page-locked
    host allocation among the operations that serialize work issued before it with work issued
    after it on other streams -- an accidental barrier that is no part of the cache's own ordering
    and could hide a race.  The host allocator rounds sizes up to powers of two.
    """
    if args.prewarm_pinned <= 0:
        return 0
    head_dim = args.hidden // args.heads
    sizes = set()
    for s in range(args.prompt_len, args.prompt_len + args.new_tokens + 2):
        nbytes = args.batch * args.heads * s * head_dim * 4
        sizes.add(1 << (nbytes - 1).bit_length())
    held = [
        torch.empty(sz, dtype=torch.uint8, pin_memory=True)
        for sz in sorted(sizes)
        for _ in range(args.prewarm_pinned)
    ]
    n = len(held)
    del held  # freed with no pending events: immediately reusable
    return n


def build_model(args, device):
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=4096,
        initializer_range=args.init_std,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg)  # random weights, no download
    model = model.to(device=device, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    return model


def run_generate(model, ids, args, offloaded):
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            cache_implementation="offloaded" if offloaded else "dynamic",
            return_dict_in_generate=True,
            output_logits=True,
        )
    torch.cuda.synchronize()
    return out.sequences[:, ids.shape[1] :].cpu(), torch.stack(out.logits, 1).float().cpu(), None


def run_loop(model, ids, args, offloaded):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config, offloading=offloaded)
    toks, logits = [], []
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        for step in range(args.new_tokens):
            lg = out.logits[:, -1].float()
            tok = lg.argmax(-1, keepdim=True)  # stays on the GPU: no host sync between steps
            logits.append(lg)
            toks.append(tok)
            if step + 1 < args.new_tokens:
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    kv = [(layer.keys.detach().cpu(), layer.values.detach().cpu()) for layer in cache.layers]
    return torch.cat(toks, 1).cpu(), torch.stack(logits, 1).cpu(), kv


def compare(ref, got):
    rt, rl, rkv = ref
    gt, gl, gkv = got
    res = {"tokens_equal": bool(torch.equal(rt, gt))}
    d = (rl - gl).abs()
    res["max_logit_diff"] = float(d.max()) if d.numel() else 0.0
    per_step = d.flatten(2).amax(dim=(0, 2)) if d.numel() else torch.zeros(0)
    bad = (per_step > ST["tol"]).nonzero()
    res["first_bad_step"] = int(bad[0]) if len(bad) else -1
    if not res["tokens_equal"]:
        neq = (rt != gt).any(0).nonzero()
        res["first_token_diff"] = int(neq[0]) if len(neq) else -1
    if rkv is not None:
        kvd = 0.0
        for (rk, rv), (gk, gv) in zip(rkv, gkv):
            if rk.shape != gk.shape:
                kvd = float("inf")
                break
            kvd = max(kvd, float((rk - gk).abs().max()), float((rv - gv).abs().max()))
        res["kv_diff"] = kvd
    res["ok"] = (
        res["tokens_equal"]
        and res["max_logit_diff"] <= ST["tol"]
        and res.get("kv_diff", 0.0) <= ST["tol"]
    )
    return res


def fmt(name, r):
    s = (
        f"{name}[tokens_equal={r['tokens_equal']} max_logit_diff={r['max_logit_diff']:.3g} "
        f"first_bad_step={r['first_bad_step']}"
    )
    if "first_token_diff" in r:
        s += f" first_token_diff={r['first_token_diff']}"
    if "kv_diff" in r:
        s += f" kv_diff={r['kv_diff']:.3g}"
    return s + "]"


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--where", choices=["none", "offload", "prefetch", "consumer"], default="none")
    p.add_argument("--sleep-ms", type=float, default=10.0)
    p.add_argument("--fix", choices=["none", "d2h", "record", "both", "wait"], default="none")
    p.add_argument("--mode", choices=["generate", "loop", "both"], default="both")
    p.add_argument(
        "--sleep-layers",
        default="all",
        help="comma list of layer indices that get the spin, or 'all'",
    )
    p.add_argument(
        "--repeat", type=int, default=2, help="offloaded runs per mode (the reference runs once)"
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--init-std", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument(
        "--prewarm-pinned",
        type=int,
        default=128,
        help="free pinned blocks per size class put in the host allocator first (0: none)",
    )
    p.add_argument("--cpu-dry-run", action="store_true")
    args = p.parse_args()

    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()

    ST.update(where=args.where, fix=args.fix, tol=args.tol, dry=args.cpu_dry_run)
    ST["sleep_layers"] = (
        None if args.sleep_layers == "all" else {int(x) for x in args.sleep_layers.split(",")}
    )
    if args.cpu_dry_run:
        install_cpu_fakes()
        device = torch.device("cpu")
        cpms = 1.0
    else:
        if not torch.cuda.is_available():
            print("WRONG: no CUDA device (use --cpu-dry-run on a CPU machine)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        cpms = calibrate_cycles_per_ms()
        ST["prewarmed"] = prewarm_pinned(args)
    ST["cycles"] = int(args.sleep_ms * cpms)
    install_patches()

    model = build_model(args, device)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, args.vocab, (args.batch, args.prompt_len), generator=g).to(device)

    modes = ["generate", "loop"] if args.mode == "both" else [args.mode]
    runners = {"generate": run_generate, "loop": run_loop}
    parts, all_ok, answer = [], True, None
    for mode in modes:
        ref = runners[mode](model, ids, args, offloaded=False)
        if answer is None:
            answer = ref[0][0].tolist()
        worst = None
        nbad = 0
        for _ in range(args.repeat):
            ST["active"] = True
            ST["cat_read"] = {}
            try:
                got = runners[mode](model, ids, args, offloaded=True)
            finally:
                ST["active"] = False
            r = compare(ref, got)
            nbad += int(not r["ok"])
            if (
                worst is None
                or (not r["ok"] and worst["ok"])
                or r["max_logit_diff"] > worst["max_logit_diff"]
            ):
                worst = r
        all_ok &= nbad == 0
        parts.append(fmt(mode, worst) + f" wrong_runs={nbad}/{args.repeat}")

    sleeps = sum(v for k, v in C.items() if k.startswith("sleep:"))
    counts = (
        f"offload_d2h={C['offload D2H']} (on default {C['offload on default stream']}) "
        f"prefetch_h2d={C['prefetch H2D']} "
        f"(on side stream {C['prefetch on non-default stream']}, "
        f"layer0 wrap {C['prefetch of layer 0 (wrap-around)']}) "
        f"cat_consumer={C['cat consumes prefetched kv']} "
        f"(on default {C['cat on default stream']}) "
        f"record_stream={C['record_stream'] + C['dry:record_stream']} "
        f"hazards: h2d_then_cat_no_wait="
        f"{C['hazard: H2D consumed by the cat of the same update (no wait in between)']} "
        f"h2d_after_same_fwd_d2h="
        f"{C['hazard: H2D reads a pinned block whose D2H was queued in the same forward']} "
        f"h2d_into_cat_read_block_same_fwd="
        f"{C['hazard: H2D writes a block a cat read in the same forward']} "
        f"(any fwd {C['hazard: H2D writes a block a cat read (any forward)']})"
    )
    summary = (
        f"where={args.where} fix={args.fix} sleep_ms={args.sleep_ms:g} cycles={ST['cycles']} "
        f"spins={sleeps} "
        f"prewarmed_pinned={ST.get('prewarmed', 0)} "
        + " ".join(parts)
        + f" | {counts} | verdict={'OK' if all_ok else 'WRONG'}"
    )
    if args.cpu_dry_run:
        summary += " | dry: " + ", ".join(
            f"{k[4:]}={v}" for k, v in sorted(C.items()) if k.startswith("dry:")
        )
    if not all_ok:
        print("WRONG: " + summary, file=sys.stderr)
        return 1
    print(f"answer={answer[:12]}... " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
