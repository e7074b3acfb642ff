// rshmem's own kernels, compiled together with rshmem_device.cuh.

// Host-API atomics: one thread performs `op` on the word at `addr` (a peer's address as mapped
// on this GPU) and stores the old value in `out`. Ops: 0 fetch, 1 set, 2 swap, 3 compare-swap,
// 4 fetch-add, 5 fetch-and, 6 fetch-or, 7 fetch-xor.
extern "C" __global__ void rshmemi_host_amo(rshmem_u64 addr, int wide, int op, rshmem_u64 a,
                                            rshmem_u64 b, rshmem_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_u64 old = 0;
    if (wide) {
        unsigned long long* p = (unsigned long long*)addr;
        switch (op) {
        case 0: old = rshmemi_ld_acquire((const rshmem_u64*)p); break;
        case 1: rshmemi_st_release((rshmem_u64*)p, a); break;
        case 2: old = atomicExch_system(p, a); break;
        case 3: old = atomicCAS_system(p, a, b); break;
        case 4: old = atomicAdd_system(p, a); break;
        case 5: old = atomicAnd_system(p, a); break;
        case 6: old = atomicOr_system(p, a); break;
        default: old = atomicXor_system(p, a); break;
        }
    } else {
        unsigned* p = (unsigned*)addr;
        unsigned x = (unsigned)a, y = (unsigned)b;
        switch (op) {
        case 0: old = rshmemi_ld_acquire32(p); break;
        case 1: rshmemi_st_release32(p, x); break;
        case 2: old = atomicExch_system(p, x); break;
        case 3: old = atomicCAS_system(p, x, y); break;
        case 4: old = atomicAdd_system(p, x); break;
        case 5: old = atomicAnd_system(p, x); break;
        case 6: old = atomicOr_system(p, x); break;
        default: old = atomicXor_system(p, x); break;
        }
    }
    asm volatile("fence.sc.sys;" ::: "memory");
    *out = old;
}

// Stream-ordered signal add into a peer's word (after everything earlier on the stream).
extern "C" __global__ void rshmemi_signal_add(rshmem_u64 addr, rshmem_u64 v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        asm volatile("fence.sc.sys;" ::: "memory");
        rshmemi_red_add_release((rshmem_u64*)addr, v);
    }
}

// Stream-ordered wait for comparisons the stream-memory operations lack.
extern "C" __global__ void rshmemi_wait(rshmem_u64 addr, int cmp, rshmem_u64 v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) rshmemi_wait64((const rshmem_u64*)addr, cmp, v);
}

// Stream barrier: one block synchronises `team` (rshmem uses the reserved stream slot).
extern "C" __global__ void rshmemi_team_sync(rshmem_team team) { rshmem_team_sync_block(team); }

// Takes this PE's error word and the word after it (the PE a timed-out wait named, plus 1) into
// out[0..2], leaving both 0: each with one atomic exchange, so a bit that a running kernel sets
// is either taken here or left for the next take, never cleared unseen. The error word first:
// a flagging wait writes the name before the bit, so at worst a bit set between the two
// exchanges is left without its name (its timeout is reported naming no PE).
extern "C" __global__ void rshmemi_take_error(rshmem_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long* w = (unsigned long long*)rshmemi_err_word();
    out[0] = atomicExch(w, 0ull);
    out[1] = atomicExch(w + 1, 0ull);
}

// ----- benchmarks and their baselines -----

