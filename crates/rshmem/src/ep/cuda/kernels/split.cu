// ----- the split combine (every PE of the team alone on its GPU; ep.rs decides) -----
// One grid kernel in two roles. Blocks below ga = grid / 2 (the agreed grid: the same on every
// PE) put the partial rows of the peers' tokens: ep_csend's units (received row, chunk) for
// sources other than this PE, peers varying fastest. The other blocks sum this PE's own tokens
// (units (token, chunk)): the partial row of its own slots first (f32, slot order, rounded as
// ep_csend rounds the rows it stores), then the peers' rows from the combine area, ascending
// over PEs as ep_crecv adds them: bit for bit ep_crecv's result.
//
// No progress words: a summer learns that a peer's row is in from the row itself. The peers'
// rows of the combine area hold the sentinel EP_SENTINEL (every 32-bit word all ones) until
// their sender overwrites them; a sender never stores an all-ones word (ep_canon turns an
// all-ones NaN into another NaN); a 32-bit word is written at once (single-copy atomic), so a
// word that is not all ones is the sender's. A summer loads its vectors with volatile loads
// until none is the sentinel, then stores the sentinel back (the rows of the same parity are
// written again two combines later, after the peers have seen this kernel's combine signals). Nothing is ordered
// between words, so the senders publish nothing and fence nothing: each word says for itself
// whether it has arrived. ep.rs fills the area with the sentinel at creation and again after
// any step that failed (Buffer::check); every other reader of peers' rows in the area
// (ep_crecv, ep_ccopy) stores the sentinel back too (P->sentinel).
//
// The senders never wait, the summers wait only for senders, and every PE runs the kernel on a
// GPU of its own (one block per SM, all resident): no cycle. With fin 0 (out overlaps y or the
// buffer on this PE) the summers put this PE's own partial rows into its combine area instead,
// as ep_csend, and ep_cwait and ep_crecv sum after this kernel.
// acc = the weighted sum of the slots' rows for chunk `c` (vectors v0 + 32 q), rounded to ep_t
// (into dst, canonical (ep_canon), when dst is not null, else kept in acc as the rounded values).
template <int U>
__device__ __forceinline__ void ep_split_partial(float (&acc)[U][EP_VEC], const int* rows, const unsigned* wts, long long K,
                                                 const ep_t* y, long long H, int v0, int nv, unsigned lane, ep_t* dst) {
#pragma unroll
    for (int q = 0; q < U; q++)
#pragma unroll
        for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
    ep_sum_slots<U>(acc, rows, wts, K, y, H, v0, nv, lane);
    if (dst) {
        ep_round_store<U>(dst, acc, v0, nv, true);
    } else {
#pragma unroll
        for (int q = 0; q < U; q++)
#pragma unroll
            for (int e = 0; e < (int)EP_VEC; e++) {
                ep_t r;
                ep_from(acc[q][e], &r);
                acc[q][e] = ep_f(r);
            }
    }
}
// The scalar form of one unit (rows of a size or alignment the vectors do not take): elements
// [e0, e1) of the partial row of `g`'s slots into dst (canonical: no all-ones element).
__device__ __noinline__ void ep_split_partial_scalar(const int* rows, const unsigned* wts, long long K, const ep_t* y,
                                                     long long H, long long e0, long long e1, unsigned lane, ep_t* dst) {
    for (long long h = e0 + lane; h < e1; h += 32) {
        ep_t o;
        ep_from(ep_slots_elem(rows, wts, K, y, H, h), &o);
        *(ep_bits*)&dst[h] = ep_canon_bits(*(const ep_bits*)&o);
    }
}
__device__ __noinline__ void ep_split_sum_scalar(const ep_params* P, const int* pos, ep_t* comb, const ep_t* y,
                                                 long long H, long long e0, long long e1, unsigned lane, ep_t* out) {
    const int n = (int)P->n, me = (int)P->me;
    const long long C = P->cap, K = P->kmax, RMW = 1 + 2 * K;
    const int im = pos[me];
    const long long g = (long long)me * C + (im < 0 ? 0 : im);
    const int* rows = (const int*)P->tok_rows + g * K;
    const unsigned* wts = (const unsigned*)P->recv_meta + g * RMW + 1 + K;
    for (long long h = e0 + lane; h < e1; h += 32) {
        float own = 0.f;
        if (im >= 0) {
            own = ep_slots_elem(rows, wts, K, y, H, h);
            ep_t o;
            ep_from(own, &o);
            own = ep_f(o);
        }
        float acc = 0.f;
        for (int d = 0; d < n; d++) {
            if (d == me) {
                if (im >= 0) acc += own;
            } else if (pos[d] >= 0 && pos[d] < C) {
                acc += ep_take_elem(&comb[((long long)d * C + pos[d]) * H + h], ep_pe(P, d));
            }
        }
        ep_from(acc, &out[h]);
    }
}

