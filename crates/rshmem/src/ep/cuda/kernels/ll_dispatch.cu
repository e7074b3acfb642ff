// Low-latency MoE dispatch (rshmem::cuda::ep::LowLatencyBuffer; the design is in ep/cuda/ll.rs).
// Areas are indexed by the call's half h (0 or 1, alternating on the host) so two micro-batches
// may be in flight; team member d is world PE start + d * stride.

// Must match `ll_param_words` in ep/cuda/ll.rs (u64 words, in order).
struct ll_params {
    unsigned long long stage;   // [2][n][M][row_bytes]: rows from each source, at their token index
    unsigned long long meta;    // [2][n][M][k] int: each source token's k expert ids (-1: none)
    unsigned long long dflag;   // [2][n] u64: source s's dispatch of half h is in (its T + 1), 0 else
    unsigned long long recv_x;  // [2][L][n*M][H] bf16 (fp8: [L][n*M][H] bytes then [L][n*M][H/128] f32)
    unsigned long long count;   // [2][L] int
    unsigned long long src;     // [2][L][n*M] int: source PE * M + source token
    unsigned long long layout;  // [2][L][n][2] int: (first row, rows) per (local expert, source)
    unsigned long long comb;    // [2][M][k][H] bf16: expert rows back at their source, per (token, slot)
    unsigned long long cflag;   // [2][n] u64: member d's combine rows of half h are in (1), 0 else
    unsigned long long my_ids;  // [2][M][k] int: this PE's dispatched ids (invalid ones as -1)
    unsigned long long ctl;     // [16] u64: LL_CTL_*
    unsigned long long n, me, start, stride, M, H, k, L, E;
};

#define LL_CTL_ERR 0
#define LL_CTL_INFO 1
// Block tickets per kernel and half: dispatch send, dispatch receive, combine send, combine receive.
#define LL_CTL_TICKET 2
#define LL_ERR_MINE 1ull
// Threads per block of every LL kernel (the host launches this many).
#define LL_BLOCK 256
#define LL_MAX_TOPK 32

__device__ __forceinline__ int ll_pe(const ll_params* P, long long d) { return (int)(P->start + d * P->stride); }
__device__ __forceinline__ unsigned long long* ll_ctl(const ll_params* P) { return (unsigned long long*)P->ctl; }

// Bytes between staged rows: a bf16 row, which also holds an e4m3 row (H bytes) followed by its
// scales (one f32 per 128 elements), 16-byte aligned either way.
__device__ __forceinline__ long long ll_row_bytes(const ll_params* P) { return (long long)P->H * 2; }

// Every block, at its end: the last of the grid's blocks (ticket `which` of half h) runs `last`
// in thread 0 after the other blocks' stores are fenced system-wide. Returns true in that thread.
__device__ __forceinline__ bool ll_last_block(const ll_params* P, int which, int h) {
    __syncthreads();
    __shared__ unsigned s_last;
    if (threadIdx.x == 0) {
        asm volatile("fence.sc.sys;" ::: "memory");
        unsigned long long* t = ll_ctl(P) + LL_CTL_TICKET + 2 * which + h;
        const unsigned long long v = atomicAdd(t, 1ull);
        s_last = v == gridDim.x - 1;
        if (s_last) {
            *t = 0;
            asm volatile("fence.sc.sys;" ::: "memory");
        }
    }
    __syncthreads();
    return threadIdx.x == 0 && s_last;
}

// Waits (the block) until flag word s of `flags` (half h's group of n) is non-zero for every
// member s < upto; false when a wait timed out (this PE's device error flag is set then).
__device__ __forceinline__ bool ll_wait_flags(const ll_params* P, const unsigned long long* flags, int upto) {
    __shared__ int s_ok;
    for (int s = threadIdx.x; s < upto; s += blockDim.x) rshmemi_wait64(flags + s, RSHMEM_CMP_NE, 0, ll_pe(P, s));
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        s_ok = !rshmemi_failed();
    }
    __syncthreads();
    // One verdict for the whole block (the error word may change while threads read it).
    const bool ok = s_ok;
    __syncthreads();
    return ok;
}

// e4m3 of two floats (round to nearest, saturating): a in the high byte, b in the low one.
__device__ __forceinline__ unsigned short ll_e4m3x2(float a, float b) {
    unsigned short r;
    asm("{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, %1, %2; mov.b16 %0, t; }" : "=h"(r) : "f"(a), "f"(b));
    return r;
}

// Thread `tid` of `nth` copies its share of `nv` 16-byte vectors from `src` to `dst`, loading
// LL_BATCH of them before storing any (the loads overlap instead of each waiting for the store
// before it).
#define LL_BATCH 8
__device__ __forceinline__ void ll_copy(uint4* dst, const uint4* src, long long nv, unsigned tid, unsigned nth) {
    for (long long v0 = tid; v0 < nv; v0 += (long long)nth * LL_BATCH) {
        uint4 r[LL_BATCH];
#pragma unroll
        for (int q = 0; q < LL_BATCH; q++) {
            const long long v = v0 + (long long)q * nth;
            if (v < nv) r[q] = src[v];
        }
#pragma unroll
        for (int q = 0; q < LL_BATCH; q++) {
            const long long v = v0 + (long long)q * nth;
            if (v < nv) dst[v] = r[q];
        }
    }
}

