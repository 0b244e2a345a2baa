"""Every image model timm ships, built on the CPU and run bare and under the PyTorch source:
the capture must never change what a model computes, nor what it says.

    python tests/timm_sweep.py [--models resnet18,vit_tiny_patch16_224] [--start N] [--limit N]
                               [--max-params 30000000] [--slow 10] [--order spread|name]
                               [--runs build,forward,train,inference] [--json out.json]

The models are ``timm.list_models()``, in ``--order spread`` (the default) taken round-robin
over timm's model modules (the first model of each architecture file, then the second of each,
...), so that the first few hundred are as many architectures as possible; ``--order name`` is
timm's own order. ``--start`` and ``--limit`` take a piece of that order, so that the zoo can be
swept in pieces, or in parallel processes. Each model is built by
``timm.create_model(name, pretrained=False, num_classes=10)`` (no weights are downloaded), in
float32, from one seed, and made small where timm lets it:

- its input is 64 pixels a side, or 96 or 128, where the model takes any size (its
  ``pretrained_cfg`` not ``fixed_input_size``) or takes an ``img_size`` argument (ViTs, Swins:
  their position embeddings built for it); the first side a forward on the meta device accepts,
  else the ``input_size`` of its ``pretrained_cfg``; its channels are the config's, batch 2;
- its parameters are counted on the meta device, and over ``--max-params`` it is skipped (timm
  names each family's sizes, tiny to giant, as models of their own: the small ones cover it).

Then, as ``tests/hf_sweep.py`` does for transformers (whose comparison this reuses):

- build: the model built bare and again with the capture on; its parameters and buffers;
- forward: a forward pass in eval mode under ``no_grad``;
- train: one step in train mode (dropout and drop-path on): cross-entropy on random labels
  (the mean square of the output where it is not one logit per class),
  ``loss.backward()`` and SGD: output, loss, gradients, and parameters and buffers after;
- inference: forward under ``inference_mode``, where PyTorch hands the mode composite ops
  whole (``linear``) and the capture runs their decompositions itself.

Each run is bare (the capture's mode off the mode stack) and watched (``cap.on``, every CPU
tensor taken for pinned memory so that each op's whole path runs, as on a GPU), from identical
deep copies of the model and its inputs and the same seed before each. Their values must be the
same bit for bit, or the same exception raised; output added on fds 1 and 2 and the capture's
own failures (its ``guard``) are problems too. A difference is checked by running bare again
(nondeterministic: said per model, not a problem) and under a dispatch mode that does nothing
(the same difference there is any mode's, PyTorch's, listed and not a problem). A model whose
bare run takes over ``--slow`` seconds is skipped.

It prints one line per problem and a summary, and exits 1 when there is a problem. Needs
PyTorch, timm, and transformers (which ``hf_sweep.leaves`` imports). The whole zoo under 30M
parameters (678 models of 1371; input 64 pixels a side for most) takes about 47 minutes of one
process on a CPU core, all runs bare and watched; two processes of one thread each
(``OMP_NUM_THREADS=1``), each with its own ``--start`` pieces, halve that on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# hf_sweep by its own name, from this file's folder: "tests" may be another project's package
# (an editable install of kornia makes it its own test folder).
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from hf_sweep import (SEED, Record, Sweep, Timeout, message, report,  # noqa: E402
                      state_of, sweep_each, time_limit)

BATCH = 2
CLASSES = 10
SIDES = (64, 96, 128)  # image sides tried, smallest first, where a model takes any size
RUNS = ("build", "forward", "train", "inference")

Inputs = tuple[Any, Any]  # images [BATCH, C, H, W] and labels [BATCH]


def first_tensor(value: Any) -> Any:
    """The first tensor of a model's output (not detached, as ``leaves`` gives them)."""
    if isinstance(value, (list, tuple)):
        return next(t for t in map(first_tensor, value) if t is not None)
    if isinstance(value, dict):
        return first_tensor(list(value.values()))
    import torch
    return value if isinstance(value, torch.Tensor) else None


