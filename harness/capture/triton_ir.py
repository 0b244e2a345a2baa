"""Which pointer arguments a Triton kernel reads and which it writes, from its TTIR.

A Triton kernel is handed bare pointers: the launch says nothing of what it does with them.
Its compiled Triton IR (``CompiledKernel.asm["ttir"]``, MLIR text) does: every global memory
access is an op whose first operand is the address (``tt.load``, ``tt.store``,
``tt.atomic_rmw``, ``tt.atomic_cas``, a tensor descriptor's load or store), and every address
is computed from the kernel's parameters by ops whose operands name the values they come from.

:func:`kernel_access` follows that data flow, per function, to a fixed point: a value comes
from every parameter any of its operands comes from (an ``scf.if`` or a loop's carried value
from all of its branches' yields), and a call to a ``noinline`` helper reads and writes what
the helper does with the arguments passed. That is conservative: a pointer chosen between two
parameters is taken to be both, so a store through it writes both; an op that might write
through a pointer and is none of the above (inline assembly) writes every parameter its
operands come from. A parameter that no access's address comes from is neither read nor
written. What cannot be parsed raises :class:`UnreadableIR`, and the caller takes every
pointer as read and written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

_VALUE = re.compile(r"%[\w.$-]+")
_DEFS = re.compile(r"^((?:%[\w.$-]+(?::\d+)?)(?:\s*,\s*%[\w.$-]+(?::\d+)?)*)\s*=\s*(.*)$")
_FUNC = re.compile(r"^tt\.func\s+(?:(public|private)\s+)?@([\w.$-]+)\s*\(")
_CALL = re.compile(r"\btt\.call\s+@([\w.$-]+)\s*\(([^)]*)\)")
_BLOCK_ARGS = re.compile(r"^\^bb\d+\((.*)\):$")


class UnreadableIR(ValueError):
    """The TTIR is not in a shape this reader follows: take every pointer as read and
    written."""


class KernelAccess(NamedTuple):
    """A kernel's parameters as its TTIR has them (its constexpr parameters are not among
    them), which are pointers, and which of those it reads and writes."""

    name: str
    params: tuple[str, ...]
    pointers: tuple[str, ...]
    read: frozenset[str]
    written: frozenset[str]


class _Func(NamedTuple):
    name: str
    public: bool
    params: tuple[str, ...]
    pointers: tuple[bool, ...]
    lines: tuple[str, ...]


def kernel_access(ttir: str) -> KernelAccess:
    """What the module's public kernel reads and writes through its pointer parameters."""
    funcs = _functions(_without_locations(ttir))
    kernels = [f for f in funcs.values() if f.public]
    if len(kernels) != 1:
        raise UnreadableIR(f"{len(kernels)} public functions in the module, not one")
    summaries: dict[str, tuple[frozenset[int], frozenset[int]]] = {
        name: (frozenset(), frozenset()) for name in funcs}
    for _ in range(len(funcs) + 1):  # helpers first become known, then their callers
        changed = False
        for func in funcs.values():
            found = _accesses(func, summaries)
            if found != summaries[func.name]:
                summaries[func.name], changed = found, True
        if not changed:
            break
    kernel = kernels[0]
    read, written = summaries[kernel.name]
    pointers = tuple(p for p, is_ptr in zip(kernel.params, kernel.pointers) if is_ptr)
    names = tuple(p.lstrip("%") for p in kernel.params)
    return KernelAccess(kernel.name, names, tuple(p.lstrip("%") for p in pointers),
                        frozenset(names[i] for i in read if kernel.pointers[i]),
                        frozenset(names[i] for i in written if kernel.pointers[i]))


def _without_locations(text: str) -> str:
    """The text without its ``loc(...)`` annotations and ``#loc`` definitions."""
    out = []
    for line in text.splitlines():
        if line.startswith("#loc"):
            continue
        while (at := line.find(" loc(")) >= 0:
            depth, end = 0, at + 4
            for end in range(at + 4, len(line)):
                depth += {"(": 1, ")": -1}.get(line[end], 0)
                if depth == 0:
                    break
            line = line[:at] + line[end + 1:]
        out.append(line.strip())
    return "\n".join(out)


def _split_top(text: str) -> Iterator[str]:
    """``text`` split at its commas outside brackets."""
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        elif ch == "," and depth == 0:
            yield text[start:i].strip()
            start = i + 1
    if text[start:].strip():
        yield text[start:].strip()


