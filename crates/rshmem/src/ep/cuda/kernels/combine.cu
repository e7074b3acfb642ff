// 16-byte vectors of hidden elements, widened to f32.
#define EP_VEC (16 / sizeof(ep_t))
struct __align__(16) ep_vec { ep_t v[EP_VEC]; };

// acc[q] += wt * a[q] (weighted) or acc[q] += a[q], element by element in f32 (the same
// expressions as the scalar paths, so both round alike).
template <int U>
__device__ __forceinline__ void ep_accum(float (&acc)[U][EP_VEC], const rshmemi_v4 (&a)[U], float wt, bool weighted) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const ep_vec b = *(const ep_vec*)&a[q];
#pragma unroll
        for (int e = 0; e < (int)EP_VEC; e++) {
            if (weighted) acc[q][e] += wt * ep_f(b.v[e]);
            else acc[q][e] += ep_f(b.v[e]);
        }
    }
}
// Rounds acc and stores the vectors v0 + 32*q (below nv) of `row`; with `canon`, no 32-bit word
// all ones (ep_canon: rows a split combine's summer waits for).
template <int U>
__device__ __forceinline__ void ep_round_store(ep_t* row, const float (&acc)[U][EP_VEC], int v0, int nv, bool canon = false) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v >= nv) continue;
        ep_vec o;
#pragma unroll
        for (int e = 0; e < (int)EP_VEC; e++) ep_from(acc[q][e], &o.v[e]);
        if (canon) {
            ((rshmemi_v4*)row)[v] = ep_canon4(*(const rshmemi_v4*)&o);
        } else {
            ((ep_vec*)row)[v] = o;
        }
    }
}

// acc += w_j * y[r_j] over the slots j < K whose row r_j = rows[j] is >= 0 (weights: f32 bits
// wts[j]), in slot order; the lanes gather the slots, rows are walked two at a time (both rows'
// loads in flight before accumulating).
template <int U>
__device__ __forceinline__ void ep_sum_slots(float (&acc)[U][EP_VEC], const int* rows, const unsigned* wts, long long K,
                                             const ep_t* y, long long H, int v0, int nv, unsigned lane) {
    for (long long j0 = 0; j0 < K; j0 += 32) {
        int rj = -1;
        float wj = 0.f;
        if (j0 + lane < K) {
            rj = rows[j0 + lane];
            wj = __uint_as_float(wts[j0 + lane]);
        }
        unsigned mm = __ballot_sync(0xffffffffu, rj >= 0);
        while (mm) {
            const int b1 = __ffs(mm) - 1;
            mm &= mm - 1;
            const int b2 = mm ? __ffs(mm) - 1 : -1;
            if (mm) mm &= mm - 1;
            const int r1 = __shfl_sync(0xffffffffu, rj, b1);
            const float w1 = __shfl_sync(0xffffffffu, wj, b1);
            const int r2 = __shfl_sync(0xffffffffu, rj, b2 < 0 ? b1 : b2);
            const float w2 = __shfl_sync(0xffffffffu, wj, b2 < 0 ? b1 : b2);
            rshmemi_v4 a1[U], a2[U];
            ep_load<U>(a1, (const rshmemi_v4*)(y + (long long)r1 * H), v0, nv, true);
            if (b2 >= 0) ep_load<U>(a2, (const rshmemi_v4*)(y + (long long)r2 * H), v0, nv, true);
            ep_accum<U>(acc, a1, w1, true);
            if (b2 >= 0) ep_accum<U>(acc, a2, w2, true);
        }
    }
}

// The scalar form of ep_sum_slots, element h: the weighted sum (f32, slot order) over the slots
// j < K whose row rows[j] is >= 0 (weights: f32 bits wts[j]).
__device__ __forceinline__ float ep_slots_elem(const int* rows, const unsigned* wts, long long K, const ep_t* y, long long H,
                                               long long h) {
    float acc = 0.f;
    for (long long j = 0; j < K; j++) {
        const int r = rows[j];
        if (r < 0) continue;
        acc += __uint_as_float(wts[j]) * ep_f(y[(long long)r * H + h]);
    }
    return acc;
}

// acc += the rows bases[d] + pos[d] * H over d ascending with pos[d] >= 0, two rows' loads in
// flight before accumulating. With keep >= 0 every row read of a PE other than `keep` gets the
// sentinel back (the peers' rows of a split-combine buffer's combine area).
template <int U>
__device__ __forceinline__ void ep_sum_bases(float (&acc)[U][EP_VEC], const int* pos, int n, const ep_t* const* bases,
                                             long long H, int v0, int nv, int keep) {
    int d = 0;
    while (true) {
        int p1 = -1, p2 = -1;
        for (; d < n && p1 < 0; d++) p1 = pos[d] < 0 ? -1 : d;
        for (; d < n && p2 < 0; d++) p2 = pos[d] < 0 ? -1 : d;
        if (p1 < 0) break;
        rshmemi_v4 a1[U], a2[U];
        ep_load<U>(a1, (const rshmemi_v4*)(bases[p1] + pos[p1] * H), v0, nv, false);
        if (p2 >= 0) ep_load<U>(a2, (const rshmemi_v4*)(bases[p2] + pos[p2] * H), v0, nv, false);
        if (keep >= 0 && p1 != keep) ep_put_sentinel<U>((rshmemi_v4*)(bases[p1] + pos[p1] * H), v0, nv);
        if (keep >= 0 && p2 >= 0 && p2 != keep) ep_put_sentinel<U>((rshmemi_v4*)(bases[p2] + pos[p2] * H), v0, nv);
        ep_accum<U>(acc, a1, 1.f, false);
        if (p2 >= 0) ep_accum<U>(acc, a2, 1.f, false);
        if (p2 < 0) break;
    }
}

