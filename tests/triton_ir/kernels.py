"""Triton kernels whose TTIR tests/test_triton_ir.py reads. Run with an interpreter that has
Triton (no GPU needed: TTIR is made before any code for a device), it writes NAME.ttir for each
into the folder it is given, as Triton's compiler makes it for an sm_90 target:

    python tests/triton_ir/kernels.py tests/triton_ir

Each kernel is one way a kernel reaches memory: loads and a store, in place, a pointer carried
through a loop, an atomic at loaded indices, a store in a noinline helper, a pointer chosen
between two, tensor descriptors.
"""

import sys

import triton
import triton.language as tl
from triton._C.libtriton import ir
from triton.backends import backends
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m),
             mask=m)


@triton.jit
def scale_inplace(x_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)


@triton.jit
def rowsum_loop(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    p = x_ptr + row * cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        offs = tl.arange(0, BLOCK)
        acc += tl.load(p + offs, mask=start + offs < cols, other=0.0)
        p += BLOCK
    tl.store(out_ptr + row, tl.sum(acc))


@triton.jit
def histogram(x_ptr, hist_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.atomic_add(hist_ptr + tl.load(x_ptr + offs, mask=m), 1, mask=m)


@triton.jit(noinline=True)
def _put(dst, i, v):
    tl.store(dst + i, v)


@triton.jit
def copy_via_helper(src_ptr, dst_ptr, n):
    i = tl.program_id(0)
    _put(dst_ptr, i, tl.load(src_ptr + i))


@triton.jit
def pick(a_ptr, b_ptr, n, use_a, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dst = a_ptr if use_a else b_ptr
    tl.store(dst + offs, 1.0, mask=offs < n)


@triton.jit
def desc_copy(src_ptr, dst_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    src = tl.make_tensor_descriptor(src_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    dst = tl.make_tensor_descriptor(dst_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    dst.store([0, 0], src.load([0, 0]))


F32 = {"n": "i32", "BLOCK": "constexpr"}
KERNELS = {
    "add": (add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", **F32}),
    "scale_inplace": (scale_inplace, {"x_ptr": "*fp32", "n": "i32", "s": "fp32",
                                      "BLOCK": "constexpr"}),
    "rowsum_loop": (rowsum_loop, {"x_ptr": "*fp32", "out_ptr": "*fp32", "cols": "i32",
                                  "BLOCK": "constexpr"}),
    "histogram": (histogram, {"x_ptr": "*i32", "hist_ptr": "*i32", **F32}),
    "copy_via_helper": (copy_via_helper, {"src_ptr": "*fp32", "dst_ptr": "*fp32", "n": "i32"}),
    "pick": (pick, {"a_ptr": "*fp32", "b_ptr": "*fp32", "use_a": "i1", **F32}),
    "desc_copy": (desc_copy, {"src_ptr": "*fp16", "dst_ptr": "*fp16", "M": "i32", "N": "i32",
                              "BM": "constexpr", "BN": "constexpr"}),
}
CONSTEXPRS = {"BLOCK": 128, "BM": 64, "BN": 64}


def ttir(fn, signature) -> str:
    backend = backends["nvidia"].compiler(TARGET)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    constexprs = {k: v for k, v in CONSTEXPRS.items() if k in signature}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return str(source.make_ir(TARGET, options, backend.get_codegen_implementation(options),
                              backend.get_module_map(), context))


def main(folder: str) -> None:
    for name, (fn, signature) in KERNELS.items():
        with open(f"{folder}/{name}.ttir", "w") as out:
            out.write(ttir(fn, signature))
    print(triton.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
