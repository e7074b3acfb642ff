// Low-latency MoE combine (after ll_dispatch.cu in the same program).

// Most local experts (the combine send keeps their row offsets in shared memory; the host
// checks it).
#define LL_MAX_LOCAL_EXPERTS 4096

// Block-wide exclusive scan of one value per thread (LL_BLOCK threads, all calling); *total
// gets the sum.
__device__ __forceinline__ int ll_block_scan(int v, int* total) {
    __shared__ int s_w[LL_BLOCK / 32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (unsigned)o) incl += u;
    }
    if (lane == 31) s_w[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int x = lane < LL_BLOCK / 32 ? s_w[lane] : 0;
        int c = x;
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, c, o);
            if (lane >= (unsigned)o) c += u;
        }
        if (lane < LL_BLOCK / 32) s_w[lane] = c - x;
        if (lane == 31) *total = c;
    }
    __syncthreads();
    const int r = s_w[warp] + incl - v;
    __syncthreads();
    return r;
}

// Send side (grid of any size, LL_BLOCK threads): every received row of half h's dispatch,
// taken from the expert outputs y ([L][n*M][H] bf16, the receive layout), goes back to its
// source into the combine area at (token, first slot naming the row's expert): each block
// turns the experts' counts into row offsets (shared memory), then its warps take the rows
// that exist, a warp per row. Then the last block sets this PE's combine flag of half h on
// every member (each waits for all of them).
extern "C" __global__ void __launch_bounds__(LL_BLOCK) ll_combine_send(const ll_params* P, const rshmem_bfloat16* y, int h) {
    const long long n = P->n, M = P->M, H = P->H, K = P->k, L = P->L, me = P->me, nM = n * M;
    const unsigned lane = threadIdx.x & 31;
    const long long gw = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nw = ((long long)gridDim.x * blockDim.x) >> 5;
    const int* counts = (const int*)P->count + h * L;
    __shared__ int s_off[LL_MAX_LOCAL_EXPERTS + 1];
    __shared__ int s_total;
    {
        const long long per = (L + blockDim.x - 1) / blockDim.x, e0 = threadIdx.x * per;
        const long long e1 = e0 + per < L ? e0 + per : L;
        int sum = 0;
        for (long long e = e0; e < e1; e++) sum += counts[e];
        int at = ll_block_scan(sum, &s_total);
        for (long long e = e0; e < e1; e++) {
            s_off[e] = at;
            at += counts[e];
        }
        if (threadIdx.x == 0) s_off[L] = s_total;
        __syncthreads();
    }
    const long long total = s_off[L];
    for (long long q = gw; q < total; q += nw) {
        long long lo = 0, hi = L;  // expert e with s_off[e] <= q < s_off[e + 1]
        while (hi - lo > 1) {
            const long long mid = (lo + hi) / 2;
            if (s_off[mid] <= q) lo = mid; else hi = mid;
        }
        const long long e = lo, r = q - s_off[e];
        const int sv = ((const int*)P->src)[(h * L + e) * nM + r];
        const long long s = sv / M, t = sv % M;
        const int* ids = (const int*)P->meta + ((h * n + s) * M + t) * K;
        const unsigned b = __ballot_sync(0xffffffffu, lane < K && ids[lane] == (int)(me * L + e));
        // b != 0: the row was placed because a slot names e.
        const long long j = b ? __ffs(b) - 1 : 0;
        rshmem_bfloat16* to = (rshmem_bfloat16*)P->comb + ((h * M + t) * K + j) * H;
        uint4* dst = (uint4*)rshmemi_ptr(to, ll_pe(P, s));
        ll_copy(dst, (const uint4*)(y + ((e * nM) + r) * H), H / 8, lane, 32);
    }
    if (ll_last_block(P, 2, h)) {
        for (long long d = 0; d < n; d++) {
            unsigned long long* f = (unsigned long long*)P->cflag + h * n + me;
            rshmemi_st_release((unsigned long long*)rshmemi_ptr(f, ll_pe(P, d)), 1ull);
        }
    }
}

// Receive side (grid of any size, LL_BLOCK threads): waits for every member's combine rows of
// half h, then out[t] = sum over the used slots j of token t (ascending, f32, multiply and add
// rounded separately) of w[t, j] * row(t, first slot naming id j), rounded once to bf16. Slots
// whose id was -1 or invalid add nothing. The last block clears the combine flags of half h.
extern "C" __global__ void __launch_bounds__(LL_BLOCK) ll_combine_recv(const ll_params* P, const float* w,
                                                                      rshmem_bfloat16* out, int T, int topk, int h) {
    const long long n = P->n, M = P->M, H = P->H, K = P->k;
    unsigned long long* flags = (unsigned long long*)P->cflag + h * n;
    __shared__ int s_j[LL_MAX_TOPK];
    __shared__ float s_w[LL_MAX_TOPK];
    const bool ok = ll_wait_flags(P, flags, (int)n);
    for (long long t = blockIdx.x; ok && t < T; t += gridDim.x) {
        if (threadIdx.x < K) {
            const int j = threadIdx.x;
            const int* ids = (const int*)P->my_ids + (h * M + t) * K;
            const int id = ids[j];
            int first = -1;
            if (id >= 0 && j < topk)
                for (int q = 0; q <= j; q++)
                    if (ids[q] == id) { first = q; break; }
            s_j[j] = first;
            s_w[j] = first >= 0 ? w[t * topk + j] : 0.0f;
        }
        __syncthreads();
        const rshmem_bfloat16* rows = (const rshmem_bfloat16*)P->comb + (h * M + t) * K * H;
        for (long long v = threadIdx.x; v < H / 8; v += blockDim.x) {
            float acc[8];
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] = 0.0f;
            // LL_BATCH slots' vectors loaded before any is summed (in slot order).
            for (int j0 = 0; j0 < (int)K; j0 += LL_BATCH) {
                uint4 u[LL_BATCH];
#pragma unroll
                for (int q = 0; q < LL_BATCH; q++) {
                    const int j = j0 + q;
                    if (j < (int)K && s_j[j] >= 0) u[q] = ((const uint4*)(rows + s_j[j] * H))[v];
                }
#pragma unroll
                for (int q = 0; q < LL_BATCH; q++) {
                    const int j = j0 + q;
                    if (j >= (int)K || s_j[j] < 0) continue;
                    const unsigned wd[4] = {u[q].x, u[q].y, u[q].z, u[q].w};
                    const float wj = s_w[j];
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        acc[2 * c] = __fadd_rn(acc[2 * c], __fmul_rn(wj, __uint_as_float(wd[c] << 16)));
                        acc[2 * c + 1] = __fadd_rn(acc[2 * c + 1], __fmul_rn(wj, __uint_as_float(wd[c] & 0xffff0000u)));
                    }
                }
            }
            unsigned o[4];
#pragma unroll
            for (int q = 0; q < 4; q++)
                o[q] = (unsigned)rshmem_float_to_bfloat16(acc[2 * q]).bits |
                       ((unsigned)rshmem_float_to_bfloat16(acc[2 * q + 1]).bits << 16);
            ((uint4*)(out + t * H))[v] = make_uint4(o[0], o[1], o[2], o[3]);
        }
        __syncthreads();
    }
    if (ll_last_block(P, 3, h)) {
        for (long long s = 0; s < n; s++) ((volatile unsigned long long*)flags)[s] = 0;
    }
}
