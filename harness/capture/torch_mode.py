"""What the PyTorch source's dispatch mode must know of PyTorch's own machinery: the stack of
modes it joins, Dynamo's frame hook, activation checkpointing's early stop, composite ops,
tensor subclasses (made and dispatched), and the numbers it hands a mode where an op wants a
tensor.

Each is read here once, version by version: a PyTorch without one of them gets the mode's
plain behaviour, never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType
from typing import Any

from harness.capture.source import Failures
from harness.capture.torch_ops import tensors_in


def enter_beneath(mode: Any) -> None:
    """Enter ``mode`` beneath the dispatch modes already on this thread's stack.

    A watched child starts its capture at its first use of CUDA, which may come inside the
    program's own mode (``with FlopCounterMode(): model(x.cuda())``, a FakeTensorMode). On top,
    the capture's mode would be what the program's ``__exit__`` pops, leaving the program's
    mode on for good. Beneath, the program's modes see each op first, as they would alone, and
    pop themselves."""
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():  # taken off, and put back on top of the capture's
        mode.__enter__()


def exit_from_beneath(mode: Any) -> None:
    """Take ``mode`` off the stack where it is, the modes above it left on."""
    from torch.utils._python_dispatch import (_get_current_dispatch_mode,
                                              _get_current_dispatch_mode_stack, _pop_mode,
                                              _push_mode)
    if not any(m is mode for m in _get_current_dispatch_mode_stack()):
        return
    above = []
    while _get_current_dispatch_mode() is not mode:
        above.append(_pop_mode())
    mode.__exit__(None, None, None)
    for other in reversed(above):
        _push_mode(other)


def dynamo_frame_hook(*entries: CodeType) -> Callable[[Any], Any] | None:
    """PyTorch's setter of Dynamo's frame hook (``set_eval_frame``: it takes the new hook,
    None for none, and gives back the old one), with ``entries`` (the code of the mode's
    ``__torch_dispatch__`` and of the source's other ways in: patched methods, callbacks)
    marked as frames Dynamo never compiles, so that each runs its first line before Dynamo
    sees it and turns the hook off for the rest; None where this PyTorch lacks either, and
    the caller then keeps PyTorch's own wrapper. Both are tried here once, never first inside
    an op."""
    try:
        from torch._C._dynamo.eval_frame import (_FrameAction, _FrameExecStrategy,
                                                 set_code_exec_strategy, set_eval_frame)
        set_eval_frame(set_eval_frame(None))
        for entry in entries:
            set_code_exec_strategy(entry, _FrameExecStrategy(_FrameAction.SKIP,
                                                             _FrameAction.DEFAULT))
    except Exception:  # a PyTorch without Dynamo's C part, or with another one
        return None
    return set_eval_frame  # type: ignore[no-any-return]


def checkpoint_early_stop_off() -> Any:
    """Have activation checkpointing recompute each segment whole; returns what undoes it.

    With the GPU trace on, PyTorch calls into Python at every free, also while an exception
    raised in Python passes through its C++ code, and such a call loses that exception: the op
    then fails with ``SystemError: ... returned NULL without setting an exception``
    (``TORCH_CUDA_SANITIZER=1`` does the same). Non-reentrant checkpointing stops its
    recomputation early by raising from a saved-tensor hook, inside the op that saves. Without
    the early stop it raises nothing; the recomputation runs the rest of the segment, whose
    results it drops, so the program's gradients are the same."""
    try:
        from torch.utils.checkpoint import set_checkpoint_early_stop
        off = set_checkpoint_early_stop(False)
        off.__enter__()
    except Exception:  # an older PyTorch without early stop: nothing to turn off
        return None
    return off


def subclass_made_bare(mode: type) -> Callable[[Any], Any]:
    """The wrapper of ``torch.Tensor.__new__`` (what ``Subclass(tensor)`` calls) that makes the
    subclass with ``mode`` off the stack where it is the current mode.

    PyTorch makes ``Subclass(tensor)`` from an alias of ``tensor``, taken through the
    dispatcher. Under any dispatch mode the alias comes back with a Python object of its own
    (a plain tensor), and PyTorch then refuses to make it the subclass ("the raw Tensor
    object is already associated to a python object of type Tensor"): tensordict's
    MemoryMappedTensor, and any subclass made the documented way, broke under the watch (and
    under PyTorch's own pass-through mode). An alias touches no bytes, so nothing is lost."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode_temporarily

    def make(original: Any) -> Any:
        # (cls, ...) taken as *args: Dynamo checks the signature of torch.Tensor.__new__
        # against its own stand-in's when it is imported, and takes *args, **kwargs for any.
        def new(*args: Any, **kwargs: Any) -> Any:
            if isinstance(_get_current_dispatch_mode(), mode):
                with _pop_mode_temporarily():
                    return original(*args, **kwargs)
            return original(*args, **kwargs)
        return new
    return make


def decomposes(func: Any, guard: Failures) -> frozenset[str]:
    """The devices ("cpu", "cuda") on which the mode runs ``func`` as its decomposition, so that
    each op inside it is seen; none for most ops.

    The mode meets a composite op whole only under ``inference_mode``: elsewhere autograd's
    dispatch key has decomposed it already. Most are watched whole, as their schemas say (their
    arguments read, their results written), and run as the dispatcher runs them: run inside
    the mode, a decomposition takes the paths PyTorch keeps for tensor subclasses (``svdvals``
    then works out U and V too), which round differently. The exception is an op whose schema
    says it may return its input (``.to()``, ``reshape``, ``contiguous``): whether it copied
    cannot be told from outside, and its copy may read pinned memory on a stream.

    Such an op is decomposed on a device where PyTorch decomposes it: one with no kernel of its
    own for the device and no CompositeExplicitAutograd one (the dispatcher takes those
    first), counting only kernels registered in C++, which are what it runs."""
    import torch
    keys = torch._C.DispatchKey
    try:
        if not any(r.alias_info is not None and not r.alias_info.is_write
                   for r in func._schema.returns):
            return frozenset()  # (an out= form's writes are marked: watched whole)
        name = func.name()

        def has(key: Any) -> bool:
            return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))

        if not has(keys.CompositeImplicitAutograd) or has(keys.CompositeExplicitAutograd) or \
                has(keys.CompositeExplicitAutogradNonFunctional):
            return frozenset()
        return frozenset(device for device, key in (("cpu", keys.CPU), ("cuda", keys.CUDA))
                         if not has(key))
    except Exception as exc:  # an op PyTorch cannot say this of: watched whole
        guard.failed(f"the kernels of {func}", exc)
        return frozenset()


def decompose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func``'s C++ CompositeImplicitAutograd kernel, as the dispatcher would without the
    mode; the ops it calls come back through the dispatcher, so the mode sees each. Not
    ``func.decompose``: that takes a decomposition written in Python first where PyTorch has
    one."""
    import torch
    op_dk = getattr(func, "_op_dk", None)
    if op_dk is None:  # a PyTorch without it: its own way, the Python decomposition first
        return func.decompose(*args, **kwargs)
    return op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def dense_device_of(args: tuple[Any, ...], tensor: type) -> str | None:
    """The device ("cpu", "cuda") whose dense kernels the dispatcher picks for an op's tensor
    arguments; None where it has none, or where one is of a kind with kernels of its own
    (nested, sparse, quantized, MKL-DNN, meta), which the dispatcher picks by that kind: a
    nested tensor's ``chunk`` is its own, and its decomposition calls ``split``, which nested
    tensors lack."""
    import torch
    keys, cpu, cuda = torch._C._dispatch_keys, torch._C.DispatchKey.CPU, \
        torch._C.DispatchKey.CUDA
    device = None
    for value in args:
        for t in tensors_in(value, tensor):
            held = keys(t)
            kind = "cuda" if held.has(cuda) else "cpu" if held.has(cpu) else None
            if kind is None:
                return None
            device = device or kind
    return device


# The dtypes PyTorch gives a Python number it wraps as a tensor (bool before int: a bool is one).
_WRAPPED = ((bool, "bool"), (int, "int64"), (float, "float64"), (complex, "complex128"))


def _wrapped(value: Any, torch: Any) -> Any:
    """The tensor PyTorch makes of ``value`` where it is a Python number; None otherwise."""
    for kind, dtype in _WRAPPED:
        if isinstance(value, kind):
            return torch.scalar_tensor(value, dtype=getattr(torch, dtype))
    return None


def numbers_as_tensors(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
                       ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``args`` and ``kwargs`` with each Python number that stands where ``func``'s schema wants
    a tensor made the 0-dim CPU tensor PyTorch would have made of it; None where there is none.

    PyTorch hands a mode a wrapped number (a number it made a tensor, such as a constant of a
    ``torch.jit.trace`` graph) as a Python number, and ops outside arithmetic then refuse it:
    "aten::view() Expected a value of type 'Tensor' for argument 'self' but instead found type
    'int'" (pytorch/pytorch#124731). Under any dispatch mode, PyTorch's own pass-through one
    too, a traced torch_geometric layer failed so. Arithmetic ops take the number as it is, so
    an error of theirs is their own: for them, and on a PyTorch that cannot say which they
    are, None. Elsewhere the tensor made differs from the wrapped one only where type
    promotion meets it beside 0-dim tensors alone."""
    import torch
    try:
        schema = getattr(func, "_schema", None)  # a higher-order op has none
        takes_numbers = getattr(torch._C, "_should_allow_numbers_as_tensors", None)
        if schema is None or takes_numbers is None or \
                takes_numbers(schema.name.rpartition("::")[2]):
            return None  # an op that takes numbers as they are: its error is its own
        listed, named, mended = list(args), dict(kwargs or {}), False
        for index, arg in enumerate(schema.arguments):
            wants = arg.type
            if isinstance(wants, torch._C.OptionalType):
                wants = wants.getElementType()
            if not isinstance(wants, torch._C.TensorType):
                continue
            positional = not arg.kwarg_only and index < len(listed)
            made = _wrapped(listed[index] if positional else named.get(arg.name), torch)
            if made is None:
                continue
            if positional:
                listed[index] = made
            else:
                named[arg.name] = made
            mended = True
        return (tuple(listed), named) if mended else None
    except Exception:  # never an error of the watch's in place of the program's
        return None


def subclass_handles(types: Any, mode_backed: tuple[type, ...]) -> bool | None:
    """Who runs an op on tensor subclasses (``types``): True, the subclass (a wrapper such as
    DTensor unwraps itself and runs plain ops, which the mode then sees); False, the op as it
    is, unread (fake and functional tensors exist only under their own modes); None, the mode
    (no type among them overrides ``__torch_dispatch__``)."""
    import torch
    plain = torch.Tensor.__torch_dispatch__
    overriding = [t for t in types if getattr(t, "__torch_dispatch__", plain) is not plain]
    if not overriding:
        return None
    return not any(issubclass(t, mode_backed) for t in overriding)


def mode_backed_tensors() -> tuple[type, ...]:
    """The tensor subclasses that exist only under a mode of their own (fake, functional)."""
    found: list[type] = []
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        found.append(FakeTensor)
    except Exception:  # an older or trimmed PyTorch: none to allow for
        pass
    try:
        from torch._subclasses.functional_tensor import FunctionalTensor
        found.append(FunctionalTensor)
    except Exception:
        pass
    return tuple(found)
