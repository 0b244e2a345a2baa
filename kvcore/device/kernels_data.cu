// Kernels that follow a table row to the KV pages (RowKernel in kvcore/device/kernels.py):
// where they read and write depends on what they read. Compiled apart from kernels.cu, so that
// the harness's own kernels do not depend on these.

extern "C" __device__ void __assertfail(const char* message, const char* file, unsigned line,
                                        const char* function, size_t char_size);

typedef unsigned char u8;
typedef unsigned long long u64;

// attention: every byte of every page the row names must be `expected` (the owner's data).
__device__ void attention_mismatch() {
    __assertfail("attention read a page holding another owner's bytes", "kernels_data.cu",
                 17, "kv_attention", sizeof(char));
}

// One block per entry (a page); the row is read where the kernel runs, as an attention or
// KV-write kernel reads its block table.
extern "C" __global__ void kv_write_pages(u64 table, int entries, u64 pages, u64 stride,
                                          int num_pages, unsigned value) {
    const int* t = reinterpret_cast<const int*>(table);
    for (int e = blockIdx.x; e < entries; e += gridDim.x) {
        const int page = t[2 * e];
        if (page < 0 || page >= num_pages) {
            continue;
        }
        u8* p = reinterpret_cast<u8*>(pages) + (u64)page * stride;
        for (u64 i = threadIdx.x; i < stride; i += blockDim.x) {
            p[i] = (u8)value;
        }
    }
}

// `first` (0: none) keeps the first page found wrong: atomicMin of entry << 40 | page << 8 |
// byte, so the lowest entry, its page and the smallest other byte there (FIRST_BYTES in
// kernels.py).
extern "C" __global__ void kv_attention(u64 table, int entries, u64 pages, u64 stride,
                                        int num_pages, unsigned expected, u64 result,
                                        int assert_on_mismatch, u64 first) {
    const int* t = reinterpret_cast<const int*>(table);
    int bad = 0;
    for (int e = blockIdx.x; e < entries; e += gridDim.x) {
        const int page = t[2 * e];
        if (page < 0 || page >= num_pages) {
            continue;
        }
        const u8* p = reinterpret_cast<const u8*>(pages) + (u64)page * stride;
        unsigned smallest = 256;
        for (u64 i = threadIdx.x; i < stride; i += blockDim.x) {
            if (p[i] != (u8)expected) {
                bad += 1;
                smallest = p[i] < smallest ? p[i] : smallest;
            }
        }
        if (first && smallest < 256) {
            atomicMin(reinterpret_cast<u64*>(first),
                      ((u64)e << 40) | ((u64)(unsigned)page << 8) | (u64)smallest);
        }
    }
    if (bad) {
        if (assert_on_mismatch) {
            attention_mismatch();
        }
        atomicAdd(reinterpret_cast<int*>(result), bad);
    }
}

// gather (to_pages = 0): every page the row names to the entry's page of `packed`;
// scatter (to_pages = 1): the entry's page of `packed` into the page the row names.
extern "C" __global__ void kv_move_row_pages(u64 table, int entries, u64 pages, u64 stride,
                                             int num_pages, u64 packed, int to_pages) {
    const int* t = reinterpret_cast<const int*>(table);
    for (int e = blockIdx.x; e < entries; e += gridDim.x) {
        const int page = t[2 * e];
        if (page < 0 || page >= num_pages) {
            continue;
        }
        u8* p = reinterpret_cast<u8*>(pages) + (u64)page * stride;
        u8* q = reinterpret_cast<u8*>(packed) + (u64)e * stride;
        for (u64 i = threadIdx.x; i < stride; i += blockDim.x) {
            if (to_pages) {
                p[i] = q[i];
            } else {
                q[i] = p[i];
            }
        }
    }
}