// Block b's contiguous share of `n` bytes (16-byte multiples) in [*lo, *lo + *len): false where
// it has none.
__device__ __forceinline__ bool rshmemi_bench_share(rshmem_u64 n, rshmem_u64* lo, rshmem_u64* len) {
    const rshmem_u64 per = ((n / gridDim.x) + 15) & ~15ull;
    *lo = per * blockIdx.x;
    if (*lo >= n) return false;
    *len = (n - *lo) < per ? (n - *lo) : per;
    return true;
}
// Block-scope put of `n` bytes split over the grid: chunk 0, block b moves its contiguous share;
// else the range in pieces of `chunk` bytes (a multiple of 16), block b taking pieces b,
// b + gridDim.x, ... (every block inside one moving window of the range).
#define RSHMEMI_BENCH_PIECES(CALL)                                                   \
    if (chunk == 0) {                                                                \
        rshmem_u64 lo, len;                                                          \
        if (rshmemi_bench_share(n, &lo, &len)) CALL;                                 \
        return;                                                                      \
    }                                                                                \
    for (rshmem_u64 lo = blockIdx.x * chunk; lo < n; lo += (rshmem_u64)gridDim.x * chunk) { \
        rshmem_u64 len = (n - lo) < chunk ? (n - lo) : chunk;                        \
        CALL;                                                                        \
    }
extern "C" __global__ void rshmemi_bench_put(char* dest, const char* src, rshmem_u64 n, int pe, rshmem_u64 chunk) {
    RSHMEMI_BENCH_PIECES(rshmem_putmem_nbi_block(dest + lo, src + lo, len, pe))
}
extern "C" __global__ void rshmemi_bench_get(char* dest, const char* src, rshmem_u64 n, int pe, rshmem_u64 chunk) {
    RSHMEMI_BENCH_PIECES(rshmem_getmem_nbi_block(dest + lo, src + lo, len, pe))
}
#undef RSHMEMI_BENCH_PIECES
// The same with the bulk-copy engine (TMA) of each block; chunk > 0 a multiple of
// RSHMEMI_BULK_CHUNK (the pieces go through one pipeline per block, not one per piece).
extern "C" __global__ void rshmemi_bench_put_bulk(char* dest, const char* src, rshmem_u64 n, int pe, rshmem_u64 chunk) {
    rshmem_u64 lo, len;
    if (chunk > 0) rshmemi_bulk_copy_pieces(rshmem_ptr(dest, pe), src, n, chunk, blockIdx.x, gridDim.x);
    else if (rshmemi_bench_share(n, &lo, &len)) rshmemi_bulk_copy_block(rshmem_ptr(dest + lo, pe), src + lo, len);
}
extern "C" __global__ void rshmemi_bench_get_bulk(char* dest, const char* src, rshmem_u64 n, int pe, rshmem_u64 chunk) {
    rshmem_u64 lo, len;
    if (chunk > 0) rshmemi_bulk_copy_pieces(dest, rshmem_ptr(src, pe), n, chunk, blockIdx.x, gridDim.x);
    else if (rshmemi_bench_share(n, &lo, &len)) rshmemi_bulk_copy_block(dest + lo, rshmem_ptr(src + lo, pe), len);
}
// Put-with-signal ping-pong (one thread): role 0 sends first; `sig` is symmetric.
extern "C" __global__ void rshmemi_bench_pingpong_signal(char* buf, rshmem_u64* sig, int iters, int role, int peer) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (int i = 1; i <= iters; i++) {
        if (role == 0) {
            rshmem_putmem_signal(buf, buf, 8, sig, (rshmem_u64)i, RSHMEM_SIGNAL_SET, peer);
            rshmemi_wait64(sig, RSHMEM_CMP_GE, (rshmem_u64)i);
        } else {
            rshmemi_wait64(sig, RSHMEM_CMP_GE, (rshmem_u64)i);
            rshmem_putmem_signal(buf, buf, 8, sig, (rshmem_u64)i, RSHMEM_SIGNAL_SET, peer);
        }
    }
}
// Baseline: raw flag ping-pong with volatile stores and __threadfence_system (the probe's).
extern "C" __global__ void rshmemi_bench_pingpong_raw(volatile unsigned* my_flag, volatile unsigned* peer_flag, int iters, int role) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (int i = 1; i <= iters; i++) {
        if (role == 0) {
            *peer_flag = i; __threadfence_system();
            while (*my_flag != (unsigned)i) {}
        } else {
            while (*my_flag != (unsigned)i) {}
            *peer_flag = i; __threadfence_system();
        }
    }
}
extern "C" __global__ void rshmemi_bench_barrier(int iters) {
    for (int i = 0; i < iters; i++) rshmem_sync_all_block();
}