def _functions(text: str) -> dict[str, _Func]:
    funcs: dict[str, _Func] = {}
    current: tuple[str, bool, list[str], list[bool]] | None = None
    body: list[str] = []
    for line in text.splitlines():
        head = _FUNC.match(line)
        if head:
            if current is not None:
                funcs[current[0]] = _Func(current[0], current[1], tuple(current[2]),
                                          tuple(current[3]), tuple(body))
            start = head.end()
            depth, end = 1, start
            for end in range(start, len(line)):
                depth += {"(": 1, ")": -1}.get(line[end], 0)
                if depth == 0:
                    break
            names, pointers = [], []
            for param in _split_top(line[start:end]):
                name, _, kind = param.partition(":")
                if not name.strip().startswith("%"):
                    raise UnreadableIR(f"a parameter that is not a value: {param!r}")
                names.append(name.strip())
                pointers.append("!tt.ptr" in kind or "tensordesc" in kind)
            current, body = (head.group(2), head.group(1) == "public", names, pointers), []
        elif current is not None:
            body.append(line)
    if current is not None:
        funcs[current[0]] = _Func(current[0], current[1], tuple(current[2]),
                                  tuple(current[3]), tuple(body))
    if not funcs:
        raise UnreadableIR("no tt.func in the module")
    return funcs


def _op_name(rhs: str) -> str:
    return rhs.split(None, 1)[0] if rhs else ""


def _refs(text: str) -> list[str]:
    return [v.split("#")[0] for v in _VALUE.findall(text)]


def _accesses(func: _Func, summaries: dict[str, tuple[frozenset[int], frozenset[int]]]
              ) -> tuple[frozenset[int], frozenset[int]]:
    """The parameters (by position) ``func`` reads and writes through, given its callees'."""
    origins: dict[str, set[int]] = {p: {i} for i, p in enumerate(func.params)}

    def of(values: list[str]) -> set[int]:
        out: set[int] = set()
        for v in values:
            out |= origins.get(v, set())
        return out

    read: set[int] = set()
    written: set[int] = set()
    for _ in range(len(func.lines) + 2):  # loops carry values back: to a fixed point
        before = {k: len(v) for k, v in origins.items()}
        # Per open region: the values its yields flow into, and what its op was given.
        regions: list[tuple[list[str], list[str]]] = []
        for line in func.lines:
            if line.startswith("}"):
                if regions and not line.endswith("{"):
                    regions.pop()
                continue
            block = _BLOCK_ARGS.match(line)
            if block:  # a region's own arguments: from what its op was given
                targets, given = regions[-1] if regions else ([], [])
                for arg in _refs(block.group(1)):
                    origins.setdefault(arg, set()).update(of([*targets, *given]))
                continue
            defs_match = _DEFS.match(line)
            defs = [d.split(":")[0] for d in _refs(defs_match.group(1))] if defs_match else []
            rhs = defs_match.group(2) if defs_match else line
            name = _op_name(rhs)
            refs = _refs(rhs)
            # Values the rhs defines itself (a loop's induction variable, its iter_args).
            bound = [m.split("=")[0].strip() for m in re.findall(r"%[\w.$-]+\s*=", rhs)]
            used = [r for r in refs if r not in bound]
            if name in ("scf.yield", "scf.condition", "tt.reduce.return", "tt.scan.return"):
                if regions:
                    for target in regions[-1][0]:
                        origins.setdefault(target, set()).update(of(used))
                continue
            loads = "load" in name or "gather" in name or "atomic" in name
            for d in [*defs, *bound]:
                # What a load returns is data, not an address into the memory it read (a
                # histogram's bins indexed by loaded values are the bins' pointer only).
                origins.setdefault(d, set()).update(set() if loads else of(used))
            if line.endswith("{") or line.endswith("({"):
                regions.append(([*defs, *bound], used))
            call = _CALL.search(rhs)
            if call:
                callee = summaries.get(call.group(1))
                if callee is None:
                    raise UnreadableIR(f"a call to a function not in the module: {call.group(1)}")
                args = _refs(call.group(2))
                for i in callee[0]:
                    if i < len(args):
                        read |= of([args[i]])
                for i in callee[1]:
                    if i < len(args):
                        written |= of([args[i]])
                continue
            address = of(used[:1])
            if "atomic" in name:
                read |= address
                written |= address
            elif "store" in name or "scatter" in name or name.startswith("tt.descriptor_reduce"):
                written |= address
            elif "load" in name or "gather" in name or name == "tt.prefetch":
                read |= address
            elif "inline_asm" in name or "extern" in name:
                # It may write through any pointer it is given: every one, read and written.
                read |= of(used)
                written |= of(used)
        if {k: len(v) for k, v in origins.items()} == before:
            break
    return frozenset(read), frozenset(written)
