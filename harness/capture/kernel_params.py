"""What a kernel's own declaration says about its parameters: which it reads, which it writes.

A raw CUDA kernel's source says it in C (a pointer to const is read, any other pointer may be
written, a value is neither); an ElementwiseKernel's or ReductionKernel's parameter strings say
it in CuPy's words (outputs and ``_non_const`` inputs are written). Nothing here needs CuPy: the
rules are read, and tested, on text alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

READ, WRITE, VALUE = "read", "write", "value"
"""A kernel parameter's role: a pointer to const, any other pointer, a value."""

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_QUALIFIERS = re.compile(r"\b(?:__restrict__|__restrict|restrict|__grid_constant__|volatile)\b")
_CONST = re.compile(r"\bconst\b")
_OPEN, _CLOSE = "([{<", ")]}>"


def kernel_param_roles(code: str | None, name: str) -> tuple[str, ...] | None:
    """Each parameter's role in the ``__global__`` function ``name`` of the CUDA source
    ``code``: READ for a pointer to const (``const float*``, ``float const*``), WRITE for any
    other pointer, VALUE for a parameter passed by value. None where the source does not say
    (no source, no such kernel, declarations that disagree): the caller then counts the
    kernel's arrays as written, since a missed write hides a race and an extra one does not."""
    if not code:
        return None
    base = kernel_identifier(name)
    text = _COMMENTS.sub(" ", code)
    pattern = r"\b__global__\b[^;{}]*?\b" + re.escape(base) + r"\s*(?:<[^;{}()]*>)?\s*\("
    found: set[tuple[str, ...]] = set()
    for match in re.finditer(pattern, text):
        params = _balanced(text, match.end())
        if params is not None:
            found.add(tuple(param_role(p) for p in split_params(params)))
    return found.pop() if len(found) == 1 else None


def _balanced(text: str, start: int) -> str | None:
    """The text from ``start`` (just past an opening parenthesis) to its closing one."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def split_params(params: str) -> list[str]:
    """A C parameter list split at its top-level commas (``CArray<float, 2> a`` stays whole);
    ``()`` and ``(void)`` have no parameters."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    parts.append(params[start:])
    parts = [p.strip() for p in parts]
    return [] if parts in ([""], ["void"]) else parts


def param_role(decl: str) -> str:
    """READ, WRITE or VALUE for one parameter declaration. Only the pointee of the outermost
    pointer counts: ``float* const p`` writes through p, ``const float* const* p`` does not."""
    decl = _QUALIFIERS.sub(" ", decl.split("=", 1)[0])
    if "*" in decl:
        pointee = decl.rsplit("*", 1)[0].rsplit("*", 1)[-1]
        return READ if _CONST.search(pointee) else WRITE
    if "[" in decl:  # float a[]: a pointer to its element type
        return READ if _CONST.search(decl.split("[", 1)[0]) else WRITE
    return VALUE


def kernel_identifier(name: str) -> str:
    """The identifier a kernel is known by (what ``kernel:NAME`` says): its C++ name without
    namespace, template arguments or Itanium mangling (``_Z5saxpyPKfPf`` is ``saxpy``)."""
    ident = _demangled(name)
    if ident is None:
        ident = name.split("<", 1)[0].split("(", 1)[0].strip().rsplit("::", 1)[-1]
    ident = re.sub(r"\W", "_", ident) or "kernel"
    return "_" + ident if ident[0].isdigit() else ident


def _demangled(name: str) -> str | None:
    """The innermost name of an Itanium-mangled symbol (``_Z4funcIfEvPT_``, ``_ZN2ns4funcEv``)."""
    if not name.startswith("_Z"):
        return None
    i = 2
    nested = name.startswith("N", i)
    i += nested
    last = None
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        last, i = name[j:j + n], j + n
        if not nested:
            break
    return last or None


@dataclass(frozen=True, slots=True)
class ElementwiseParam:
    """One parameter of an ElementwiseKernel/ReductionKernel: ``raw`` ones are indexed freely,
    ``written`` ones are outputs or ``_non_const`` inputs."""

    name: str
    raw: bool
    written: bool


def elementwise_params(text: str, output: bool) -> tuple[ElementwiseParam, ...]:
    """The parameters of an ElementwiseKernel's ``in_params`` or ``out_params`` string, read by
    CuPy's own rules (``[raw] [_non_const] TYPE NAME``, comma-separated)."""
    if not text.strip():
        return ()
    params = []
    for part in text.strip().split(","):
        tokens = part.split()
        if len(tokens) < 2:
            raise ValueError(f"not a kernel parameter: {part!r}")
        keywords = tokens[:-2]
        params.append(ElementwiseParam(tokens[-1], "raw" in keywords,
                                       output or "_non_const" in keywords))
    return tuple(params)


def kernel_params(in_params: Any, out_params: Any) -> tuple[ElementwiseParam, ...] | None:
    """An ElementwiseKernel's parameters, or None where the text is not ours to read (CuPy has
    accepted it already; its arguments are then counted as written)."""
    try:
        return elementwise_params(in_params, False) + elementwise_params(out_params, True)
    except (AttributeError, ValueError):
        return None