// Send side (grid of any size, LL_BLOCK threads): for each of this PE's T tokens, its ids are
// checked (an id outside -1, 0..E is taken as -1 and latches LL_ERR_MINE) and kept in my_ids;
// its ids go to every member's meta (row of this PE, token t) and its row to each member that
// serves one of its experts, once (fp8: quantised here, one scale per 128 elements). Then the
// last block sets this PE's dispatch flag of half h on every member to T + 1 (a release after
// every block's stores). `bad`: the host rejected the inputs (T is 0 then; the error is
// latched, the flags still go out so no peer waits in vain).
extern "C" __global__ void __launch_bounds__(LL_BLOCK) ll_dispatch_send(const ll_params* P, const rshmem_bfloat16* x,
                                                                       const void* ids, int ids64, int T, int topk, int h,
                                                                       int fp8, int bad) {
    const long long n = P->n, M = P->M, H = P->H, K = P->k, L = P->L, E = P->E, me = P->me;
    const long long rb = ll_row_bytes(P);
    __shared__ int s_ids[LL_MAX_TOPK];
    __shared__ unsigned long long s_mask;
    if (bad && blockIdx.x == 0 && threadIdx.x == 0) atomicOr(ll_ctl(P) + LL_CTL_ERR, LL_ERR_MINE);
    int* my_ids = (int*)P->my_ids + h * M * K;
    for (long long t = blockIdx.x; t < T; t += gridDim.x) {
        if (threadIdx.x < K) {
            const int j = threadIdx.x;
            long long id = -1;
            if (j < topk) id = ids64 ? ((const long long*)ids)[t * topk + j] : (long long)((const int*)ids)[t * topk + j];
            if (id < -1 || id >= E) {
                atomicOr(ll_ctl(P) + LL_CTL_ERR, LL_ERR_MINE);
                id = -1;
            }
            s_ids[j] = (int)id;
            my_ids[t * K + j] = (int)id;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long m = 0;
            for (int j = 0; j < K; j++)
                if (s_ids[j] >= 0) m |= 1ull << (s_ids[j] / L);
            s_mask = m;
        }
        __syncthreads();
        for (long long i = threadIdx.x; i < n * K; i += blockDim.x) {
            const long long d = i / K, j = i % K;
            int* meta = (int*)P->meta + ((h * n + me) * M + t) * K + j;
            *(int*)rshmemi_ptr(meta, ll_pe(P, d)) = s_ids[j];
        }
        const unsigned long long mask = s_mask;
        unsigned char* stage = (unsigned char*)P->stage + ((h * n + me) * M + t) * rb;
        if (!fp8) {
            const uint4* src = (const uint4*)(x + t * H);
            const long long nv = H / 8, nth = blockDim.x;
            for (long long v0 = threadIdx.x; v0 < nv; v0 += nth * LL_BATCH) {
                uint4 r[LL_BATCH];
#pragma unroll
                for (int q = 0; q < LL_BATCH; q++)
                    if (v0 + q * nth < nv) r[q] = src[v0 + q * nth];
                for (long long d = 0; d < n; d++) {
                    if (!(mask >> d & 1)) continue;
                    uint4* to = (uint4*)rshmemi_ptr(stage, ll_pe(P, d));
#pragma unroll
                    for (int q = 0; q < LL_BATCH; q++)
                        if (v0 + q * nth < nv) to[v0 + q * nth] = r[q];
                }
            }
        } else {
            // A warp per group of 128 elements, 4 per lane.
            const unsigned lane = threadIdx.x & 31;
            for (long long g = threadIdx.x >> 5; g < H / 128; g += blockDim.x >> 5) {
                const uint2 raw = *(const uint2*)(x + t * H + g * 128 + lane * 4);
                float f[4];
                f[0] = __uint_as_float(raw.x << 16);
                f[1] = __uint_as_float(raw.x & 0xffff0000u);
                f[2] = __uint_as_float(raw.y << 16);
                f[3] = __uint_as_float(raw.y & 0xffff0000u);
                float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
                for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                const float scale = fmaxf(amax, 1e-4f) / 448.0f;
                const float inv = 1.0f / scale;
                const unsigned q = (unsigned)ll_e4m3x2(f[1] * inv, f[0] * inv) |
                                   ((unsigned)ll_e4m3x2(f[3] * inv, f[2] * inv) << 16);
                for (long long d = 0; d < n; d++) {
                    if (!(mask >> d & 1)) continue;
                    unsigned char* r = (unsigned char*)rshmemi_ptr(stage, ll_pe(P, d));
                    ((unsigned*)(r + g * 128))[lane] = q;
                    if (lane == 0) ((float*)(r + H))[g] = scale;
                }
            }
        }
        __syncthreads();
    }
    if (ll_last_block(P, 0, h)) {
        for (long long d = 0; d < n; d++) {
            unsigned long long* f = (unsigned long long*)P->dflag + h * n + me;
            rshmemi_st_release((unsigned long long*)rshmemi_ptr(f, ll_pe(P, d)), (unsigned long long)T + 1);
        }
    }
}

