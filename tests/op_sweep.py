"""Every op of PyTorch's own test database (OpInfo) run bare and under the PyTorch source, on
the CPU or a GPU: the capture must never change what an op does, and every byte an op writes in
its arguments must be among the writes the capture says.

    python tests/op_sweep.py [--ops add,mul] [--samples 3] [--grad | --inference]
                             [--device cuda] [--json F]
    python tests/op_sweep.py --modules [--ops nn.LSTM]
    python tests/op_sweep.py --hops [--ops cond,scan]

PyTorch ships ``torch.testing._internal.common_methods_invocations.op_db``: over 700 ops, each
with sample inputs that its own test suite runs (views, non-contiguous and broadcast tensors,
scalars, empty tensors), and its in-place variant where it has one. For each op, its
in-place variant, and its ``out=`` form (where it supports one), and each of its first
samples (float32, else the first dtype it supports):

- it runs bare (the capture's mode off the stack, as a program runs unwatched), and again with
  the capture on, from the same samples and the same seed; the result (values, NaNs at the
  same places, dtype, shape) or the exception must be the same, and so must the arguments
  after the op;
- the sample's storages are taken for the watched memory (pinned host memory, the only memory a
  CPU has that the capture watches), and the bytes that changed in them during the watched run
  must all lie in the write spans of the events the capture emitted: a byte written that the
  capture does not say is a race it would miss;
- the capture's own failures to read an op (counted, the op runs unwatched) are listed;
- on CUDA tensors (``--device cuda``), whose memory is watched as it is, no op touching device
  memory may be said as the host's own.

``--grad`` makes samples that require grad and runs each op's backward too (other kernels, and
ops that reach the mode whole); ``--inference`` runs each op under ``torch.inference_mode()``,
where PyTorch hands a dispatch mode composite ops whole.

With ``--hops`` it runs PyTorch's database of higher-order ops (``hop_db``: torch.cond, scan,
while_loop, flex_attention, ...), which reach a dispatch mode whole.

With ``--modules`` it runs PyTorch's module database (``common_modules.module_db``) the same
way: each module trains (forward, backward, an SGD step) and runs in eval mode, and the bytes
it may write are its parameters' and buffers' (batch norm's running statistics).

Needs PyTorch and ``expecttest`` (which PyTorch's test database imports). It prints one line
per problem and a summary; exit 1 when a result differed or a write went unsaid. Nothing here
is a test of CI's: tests/test_op_sweep.py runs it where PyTorch is, and docs/testing.md says
what it found.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.capture.events import DEVICE, HOST  # noqa: E402 - gpurace from this checkout

SEED = 1234
BARE, PLAIN, WATCHED = "bare", "plain", "watched"  # how Sweep.call runs an op
ANY_MODE = "any mode"  # a difference PyTorch's own pass-through mode makes too
UNINITIALIZED = ("empty", "new_empty")
"""Ops whose results hold whatever the allocator's block held: only their kind and shape are
compared."""


@functools.cache
def _passing_mode() -> type:
    """A dispatch mode that lets every op through, as PyTorch's documentation writes one, and
    higher-order ops too (which a mode must say it takes)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        supports_higher_order_operators = True

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    return Passing


class Problem(NamedTuple):
    """What the sweep found wrong with one op's run: which op, form and sample, and what."""

    op: str
    form: str  # "op", "inplace" or "out"
    sample: int
    kind: str  # "differs", ANY_MODE, "unsaid write", "capture failed"
    what: str

    def line(self) -> str:
        return f"{self.kind}: {self.op} ({self.form}, sample {self.sample}): {self.what}"