// Expert side of combine: for each received token, the weighted sum (slot order, f32) of the
// expert outputs of its local slots, rounded once, put as one row back to its source at
// comb[parity][this PE][position]. Work units are (received token, chunk of the row); the
// token's local slots are gathered by the lanes and walked two at a time (both rows' loads in
// flight before accumulating, in slot order). Then every block adds 1 to each source's combine
// signal. With `tokens` (combine_tokens), y holds one row per receive row (the caller's own
// per-token result, weights applied by it) and that row is put back as is; tokens == 2: rows
// of this PE's own tokens stay in y (ep_crecv reads them there). Units run with the source
// varying fastest, so the copies to every destination (this PE's HBM and each peer's link)
// proceed together rather than one destination after another.
extern "C" __global__ void __launch_bounds__(512) ep_csend(const ep_params* P, const ep_t* y, int tokens) {
    rshmemi_grid_dep_wait();
    // ep_cwait (one block) may become resident now.
    rshmemi_grid_dep_launch();
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K;
    const unsigned lane = threadIdx.x & 31;
    const bool span = P->xstage != 0;
    __shared__ int s_last;
    EP_STAMP_FIRST(ctl, 11);
    if (ctl[EP_CTL_GO]) {
        const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
        const int* tok_rows = (const int*)P->tok_rows;
        const long long parity = (long long)(ctl[EP_CTL_CWAIT] & 1);
        const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)y | P->comb);
        const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
        const long long chunk = 32 * EP_UR;
        const long long nch = vec ? (nv + chunk - 1) / chunk : 1;
        const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
        for (long long u = gw; u < n * C * nch; u += nw) {
            const long long t = u / nch, c = u % nch;
            const long long s = t % n, i = t / n, g = s * C + i;
            if (i >= recv_cnt[s] || (tokens == 2 && s == me)) continue;
            const unsigned* m = (const unsigned*)P->recv_meta + g * RMW;
            // A source on another node: the row goes into this PE's idle half of the combine
            // area at row (1 - parity, s, i), which no other PE writes (s sends this PE no rows
            // of its own), and s's forwarder on this node sums it with the node's other rows of
            // the token (ep_cfwd).
            ep_t* dst = span && ep_remote(P, (int)s) ? (ep_t*)P->comb + (((1 - parity) * n + s) * C + i) * H
                                                     : (ep_t*)rshmemi_ptr((ep_t*)P->comb + ((parity * n + me) * C + i) * H, ep_pe(P, (int)s));
            if (tokens) {
                if (vec) {
                    const int v0 = (int)(c * chunk) + (int)lane;
                    rshmemi_v4 a[EP_UR];
                    ep_load<EP_UR>(a, (const rshmemi_v4*)(y + g * H), v0, nv, true);
                    ep_store<EP_UR>((rshmemi_v4*)dst, a, v0, nv);
                } else {
                    ep_copy_row(dst, y + g * H, H * (long long)sizeof(ep_t), lane);
                }
            } else if (vec) {
                const int v0 = (int)(c * chunk) + (int)lane;
                float acc[EP_UR][EP_VEC];
#pragma unroll
                for (int q = 0; q < EP_UR; q++)
#pragma unroll
                    for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
                ep_sum_slots<EP_UR>(acc, tok_rows + g * K, m + 1 + K, K, y, H, v0, nv, lane);
                ep_round_store<EP_UR>(dst, acc, v0, nv);
            } else {
                for (long long h = lane; h < H; h += 32) ep_from(ep_slots_elem(tok_rows + g * K, m + 1 + K, K, y, H, h), &dst[h]);
            }
        }
    }
    __syncthreads();
    EP_STAMP_LAST(ctl, 12);
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        if (!(span && ep_remote(P, d))) ep_signal(ctl, sig + 2 * n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d));
    if (span && ep_last_block(ctl, &s_last)) {
        // Every block's partial rows for sources of other nodes are in this PE's idle half:
        // this node's forwarders may sum them (ep_cfwd), which put one row per (token, node)
        // back and set the combine signals. ep_cwait counts this push combine only after this
        // kernel's end (its rshmemi_grid_dep_wait): the call number is the count so far plus one.
        for (int f = threadIdx.x; f < n; f += blockDim.x)
            if (!ep_remote(P, f) && ep_serves_any(P, f))
                ep_signal_set(ctl, (rshmem_u64*)P->fsig + n + me, ctl[EP_CTL_CPUSH] + 1, ep_pe(P, f));
    }
}

