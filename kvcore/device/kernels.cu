// kvcore's device kernels, compiled at run time by NVRTC through CuPy (kvcore/device/cuda.py).
// Their meaning is defined once, by the records in kvcore/device/kernels.py; sim.py runs the
// same records in numpy. Pointers arrive as unsigned long long so that CuPy passes them as
// plain 64-bit values whatever Python object held them.

// NVRTC cannot include <assert.h>; this is the function assert() expands to.
extern "C" __device__ void __assertfail(const char* message, const char* file, unsigned line,
                                        const char* function, size_t char_size);

typedef unsigned char u8;
typedef unsigned long long u64;

extern "C" __global__ void kv_fill(u64 dst, u64 nbytes, unsigned value) {
    u8* d = reinterpret_cast<u8*>(dst);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes; i += stride) {
        d[i] = (u8)value;
    }
}

extern "C" __global__ void kv_verify(u64 src, u64 nbytes, unsigned expected, u64 result) {
    const u8* s = reinterpret_cast<const u8*>(src);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    int bad = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes; i += stride) {
        bad += s[i] != (u8)expected;
    }
    if (bad) {
        atomicAdd(reinterpret_cast<int*>(result), bad);
    }
}

// The reader every attention kernel embodies: each execution-table entry must name a page in
// range whose generation is current. ninfer's device.cu:132 asserted exactly this.
extern "C" __global__ void kv_read_table(u64 table, int entries, u64 generations, int num_pages,
                                         u64 result, int assert_on_stale) {
    const int* t = reinterpret_cast<const int*>(table);
    // The generation mirror is pinned host memory that the host updates while kernels run;
    // volatile makes every read go to memory instead of a cached copy.
    const volatile int* g = reinterpret_cast<const volatile int*>(generations);
    int bad = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < entries; i += gridDim.x * blockDim.x) {
        const int page = t[2 * i];
        const int generation = t[2 * i + 1];
        const bool stale = page < 0 || page >= num_pages || g[page] != generation;
        if (stale) {
            if (assert_on_stale) {
                __assertfail("execution-table entry names a page out of range or stale",
                             "kernels.cu", 132, "kv_read_table", sizeof(char));
            }
            ++bad;
        }
    }
    if (bad) {
        atomicAdd(reinterpret_cast<int*>(result), bad);
    }
}

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Occupies its stream for `ns` nanoseconds of wall-clock time (%globaltimer, which does not
// drift with the SM clock the way a clock64 count does: a count calibrated while the GPU idled at
// 345 MHz spun 5x shorter once it boosted). ns < 0 never ends (a hung kernel): it waits on a
// flag nobody sets, so the compiler cannot prove the loop empty.
extern "C" __global__ void kv_delay(long long ns, u64 never_flag) {
    if (ns < 0) {
        const volatile int* flag = reinterpret_cast<const volatile int*>(never_flag);
        while (*flag == 0) {
        }
        return;
    }
    const u64 start = global_ns();
    while (global_ns() - start < (u64)ns) {
    }
}

// A kernel of a scenario's own over any memory (kvcore's Touch, `op: kernel`): it runs for `ns`
// nanoseconds of wall-clock time, then reads every byte of its read spans and writes `value`
// over every byte of its write spans; value 0x100 (TOUCH_READ_VALUE) writes the first byte it
// read instead, a result computed from its input. Spans are (address, length) pairs, device or
// mapped pinned memory, eight of each (unused ones have length 0). The reads are volatile
// loads: the access itself is the point, and the compiler must keep it.
#define KV_SPANS(p) u64 p##0, u64 p##n0, u64 p##1, u64 p##n1, u64 p##2, u64 p##n2, \
    u64 p##3, u64 p##n3, u64 p##4, u64 p##n4, u64 p##5, u64 p##n5, u64 p##6, u64 p##n6, \
    u64 p##7, u64 p##n7
#define KV_ADDRS(p) {p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7}
#define KV_LENS(p) {p##n0, p##n1, p##n2, p##n3, p##n4, p##n5, p##n6, p##n7}

extern "C" __global__ void kv_touch(KV_SPANS(r), KV_SPANS(w), unsigned value, long long ns) {
    if (ns > 0) {
        const u64 start = global_ns();
        while (global_ns() - start < (u64)ns) {
        }
    }
    const u64 raddr[8] = KV_ADDRS(r), rlen[8] = KV_LENS(r);
    const u64 waddr[8] = KV_ADDRS(w), wlen[8] = KV_LENS(w);
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (int s = 0; s < 8; ++s) {
        const volatile u8* src = reinterpret_cast<const volatile u8*>(raddr[s]);
        for (u64 i = first; i < rlen[s]; i += stride) {
            (void)src[i];
        }
    }
    const u8 out = value < 0x100 ? (u8)value
                                 : *reinterpret_cast<const volatile u8*>(raddr[0]);
    for (int s = 0; s < 8; ++s) {
        u8* dst = reinterpret_cast<u8*>(waddr[s]);
        for (u64 i = first; i < wlen[s]; i += stride) {
            dst[i] = out;
        }
    }
}

// Moves `pieces` chunks of `chunk` bytes between a packed buffer and scattered offsets of a
// paged buffer: to_pages=1 scatters packed -> pages, 0 gathers pages -> packed. One block per
// chunk at a time, 16-byte moves when everything is 16-byte aligned.
extern "C" __global__ void kv_move_pages(u64 packed, u64 paged, u64 offsets, int pieces,
                                         u64 chunk, int to_pages) {
    const long long* off = reinterpret_cast<const long long*>(offsets);
    const bool wide = ((packed | paged | chunk) & 15) == 0;
    for (int p = blockIdx.x; p < pieces; p += gridDim.x) {
        u8* pk = reinterpret_cast<u8*>(packed) + (u64)p * chunk;
        u8* pg = reinterpret_cast<u8*>(paged) + off[p];
        if (wide && (off[p] & 15) == 0) {
            uint4* a = reinterpret_cast<uint4*>(pk);
            uint4* b = reinterpret_cast<uint4*>(pg);
            for (u64 i = threadIdx.x; i < chunk / 16; i += blockDim.x) {
                if (to_pages) { b[i] = a[i]; } else { a[i] = b[i]; }
            }
        } else {
            for (u64 i = threadIdx.x; i < chunk; i += blockDim.x) {
                if (to_pages) { pg[i] = pk[i]; } else { pk[i] = pg[i]; }
            }
        }
    }
}