def tensors(value: Any) -> Iterator[Any]:
    """The tensors in an op's argument or result (a lazy module's parameters before its first
    forward have no bytes yet: not these)."""
    import torch
    if isinstance(value, torch.Tensor):
        if not isinstance(value, torch.nn.parameter.UninitializedTensorMixin):
            yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def same(a: Any, b: Any, values: bool = True) -> str | None:
    """Why ``a`` and ``b`` (results, or arguments after the op) differ; None when they do not.
    ``values``: whether tensors' values are compared, not only their kind and shape."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{type(a).__name__} against {type(b).__name__}"
        if (a.dtype, a.shape, a.layout, a.device) != (b.dtype, b.shape, b.layout, b.device):
            return f"{a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
        if a.layout != torch.strided or a.is_quantized or not values:
            return None  # compared by their kind and shape alone
        x, y = (torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))
                for t in (a, b))  # fresh and dense, to read as bytes
        if torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            return None  # the same bits (any dtype, NaNs included)
        if (x.is_floating_point() or x.is_complex()) and x.element_size() > 1 and \
                torch.allclose(x, y, rtol=0, atol=0, equal_nan=True):
            return None  # -0.0 against 0.0, or NaNs of other bits
        return "values differ"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{len(a)} items against {len(b)}"
        for x, y in zip(a, b):
            why = same(x, y, values)
            if why:
                return why
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        return None if a == b else f"{a!r} against {b!r}"
    except Exception:  # noqa: BLE001 - a value that cannot be compared is taken as the same
        return None


class Outcome(NamedTuple):
    result: Any
    error: str | None
    args_after: list[Any]


class ModuleCase(NamedTuple):
    """A module's sample, shaped as an op's for :meth:`Sweep.run`: ``input`` its parameters and
    buffers (whose bytes it may write), ``args`` the module and its forward arguments."""

    input: list[Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class Sweep:
    def __init__(self, samples: int, device: str = "cpu", grad: bool = False,
                 inference: bool = False) -> None:
        import torch

        from harness.capture import events as E
        from harness.capture import torch_source

        self.torch = torch
        self.samples = samples
        self.device = device
        self.grad = grad  # samples that require grad, and the op's backward run too
        # Under inference_mode the mode meets composite ops whole, and runs their
        # decompositions itself.
        self.inference = inference
        self.out = io.StringIO()
        self.sink = E.Sink(self.out)
        self.stop = torch_source.install(self.sink)
        self.cap = self.stop.capture  # type: ignore[attr-defined]
        self.cap.on = False
        self.problems: list[Problem] = []
        self.runs = 0

    def samples_of(self, op: Any, dtype: Any) -> list[Any]:
        torch = self.torch
        torch.manual_seed(SEED)
        out = []
        grad = self.grad and op.supports_autograd and dtype.is_floating_point
        for sample in op.sample_inputs(self.device, dtype, requires_grad=grad):
            out.append(sample)
            if len(out) >= self.samples:
                break
        return out

    def call(self, fn: Callable[..., Any], sample: Any, out: Any, under: str = WATCHED
             ) -> Outcome:
        """``fn`` on ``sample``, ``under`` the capture's mode (WATCHED), with it off the stack
        as a program runs unwatched (BARE), or with only PyTorch's own pass-through mode
        there (PLAIN). A mode on the stack, even one that lets every op through, is seen by
        what asks for one: higher-order ops, and PyTorch's linear algebra, which then takes
        the paths it keeps for tensor subclasses."""
        from torch.utils._python_dispatch import _disable_current_modes

        torch = self.torch
        torch.manual_seed(SEED + 1)
        kwargs = dict(sample.kwargs)
        if out is not None:
            kwargs["out"] = out
        try:
            with torch.inference_mode(self.inference), contextlib.ExitStack() as modes:
                if under != WATCHED:
                    modes.enter_context(_disable_current_modes())
                if under == PLAIN:
                    modes.enter_context(_passing_mode()())
                result = fn(sample.input, *sample.args, **kwargs)
            if self.grad and out is None:
                result = (result, self.backward(result, sample))
            error = None
        except Exception as exc:  # noqa: BLE001 - the op's own error is part of its outcome
            first = str(exc).splitlines()[0][:120] if str(exc) else ""
            result, error = None, f"{type(exc).__name__}: {first}"
        after = [t.detach().clone() if t.layout == torch.strided else t.detach()
                 for t in tensors([sample.input, sample.args, sample.kwargs])]
        return Outcome(result, error, after)

    def backward(self, result: Any, sample: Any) -> Any:
        """The gradients of the sum of ``result``'s float tensors with respect to the sample's
        tensors that require them (None: nothing to differentiate)."""
        torch = self.torch
        outs = [t for t in tensors(result) if t.requires_grad and t.is_floating_point()]
        ins = [t for t in tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
        if not outs or not ins:
            return None
        loss = torch.stack([t.sum() for t in outs]).sum()
        return torch.autograd.grad(loss, ins, allow_unused=True)

    def snapshot(self, storage: Any) -> Any:
        """A copy of a storage's bytes, as a NumPy array (``bytes(storage)`` reads them one
        by one, through the dispatcher)."""
        torch = self.torch
        view = torch.empty(0, dtype=torch.uint8, device=storage.device)
        view.set_(storage, 0, (storage.nbytes(),))
        # Through a copy: NumPy's view of a storage would make it one that cannot be resized.
        return torch.empty(storage.nbytes(), dtype=torch.uint8).copy_(view).numpy()

    def run(self, name: str, form: str, index: int, make: Callable[[], tuple[Any, Any]],
            fn: Callable[..., Any]) -> None:
        """``make`` gives a fresh sample and its ``out=`` tensors (or None), the same each call."""
        torch, cap = self.torch, self.cap
        sample, out = make()
        bare = self.call(fn, sample, out, BARE)
        sample, out = make()
        storages = {}
        for t in tensors([sample.input, sample.args, sample.kwargs, out]):
            if t.layout != torch.strided or t.is_quantized or t.device.type != self.device:
                continue
            s = t.untyped_storage()
            if s.data_ptr() and s.nbytes():
                storages[s.data_ptr()] = s
        before = {ptr: self.snapshot(s) for ptr, s in storages.items()}
        if self.device == "cpu":  # a CPU's watched memory is pinned memory
            for ptr in storages:
                cap.pinned[ptr] = {}
        failures = dict(cap.guard.counts)
        self.sink.flush()
        start = self.out.tell()
        cap.on = True
        try:
            watched = self.call(fn, sample, out)
        finally:
            cap.on = False
        self.sink.flush()
        self.runs += 1
        events = [json.loads(line) for line in self.out.getvalue()[start:].splitlines() if line]
        for ptr in storages:
            cap.pinned.pop(ptr, None)
        plain = None
        if bare.error != watched.error or same(bare.result, watched.result):
            plain = self.call(fn, *make(), PLAIN)  # is it the capture's, or any mode's?
        self.check(Problem(name, form, index, "", ""), bare, watched, events,
                   {ptr: (s, before[ptr]) for ptr, s in storages.items()}, failures, plain)

    def check(self, at: Problem, bare: Outcome, watched: Outcome, events: list[list[Any]],
              storages: dict[int, tuple[Any, Any]], failures: dict[str, int],
              plain: Outcome | None = None) -> None:
        """What went wrong in the run ``at`` names: ``storages`` are its arguments' (with
        their bytes before the watched run), ``failures`` the capture's counts before it,
        ``plain`` the run under PyTorch's own pass-through mode (where it differed)."""
        def problem(kind: str, what: str) -> None:
            self.problems.append(at._replace(kind=kind, what=what))

        values = not at.op.startswith(UNINITIALIZED)
        # Where PyTorch's own pass-through mode gives what the capture's gives, the difference
        # is PyTorch's, for any mode (its CUDA sanitizer's too): said, not the capture's.
        differs = "differs"
        if plain is not None and plain.error == watched.error and (
                watched.error is not None or not same(plain.result, watched.result, values)):
            differs = ANY_MODE
        if bare.error != watched.error:
            problem(differs, f"bare {bare.error}, watched {watched.error}")
        elif bare.error is None:
            why = same(bare.result, watched.result, values=values)
            if why:
                problem(differs, f"result: {why}")
        why = same(bare.args_after, watched.args_after)
        if why:
            problem("differs", f"arguments after: {why}")
        for key, n in self.cap.guard.counts.items():
            if n != failures.get(key, 0):
                problem("capture failed", key)
        ops = [e for e in events if e[0] == "op"]
        for e in ops:
            if e[1] is None and any(span[0] == DEVICE for span in (*e[3], *e[4])):
                problem("host op on device memory", f"{e[5].get('op')} said as the host's own")
        space = HOST if self.device == "cpu" else DEVICE
        written = [(w[1], w[1] + w[2]) for e in ops for w in e[4] if w[0] == space]
        for ptr, (storage, old) in storages.items():
            now = self.snapshot(storage)[:len(old)]
            changed = old[:len(now)] != now
            said = numpy.zeros(len(now), dtype=bool)
            for lo, hi in written:
                said[max(lo - ptr, 0):max(hi - ptr, 0)] = True
            unsaid = int((changed & ~said).sum())
            if unsaid:
                names = ", ".join(sorted({e[5].get("op", "?") for e in ops})) or "none"
                problem("unsaid write", f"{unsaid} of {int(changed.sum())} changed bytes of a "
                        f"{len(old)}-byte argument storage not in its ops' writes ({names})")

    def sweep(self, op: Any) -> None:
        torch = self.torch
        dtypes = op.supported_dtypes(self.device)
        if not dtypes:
            return
        dtype = torch.float32 if torch.float32 in dtypes else sorted(dtypes, key=str)[0]
        for index in range(len(self.samples_of(op, dtype))):
            make = functools.partial(self.made, op, dtype, index, None)
            self.run(op.name, "op", index, make, op)
            if op.inplace_variant is not None:
                self.run(op.name, "inplace", index, make, op.inplace_variant)
            if op.supports_out:
                bare = self.call(op, self.samples_of(op, dtype)[index], None, BARE)
                if bare.error is None and isinstance(bare.result, torch.Tensor):
                    like = bare.result
                    self.run(op.name, "out", index,
                             functools.partial(self.made, op, dtype, index, like), op)

    def sweep_module(self, info: Any) -> None:
        """A module of PyTorch's module database, in training (forward, backward and an SGD
        step, whose in-place updates are writes) and in eval mode (forward only)."""
        torch = self.torch
        dtype = torch.float32
        if dtype not in info.supported_dtypes(self.device):
            return
        for training in (True, False):
            count = len(self.module_cases(info, dtype, training))
            for index in range(min(count, self.samples)):
                make = functools.partial(self.module_case, info, dtype, training, index)
                self.run(info.name, "train" if training else "eval", index, make,
                         functools.partial(self.module_step, training))

    def module_cases(self, info: Any, dtype: Any, training: bool) -> list[Any]:
        self.torch.manual_seed(SEED)
        return info.module_inputs_func(info, device=self.device, dtype=dtype,
                                       requires_grad=training, training=training)

    def module_case(self, info: Any, dtype: Any, training: bool, index: int
                    ) -> tuple[ModuleCase, None]:
        case = self.module_cases(info, dtype, training)[index]
        self.torch.manual_seed(SEED)
        module = info.module_cls(*case.constructor_input.args,
                                 **case.constructor_input.kwargs).to(self.device, dtype)
        module.train(training)
        state = [*module.parameters(), *module.buffers()]
        forward = case.forward_input
        return ModuleCase(state, (module, *forward.args), dict(forward.kwargs)), None

    def module_step(self, training: bool, state: list[Any], module: Any, *args: Any,
                    **kwargs: Any) -> Any:
        torch = self.torch
        out = module(*args, **kwargs)
        params = [p for p in module.parameters() if p.requires_grad]
        outs = [t for t in tensors(out) if t.requires_grad and t.is_floating_point()]
        if not training or not params or not outs:
            return out
        torch.stack([t.sum() for t in outs]).sum().backward()
        torch.optim.SGD(params, lr=0.1).step()
        return out, [p.grad for p in params]

    def made(self, op: Any, dtype: Any, index: int, like: Any) -> tuple[Any, Any]:
        """Sample ``index`` of ``op``, made anew, and an ``out=`` tensor shaped as ``like``
        (None: none), filled with what the op will overwrite."""
        sample = self.samples_of(op, dtype)[index]
        if like is None:
            return sample, None
        return sample, self.torch.full_like(like, 7 if like.dtype != self.torch.bool else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated names (all of the database by default)")
    parser.add_argument("--samples", type=int, default=3, help="samples an op or module (3)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the samples are made (cpu)")
    parser.add_argument("--json", help="write the problems here as JSON")
    parser.add_argument("--grad", action="store_true",
                        help="samples that require grad, and each op's backward too")
    parser.add_argument("--inference", action="store_true",
                        help="each op under torch.inference_mode() (not with --grad)")
    parser.add_argument("--modules", action="store_true",
                        help="PyTorch's module database instead of its ops")
    parser.add_argument("--hops", action="store_true",
                        help="PyTorch's database of higher-order ops (torch.cond, scan, "
                             "flex_attention, ...) instead of its ops")
    parser.add_argument("--start", type=int, default=0, help="skip the database's first N")
    parser.add_argument("--verbose", action="store_true", help="name each entry as it starts")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.grad and args.inference:
        parser.error("--grad and --inference exclude each other: no backward in inference mode")
    sweep = Sweep(args.samples, args.device, args.grad, args.inference)
    if args.modules:
        from torch.testing._internal.common_modules import module_db
        what, database, one = "modules", module_db, sweep.sweep_module
    elif args.hops:
        from torch.testing._internal.hop_db import hop_db
        what, database, one = "higher-order ops", hop_db, sweep.sweep
    else:
        from torch.testing._internal import common_methods_invocations as databases
        # The ops, then the _foreach_ ops (lists of tensors, as optimizers call them), which
        # have databases of their own.
        what, one = "ops", sweep.sweep
        database = databases.op_db + [op for name in sorted(dir(databases))
                                      if name.startswith("foreach_") and name.endswith("_op_db")
                                      for op in getattr(databases, name)]
    chosen = set(args.ops.split(",")) if args.ops else None
    items = [item for item in database[args.start:] if chosen is None or item.name in chosen]
    for n, item in enumerate(items, 1):
        if args.verbose:
            print(f"{n} {item.name}", file=sys.stderr, flush=True)
        elif n % 100 == 0:
            print(f"{n} of {len(items)} {what}, {len(sweep.problems)} problems so far",
                  file=sys.stderr)
        try:
            one(item)
        except Exception as exc:  # noqa: BLE001 - the database's own trouble with an entry
            print(f"skipped {item.name}: {type(exc).__name__}: {str(exc)[:100]}",
                  file=sys.stderr)
    sweep.stop()
    for problem in sweep.problems:
        print(problem.line())
    kinds: dict[str, int] = {}
    for problem in sweep.problems:
        kinds[problem.kind] = kinds.get(problem.kind, 0) + 1
    print(f"{len(items)} {what}, {sweep.runs} watched runs; "
          + (", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no problem"))
    if args.json:
        Path(args.json).write_text(json.dumps([p._asdict() for p in sweep.problems], indent=1))
    return 1 if any(p.kind not in ("capture failed", ANY_MODE) for p in sweep.problems) else 0


if __name__ == "__main__":
    sys.exit(main())
