// The point-to-point benchmark kernels of `rshmem perf` (p2p.rs), compiled with the rshmem device
// header (rshmem_device.cuh, prepended by CudaPe::kernel). They use the header's public calls and
// its bulk-copy helpers (rshmemi_bulk_copy_*), the same the header's own block copies use.

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
    if (chunk > 0) rshmemi_bulk_copy_pieces(rshmemi_ptr(dest, pe), src, n, chunk, blockIdx.x, gridDim.x);
    else if (rshmemi_bench_share(n, &lo, &len)) rshmemi_bulk_copy_block(rshmemi_ptr(dest + lo, pe), src + lo, len);
}
extern "C" __global__ void rshmemi_bench_get_bulk(char* dest, const char* src, rshmem_u64 n, int pe, rshmem_u64 chunk) {
    rshmem_u64 lo, len;
    if (chunk > 0) rshmemi_bulk_copy_pieces(dest, rshmemi_ptr(src, pe), n, chunk, blockIdx.x, gridDim.x);
    else if (rshmemi_bench_share(n, &lo, &len)) rshmemi_bulk_copy_block(dest + lo, rshmemi_ptr(src + lo, pe), len);
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
// Put-with-signal with the flag in the data (rshmem_putmem_signal_ll_warp): a warp's ping-pong
// of `bytes`-byte messages through the symmetric LL area `area`, the receiver copying each
// message out (rshmem_signal_wait_ll_warp) before it replies.
extern "C" __global__ void rshmemi_bench_pingpong_ll(char* area, char* buf, int bytes, int iters, int role, int peer) {
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    for (int i = 1; i <= iters; i++) {
        if (role == 0) {
            rshmem_putmem_signal_ll_warp(area, buf, bytes, (unsigned)i, peer);
            if (!rshmem_signal_wait_ll_warp(area, buf, bytes, (unsigned)i)) return;
        } else {
            if (!rshmem_signal_wait_ll_warp(area, buf, bytes, (unsigned)i)) return;
            rshmem_putmem_signal_ll_warp(area, buf, bytes, (unsigned)i, peer);
        }
    }
}
extern "C" __global__ void rshmemi_bench_barrier(int iters) {
    for (int i = 0; i < iters; i++) rshmem_sync_all_block();
}