#define EP_SPLIT_BLOCK 384
// EP_SPLIT_WAIT 0 (measurements only: wrong sums, sentinels left in place): the summers read
// the peers' rows as they are.
#ifndef EP_SPLIT_WAIT
#define EP_SPLIT_WAIT 1
#endif
extern "C" __global__ void __launch_bounds__(EP_SPLIT_BLOCK) ep_csplit(const ep_params* P, const ep_t* y, ep_t* out, int fin) {
    rshmemi_grid_dep_wait();
    // ep_cwait (one block) may become resident now.
    rshmemi_grid_dep_launch();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, G = P->grid;
    const unsigned lane = threadIdx.x & 31;
    EP_STAMP_FIRST(ctl, 11);
    if (ctl[EP_CTL_GO]) {
        const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
        const int* tok_rows = (const int*)P->tok_rows;
        const rshmem_u64 cnum = ctl[EP_CTL_CWAIT] + 1;
        const long long parity = (long long)(cnum - 1) & 1;
        const bool vec = ep_al16((unsigned long long)y | (fin ? (unsigned long long)out : 0ull) | P->comb);
        const int nv = (int)(H * (long long)sizeof(ep_t) / 16);
        const long long chunk = 32 * EP_UR, nch = vec ? (nv + chunk - 1) / chunk : 1, chunk_el = vec ? chunk * EP_VEC : H;
        const long long wpb = blockDim.x / 32, ga = G / 2;
        if ((long long)blockIdx.x < ga) {
            const long long gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = ga * wpb;
            const long long units = (long long)(n - 1) * C * nch;
            for (long long u = gw; u < units; u += nw) {
                const long long t = u / nch, c = u % nch;
                const long long sp = t % (n - 1), i = t / (n - 1), s = sp < me ? sp : sp + 1, g = s * C + i;
                if (i >= recv_cnt[s]) continue;
                const unsigned* wts = (const unsigned*)P->recv_meta + g * RMW + 1 + K;
                ep_t* dst = (ep_t*)rshmemi_ptr((ep_t*)P->comb + ((parity * n + me) * C + i) * H, ep_pe(P, (int)s));
                if (vec) {
                    float acc[EP_UR][EP_VEC];
                    ep_split_partial<EP_UR>(acc, tok_rows + g * K, wts, K, y, H, (int)(c * chunk) + (int)lane, nv, lane, dst);
                } else {
                    ep_split_partial_scalar(tok_rows + g * K, wts, K, y, H, c * chunk_el, min(H, (c + 1) * chunk_el), lane, dst);
                }
            }
        } else if (!fin) {
            // This PE's own partial rows into its combine area (ep_crecv sums after ep_cwait).
            const long long gw = (blockIdx.x - ga) * wpb + (threadIdx.x >> 5), nws = (gridDim.x - ga) * wpb;
            const long long cnt = min((long long)recv_cnt[me], C);
            for (long long u = gw; u < cnt * nch; u += nws) {
                const long long i = u / nch, c = u % nch, g = (long long)me * C + i;
                const unsigned* wts = (const unsigned*)P->recv_meta + g * RMW + 1 + K;
                ep_t* dst = (ep_t*)P->comb + ((parity * n + me) * C + i) * H;
                if (vec) {
                    float acc[EP_UR][EP_VEC];
                    ep_split_partial<EP_UR>(acc, tok_rows + g * K, wts, K, y, H, (int)(c * chunk) + (int)lane, nv, lane, dst);
                } else {
                    ep_split_partial_scalar(tok_rows + g * K, wts, K, y, H, c * chunk_el, min(H, (c + 1) * chunk_el), lane, dst);
                }
            }
        } else {
            const int T = (int)ctl[EP_CTL_TOKENS];
            const int* tok_pos = (const int*)P->tok_pos;
            ep_t* comb = (ep_t*)P->comb + parity * n * C * H;
            const long long gw = (blockIdx.x - ga) * wpb + (threadIdx.x >> 5), nws = (gridDim.x - ga) * wpb;
            for (long long u = gw; u < (long long)T * nch; u += nws) {
                const long long t = u / nch, c = u % nch;
                const int* pos = tok_pos + t * n;
                const int im = pos[me];
                if (!vec) {
                    ep_split_sum_scalar(P, pos, comb, y, H, c * chunk_el, min(H, (c + 1) * chunk_el), lane, out + t * H);
                    continue;
                }
                const int v0 = (int)(c * chunk) + (int)lane;
                float own[EP_UR][EP_VEC];
                if (im >= 0) {
                    const long long g = (long long)me * C + im;
                    ep_split_partial<EP_UR>(own, tok_rows + g * K, (const unsigned*)P->recv_meta + g * RMW + 1 + K, K, y, H,
                                            v0, nv, lane, nullptr);
                }
                float acc[EP_UR][EP_VEC];
#pragma unroll
                for (int q = 0; q < EP_UR; q++)
#pragma unroll
                    for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
                for (int d = 0; d < n; d++) {
                    if (d == me) {
                        if (im >= 0)
#pragma unroll
                            for (int q = 0; q < EP_UR; q++)
#pragma unroll
                                for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] += own[q][e];
                    } else if (pos[d] >= 0 && pos[d] < C) {
                        rshmemi_v4 a[EP_UR];
                        rshmemi_v4* row = (rshmemi_v4*)(comb + ((long long)d * C + pos[d]) * H);
                        if (EP_SPLIT_WAIT) ep_take_row<EP_UR>(a, row, v0, nv, ep_pe(P, d), !(EP_SPLIT_KEEP & 1));
                        else ep_load<EP_UR>(a, row, v0, nv, false);
                        ep_accum<EP_UR>(acc, a, 1.f, false);
                    }
                }
                ep_round_store<EP_UR>(out + t * H, acc, v0, nv);
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) ep_abort_if_failed(ctl);
    EP_STAMP_LAST(ctl, 12);
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        ep_signal(ctl, sig + 2 * n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d));
}