def ordered(names: list[str], order: str) -> list[str]:
    """``names`` in the sweep's order: timm's own, or round-robin over its model modules."""
    if order == "name":
        return names
    from timm.models import _registry
    modules: dict[str, list[str]] = {}
    for name in names:
        modules.setdefault(_registry._model_to_module.get(name, ""), []).append(name)
    queues = list(modules.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


class TimmSweep(Sweep):
    """hf_sweep's Sweep (the capture installed once, ``compare`` of bare and watched runs) with
    timm's models and runs in place of transformers'."""

    def __init__(self, max_params: int, slow_s: float, runs: tuple[str, ...]) -> None:
        super().__init__(max_params, slow_s)
        self.runs = runs
        self.sizes: dict[str, list[int]] = {}  # model -> the [C, H, W] it was given

    def plan(self, name: str) -> tuple[dict[str, Any], tuple[int, int, int], int] | str:
        """(create_model's extra arguments, input [C, H, W], parameters) for ``name``, found on
        the meta device (nothing allocated, nothing initialised), or why it is skipped."""
        torch = self.torch
        import timm
        cfg = timm.get_pretrained_cfg(name, allow_unregistered=True)
        channels, height, width = cfg.input_size if cfg is not None else (3, 224, 224)
        least = max(cfg.min_input_size[1:]) if cfg is not None and cfg.min_input_size else 0
        # A model of any size gets a small image as is; a fixed-size one where it takes an
        # img_size (its position embeddings then made for it). The model's own last.
        fixed = cfg is None or cfg.fixed_input_size
        tries: list[tuple[dict[str, Any], tuple[int, int]]] = [
            ({"img_size": side} if fixed else {}, (side, side))
            for side in SIDES if least <= side < min(height, width)]
        tries.append(({}, (height, width)))
        last = ""
        for extra, (h, w) in tries:
            try:
                with torch.device("meta"):
                    model = timm.create_model(name, pretrained=False, num_classes=CLASSES,
                                              **extra)
                params = sum(p.numel() for p in model.parameters())
                if params > self.max_params:
                    return f"over {self.max_params / 1e6:g}M parameters ({params / 1e6:.1f}M)"
                if (h, w) != (height, width):  # its own size is taken untried, as a last resort
                    with torch.no_grad():
                        model.eval()(torch.empty(BATCH, channels, h, w, device="meta"))
                return extra, (channels, h, w), params
            except Exception as exc:  # noqa: BLE001 - not this size: the next one
                last = message(exc)
        return f"build on meta: {last}"

    def sweep_model(self, name: str) -> None:
        """One model: its size planned, built, and each of its runs compared."""
        torch = self.torch
        import timm

        def skip(reason: str, params: int = 0) -> None:
            self.records.append(Record(name, "skipped", reason, params, 0, 0.0, 0.0, []))

        with self.popped(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # meta tensors' own advice, not a run's output
            planned = self.plan(name)
        if isinstance(planned, str):
            return skip(planned)
        extra, (c, h, w), params = planned
        self.sizes[name] = [c, h, w]

        def build() -> Any:
            return timm.create_model(name, pretrained=False, num_classes=CLASSES, **extra
                                     ).to(torch.float32).eval()

        def built(_: Any) -> dict[str, Any]:
            return state_of(build())

        with self.popped(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said again, and compared, by the build run
            self.seed()
            try:
                with time_limit(3 * self.slow_s):
                    model = build()
            except (Exception, Timeout) as exc:  # noqa: BLE001 - built on meta, not on the CPU
                return skip(f"build: {message(exc)}", params)
            generator = torch.Generator().manual_seed(SEED)
            inputs: Inputs = (torch.randn(BATCH, c, h, w, generator=generator),
                              torch.randint(0, CLASSES, (BATCH,), generator=generator))

        def make() -> tuple[Any, Inputs]:
            return copy.deepcopy(model), (inputs[0].clone(), inputs[1].clone())

        acts: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
            "build": (lambda: None, built), "forward": (make, self.forward),
            "train": (make, self.train), "inference": (make, self.inference)}
        self.compare_runs(name, [(run, *acts[run]) for run in self.runs], params)

    def forward(self, subject: tuple[Any, Inputs]) -> Any:
        model, (images, _) = subject
        with self.torch.no_grad():
            return model(images)

    def inference(self, subject: tuple[Any, Inputs]) -> Any:
        model, (images, _) = subject
        with self.torch.inference_mode():
            return model(images)

    def train(self, subject: tuple[Any, Inputs]) -> Any:
        torch = self.torch
        model, (images, labels) = subject
        model.train()
        out = model(images)
        # A model may answer with more than its logits in train mode (a distilled head's, an
        # auxiliary classifier's): the loss is the first tensor's, all of them are compared.
        logits = first_tensor(out)
        if tuple(logits.shape) == (BATCH, CLASSES):
            loss = torch.nn.functional.cross_entropy(logits, labels)
        else:
            loss = logits.float().square().mean()
        loss.backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        # Batch norm's running statistics, written in train mode, are compared too.
        return {"out": out, "loss": loss,
                "grads": {n: p.grad for n, p in model.named_parameters()},
                "after": state_of(model)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated model names (all of timm's by default)")
    parser.add_argument("--order", choices=("spread", "name"), default="spread",
                        help="round-robin over timm's model modules (default), or by name")
    parser.add_argument("--start", type=int, default=0, help="skip the first N models")
    parser.add_argument("--limit", type=int, help="sweep N models only (from --start)")
    parser.add_argument("--max-params", type=int, default=30_000_000,
                        help="skip models with more parameters than this (30M)")
    parser.add_argument("--slow", type=float, default=10.0,
                        help="skip a model whose bare run takes longer, in seconds (10)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"which runs, of {','.join(RUNS)} (all of them)")
    parser.add_argument("--json", help="write the problems and each model's record here")
    args = parser.parse_args(argv)
    runs = tuple(args.runs.split(","))
    if set(runs) - set(RUNS):
        parser.error(f"--runs: not one of {','.join(RUNS)}: {','.join(set(runs) - set(RUNS))}")
    # Every warning each time, so that one said by the bare run is said by the watched run too.
    warnings.simplefilter("always")
    import timm

    names = timm.list_models()
    if args.models:
        chosen = args.models.split(",")
        unknown = [n for n in chosen if n not in set(names)]
        if unknown:
            parser.error(f"--models: not timm's: {','.join(unknown)}")
        names = chosen
    names = ordered(names, args.order)[args.start:]
    names = names[:args.limit] if args.limit is not None else names
    sweep = TimmSweep(args.max_params, args.slow, runs)
    sweep_each(sweep, names, sweep.sweep_model, str, "models", 10)
    report(sweep, len(names), "models")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"problems": [p._asdict() for p in sweep.problems],
             "any_mode": sweep.any_mode, "sizes": sweep.sizes,
             "models": [r._asdict() for r in sweep.records]}, indent=1))
    return 1 if sweep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