// Whether token t of source s (half h) names global expert ge in one of its slots.
__device__ __forceinline__ bool ll_hits(const ll_params* P, int h, long long s, long long t, int ge) {
    const int* m = (const int*)P->meta + ((h * P->n + s) * P->M + t) * P->k;
    const int K = (int)P->k;
    bool hit = false;
    // Eight ids loaded before any is compared (one load latency per eight slots).
    for (int j0 = 0; j0 < K; j0 += 8) {
        int v[8];
#pragma unroll
        for (int q = 0; q < 8; q++) v[q] = j0 + q < K ? m[j0 + q] : -1;
#pragma unroll
        for (int q = 0; q < 8; q++) hit |= v[q] == ge;
    }
    return hit;
}

// Receive side (grid of any size, LL_BLOCK threads): a block per (local expert e, source s)
// pair at a time waits for sources 0..s, counts the tokens of sources before s that name e (the
// first row of the pair), gives the tokens of s that name e their rows in token order (a block
// scan), and copies each such row from the staged area into its expert's slot, with its source
// (s * M + t) and the pair's (first row, rows); the pair of the last source writes the
// expert's count. The last block clears the dispatch flags of half h.
extern "C" __global__ void __launch_bounds__(LL_BLOCK) ll_dispatch_recv(const ll_params* P, int h, int fp8) {
    const long long n = P->n, M = P->M, H = P->H, L = P->L, me = P->me;
    const long long rb = ll_row_bytes(P), nM = n * M;
    const unsigned long long* flags = (const unsigned long long*)P->dflag + h * n;
    __shared__ unsigned s_cnt;
    __shared__ unsigned s_warp[LL_BLOCK / 32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long i = blockIdx.x; i < L * n; i += gridDim.x) {
        const long long e = i / n, s = i % n;
        const int ge = (int)(me * L + e);
        if (!ll_wait_flags(P, flags, (int)s + 1)) break;
        if (threadIdx.x == 0) s_cnt = 0;
        __syncthreads();
        for (long long u = 0; u < s; u++) {
            const long long Tu = (long long)(((const volatile unsigned long long*)flags)[u] - 1);
            unsigned c = 0;
            for (long long t = threadIdx.x; t < Tu; t += blockDim.x) c += ll_hits(P, h, u, t, ge);
            if (c) atomicAdd(&s_cnt, c);
        }
        __syncthreads();
        const unsigned first = s_cnt;
        const long long Ts = (long long)(((const volatile unsigned long long*)flags)[s] - 1);
        int* srcs = (int*)P->src + (h * L + e) * nM;
        unsigned rows = 0;
        for (long long t0 = 0; t0 < Ts; t0 += blockDim.x) {
            const long long t = t0 + threadIdx.x;
            const bool hit = t < Ts && ll_hits(P, h, s, t, ge);
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            if (lane == 0) s_warp[warp] = __popc(b);
            __syncthreads();
            unsigned before = 0, total = 0;
            for (unsigned w = 0; w < blockDim.x / 32; w++) {
                if (w < warp) before += s_warp[w];
                total += s_warp[w];
            }
            if (hit) srcs[first + rows + before + __popc(b & ((1u << lane) - 1))] = (int)(s * M + t);
            rows += total;
            __syncthreads();
        }
        // Rows (a warp each), read back from srcs (this block's stores, ordered by its barrier).
        const unsigned char* stage = (const unsigned char*)P->stage + (h * n + s) * M * rb;
        for (unsigned r = warp; r < rows; r += blockDim.x / 32) {
            const long long slot = first + r, t = srcs[slot] - s * M;
            const uint4* from = (const uint4*)(stage + t * rb);
            if (!fp8) {
                uint4* to = (uint4*)((rshmem_bfloat16*)P->recv_x + ((h * L + e) * nM + slot) * H);
                ll_copy(to, from, H / 8, lane, 32);
            } else {
                unsigned char* base = (unsigned char*)P->recv_x + h * L * nM * H * 2;
                uint4* to = (uint4*)(base + (e * nM + slot) * H);
                ll_copy(to, from, H / 16, lane, 32);
                float* sc = (float*)(base + L * nM * H) + (e * nM + slot) * (H / 128);
                const float* fs = (const float*)(stage + t * rb + H);
                for (long long g = lane; g < H / 128; g += 32) sc[g] = fs[g];
            }
        }
        if (threadIdx.x == 0) {
            int* lay = (int*)P->layout + ((h * L + e) * n + s) * 2;
            lay[0] = (int)first;
            lay[1] = (int)rows;
            if (s == n - 1) ((int*)P->count)[h * L + e] = (int)(first + rows);
        }
        __syncthreads();
    }
    if (ll_last_block(P, 1, h)) {
        for (long long s = 0; s < n; s++) ((volatile unsigned long long*)flags)[s] = 0;
    }
}
