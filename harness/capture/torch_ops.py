"""What a PyTorch op does to memory, as its schema says, and where a tensor's bytes are.

The PyTorch source (:mod:`harness.capture.torch_source`) asks these once per op overload
(:class:`Plan`) and once per tensor (:func:`byte_spans`); nothing here imports PyTorch, so the rules
are read without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from types import FrameType
from typing import Any, NamedTuple, Protocol

SLOW_NS = 10_000_000
"""An op on which the capture's own code spent longer than this (10 ms) is listed in its stats:
a pause of that size inside the program's work could change what its timing shows."""
SLOWEST_KEPT = 20

RUNS_MAX = 64
"""Contiguous runs of a strided view listed one by one; a view with more is its hull (one range
from its first byte to its last), which may take bytes between its rows for its own."""

_NO_WORK = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "is_pinned",
    "size", "stride", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "set_",
    "resize_", "_has_compatible_shallow_copy_type", "lift_fresh", "detach", "alias",
    "_unsafe_view", "record_stream", "is_same_size", "_local_scalar_dense_placeholder",
})
"""Ops that touch no tensor's bytes (allocate, look at metadata, or view): their new tensors
are still allocations."""

_COPIES = frozenset({"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "copy"})
SCALAR_READS = frozenset({"_local_scalar_dense", "item", "is_nonzero"})
"""Ops that copy one value of a tensor to the host (``item`` and ``is_nonzero`` reach a mode
whole under ``inference_mode``; elsewhere as ``_local_scalar_dense``)."""
PINS = frozenset({"_pin_memory", "pin_memory"})
FUNCTIONAL_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
    "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "broadcast", "broadcast_", "wait_tensor"})
"""The ops of ``_c10d_functional`` said as collectives and their wait
(:mod:`harness.capture.torch_functional`); its point-to-point ones are ordinary ops."""


class ArgAt(NamedTuple):
    """Where an op's schema has an argument: its position and its keyword."""

    index: int
    name: str


class SchemaArg(Protocol):
    """An argument of an op's schema: its position and its keyword."""

    @property
    def index(self) -> int: ...

    @property
    def name(self) -> str: ...


def given(at: SchemaArg, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What an op was given for the schema argument ``at``, by position or by keyword."""
    return args[at.index] if at.index < len(args) else kwargs.get(at.name)


class TensorArg(NamedTuple):
    """An argument of an op's schema that may hold tensors."""

    index: int  # its position
    name: str  # its keyword
    written: bool  # annotated Tensor(a!): the op writes it
    written_if: ArgAt | None = None  # unmarked, written when this argument is true


_STATS = ("running_mean", "running_var")
UNMARKED_WRITES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: ("training", _STATS) for name in (
        "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "batch_norm",
        "_batch_norm_impl_index")},
    "instance_norm": ("use_input_stats", _STATS)}
"""Ops that write arguments their schemas do not mark, and the argument that says when: batch
and instance norm's running statistics, updated while they train (PyTorch keeps these schemas
as they were; its newer ``_native_batch_norm_legit`` marks them). Otherwise they are read."""


class Plan:
    """What an op's schema says, worked out once per op overload (``decomposes``: the devices
    on which the mode runs it as its decomposition, as PyTorch would without the mode)."""

    __slots__ = ("name", "kind", "kernel", "args", "written", "fresh_returns", "no_work",
                 "device_at", "collective", "functional", "pins", "pin_memory_at",
                 "decomposes", "func", "qualified", "unannotated")

    def __init__(self, func: Any, decomposes: frozenset[str] = frozenset()) -> None:
        self.func = func
        self.decomposes = decomposes
        schema = func._schema
        namespace, _, self.name = schema.name.rpartition("::")
        # torch.distributed's ops: c10d's own, and the functional ones DTensor and
        # torch.compile's code issue.
        self.functional = namespace == "_c10d_functional" and \
            self.name in FUNCTIONAL_COLLECTIVES
        self.collective = namespace == "c10d" or self.functional
        self.no_work = self.name in _NO_WORK
        self.kind = "copy" if self.name in _COPIES else (
            "scalar" if self.name in SCALAR_READS else "kernel")
        self.kernel = "kernel:" + self.name
        self.pins = self.name in PINS  # its result is pinned memory
        self.pin_memory_at = False  # whether it takes pin_memory= (a factory)
        self.args: list[TensorArg] = []
        self.device_at: ArgAt | None = None  # where a device= argument is
        flag, unmarked = UNMARKED_WRITES.get(self.name, ("", ()))
        flag_at = next((ArgAt(i, arg.name) for i, arg in enumerate(schema.arguments)
                        if arg.name == flag), None)
        for i, arg in enumerate(schema.arguments):
            if "Tensor" in str(arg.type):
                alias = arg.alias_info
                self.args.append(TensorArg(
                    i, arg.name, bool(alias is not None and alias.is_write),
                    flag_at if arg.name in unmarked else None))
            elif arg.name == "device":
                self.device_at = ArgAt(i, arg.name)
            elif arg.name == "pin_memory":
                self.pin_memory_at = True
        self.written = any(a.written or a.written_if for a in self.args)
        self.qualified = schema.name
        # An extension's op that marks no argument written and returns nothing must write
        # something its schema does not say: its reads are seen, its writes cannot be.
        self.unannotated = namespace not in ("aten", "prims") and bool(self.args) and \
            not self.written and not schema.returns
        self.fresh_returns = any(r.alias_info is None and "Tensor" in str(r.type)
                                 for r in schema.returns)
        if schema.returns and not self.written and all(
                r.alias_info is not None for r in schema.returns):
            self.no_work = True  # a view: every return is an input's bytes, nothing written


class Pending:
    """An op between its arguments' reading and its results': what it was found to touch."""

    __slots__ = ("event", "reads", "writes", "bases", "frame", "site", "sid", "meta", "pins",
                 "pinned", "lent_ns", "placed")

    def __init__(self, reads: list[list[Any]], writes: list[list[Any]], bases: set[int],
                 frame: FrameType | None, site: str | None, meta: dict[str, Any]) -> None:
        self.event: list[Any] | None = None
        self.reads, self.writes, self.bases = reads, writes, bases
        self.frame, self.site, self.meta = frame, site, meta
        self.sid: int | None = None
        self.pins = False  # whether its new CPU tensors may be pinned
        self.pinned: list[int] = []  # the pinned blocks a stream op copies from or into
        self.lent_ns = 0  # of the capture's time, what the op itself would have spent
        self.placed = True  # whether the program's line was looked for (frame and site)


def tensors_in(value: Any, tensor: type) -> Iterable[Any]:
    if isinstance(value, tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, tensor):
                yield v


def byte_spans(space: str, t: Any, start: int) -> list[list[Any]]:
    """The byte ranges of tensor ``t`` (its first element at ``start``) as capture spans: one
    for a contiguous tensor, one per run of contiguous bytes for a strided view (up to
    :data:`RUNS_MAX`), else the hull."""
    nbytes = t.nbytes
    if nbytes == 0:
        return []
    if t.is_contiguous():
        return [[space, start, nbytes]]
    n, item = t.numel(), t.element_size()
    sizes, strides = list(t.shape), list(t.stride())
    if min(strides) >= 0 and 0 not in strides:
        # The trailing dims that lie end to end make one run; the dims before it repeat it.
        k, block = len(sizes), 1
        while k > 0 and strides[k - 1] == block:
            k -= 1
            block *= sizes[k]
        if n // block <= RUNS_MAX:
            return [[space, start + sum(i * st for i, st in zip(index, strides)) * item,
                     block * item] for index in itertools.product(*map(range, sizes[:k]))]
    hi = sum((s - 1) * st for s, st in zip(sizes, strides) if st > 0)
    lo = sum((s - 1) * st for s, st in zip(sizes, strides) if st < 0)
    return [[space, start + lo * item, (hi - lo + 1) * item]]


def what_of(t: Any) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    return f"tensor {dtype}[{', '.join(str(s) for s in t.shape)}]"
