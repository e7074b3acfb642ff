// MoE dispatch/combine kernels (rshmem::cuda::ep). Compiled by NVRTC after the device header,
// once per (hidden type EP_T, top-k id type EP_ID).
//
// Every buffer address in `ep_params` is this PE's symmetric address; peers' copies are reached
// with rshmem_ptr. Step order on one stream (see ep.rs for why each area is safe to reuse):
//   dispatch: ep_prep (1 block) -> ep_send (grid) -> ep_wait(0) (1 block) -> ep_permute (grid)
//   combine:  ep_csend (grid) -> ep_wait(1) (1 block) -> ep_crecv (grid)
// Only the one-block kernels wait for peers, so kernels that spin never fill the GPU.
#ifndef EP_T
#define EP_T rshmem_bfloat16
#endif
#ifndef EP_ID
#define EP_ID int
#endif
typedef EP_T ep_t;
typedef EP_ID ep_id;

// Most PEs of an EP team: destinations are bits of a 64-bit mask in ep_prep. ep.rs
// (MAX_GPU_EP_PES) refuses bigger teams.
#define EP_MAX_PES 64

// Parameter block (u64 words; written by the host once per buffer). Keep in step with ep.rs.
struct ep_params {
    unsigned long long recv_x, recv_meta, comb, rec, sig, ctl, recv_cnt, expert_off, fill, tok_pos,
        row_src, tok_rows;
    long long n, me, start, stride, cap, hidden, kmax, el, experts, max_tokens, rmax, grid;
};

// ctl words (this PE only).
#define EP_CTL_EPOCH 0
#define EP_CTL_DWAIT 1
#define EP_CTL_CWAIT 2
#define EP_CTL_GO 3
#define EP_CTL_ERR 4
#define EP_CTL_INFO 5
#define EP_CTL_ROWS 6
#define EP_CTL_TOKENS 7
#define EP_CTL_TOPK 8
// error bits
#define EP_ERR_MINE 1ull
#define EP_ERR_PEER 2ull
#define EP_ERR_CAPACITY 4ull
#define EP_ERR_CORRUPT 8ull
// A device wait of this step timed out on this PE or on a PE that signalled it: what follows the
// wait was not used (nothing permuted or combined) and every later signal of this PE carries the
// bit to its peers, so no PE treats a step some PE gave up on as complete. Sticky until the host
// clears the flags (Buffer::check).
#define EP_ERR_ABORT 16ull
// record words per source: status, count for this destination, tokens, top_k, then El pairs.
#define EP_REC_FIXED 4
// status: 0 ok, 1 invalid input, 2 | dst << 8 | needed << 32 capacity
#define EP_ST_INVALID 1ull
#define EP_ST_CAPACITY 2ull

__device__ __forceinline__ float ep_f(float v) { return v; }
__device__ __forceinline__ float ep_f(rshmem_bfloat16 v) { return rshmem_bfloat16_to_float(v); }
__device__ __forceinline__ float ep_f(rshmem_half v) { return rshmem_half_to_float(v); }
__device__ __forceinline__ void ep_from(float f, float* o) { *o = f; }
__device__ __forceinline__ void ep_from(float f, rshmem_bfloat16* o) { *o = rshmem_float_to_bfloat16(f); }
__device__ __forceinline__ void ep_from(float f, rshmem_half* o) { *o = rshmem_float_to_half(f); }

// True when a device wait of this PE timed out or a device barrier was misused (the device
// header's flag; the host clears it).
__device__ __forceinline__ bool ep_timed_out() {
    return rshmemi_failed();
}

// After this PE's waits of a step (one thread): a timeout here, or an abort a peer put here
// before the signals just waited for, stops the rest of the step on this PE.
__device__ __forceinline__ void ep_abort_if_failed(unsigned long long* ctl) {
    if (ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)) {
        atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_ABORT);
        ((volatile unsigned long long*)ctl)[EP_CTL_GO] = 0;
    }
}

// Adds 1 to PE `pe`'s counter `sig` (this PE's symmetric address) after this thread's barrier
// with its block; an aborted PE first puts the abort bit into the peer's flags (ordered before
// the signal by the release).
__device__ __forceinline__ void ep_signal(const unsigned long long* ctl, rshmem_u64* sig, rshmem_u64* peer_ctl_err, int pe) {
    asm volatile("fence.sc.sys;" ::: "memory");
    if (((const volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)
        atomicOr_system((unsigned long long*)rshmem_ptr(peer_ctl_err, pe), EP_ERR_ABORT);
    rshmemi_red_add_release((rshmem_u64*)rshmem_ptr(sig, pe), 1);
}

__device__ __forceinline__ int ep_pe(const ep_params* P, int d) { return (int)(P->start + d * P->stride); }
__device__ __forceinline__ unsigned ep_lanemask_lt() { unsigned m; asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m)); return m; }

// Validates the routing, computes the layout (per-token positions per destination, counts per
// destination and per expert), exchanges one record with every PE and takes the common
// decision. One block; dynamic shared memory: `experts` unsigned.
extern "C" __global__ void __launch_bounds__(1024) ep_prep(const ep_params* P, const ep_id* ids, const float* w, int T, int topk,
                                   int capturable, int invalid) {
    extern __shared__ unsigned s_pairs[];
    __shared__ unsigned s_cnt[EP_MAX_PES];
    __shared__ unsigned s_wt[32];
    __shared__ unsigned s_wbase[32];
    __shared__ int s_err;
    __shared__ rshmem_u64 s_epoch;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, E = (int)P->experts, El = (int)P->el;
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5;
    int* tok_pos = (int*)P->tok_pos;
    if (tid == 0) { s_epoch = ctl[EP_CTL_EPOCH] + 1; ctl[EP_CTL_EPOCH] = s_epoch; s_err = invalid ? 1 : 0; }
    for (int i = tid; i < E; i += nth) s_pairs[i] = 0;
    for (int i = tid; i < n; i += nth) s_cnt[i] = 0;
    __syncthreads();
    for (int base = 0; base < T; base += nth) {
        int t = base + tid;
        unsigned long long mask = 0;
        if (t < T) {
            int bad = 0;
            for (int j = 0; j < topk; j++) {
                long long id = (long long)ids[(long long)t * topk + j];
                if (id == -1) continue;
                if (id < 0 || id >= E) { bad = 1; continue; }
                float wj = w[(long long)t * topk + j];
                if ((__float_as_uint(wj) & 0x7f800000u) == 0x7f800000u) bad = 1;  // inf or nan
                mask |= 1ull << (int)(id / El);
                atomicAdd(&s_pairs[id], 1u);
            }
            if (bad) atomicOr(&s_err, 1);
        }
        for (int d = 0; d < n; d++) {
            bool f = (mask >> d) & 1;
            unsigned bal = __ballot_sync(0xffffffffu, f);
            if (lane == 0) s_wt[warp] = __popc(bal);
            __syncthreads();
            if (tid == 0) {
                unsigned acc = s_cnt[d];
                for (unsigned q = 0; q < (nth + 31) / 32; q++) { s_wbase[q] = acc; acc += s_wt[q]; }
                s_cnt[d] = acc;
            }
            __syncthreads();
            if (t < T) tok_pos[(long long)t * n + d] = f ? (int)(s_wbase[warp] + __popc(bal & ep_lanemask_lt())) : -1;
            __syncthreads();
        }
    }
    __syncthreads();
    // This PE's status, the same in every record it sends.
    __shared__ rshmem_u64 s_status;
    // Gave up already (a wait of an earlier step timed out here, or a peer's abort arrived):
    // a peer may still be reading this PE's records of the step given up on, so none are
    // written; the record signal carries the abort instead and every peer stops this step.
    __shared__ int s_gone;
    if (tid == 0) {
        s_gone = ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT) != 0;
        rshmem_u64 st = 0;
        if (s_err) st = EP_ST_INVALID;
        else if (capturable)
            for (int d = 0; d < n; d++)
                if (s_cnt[d] > (unsigned)P->cap) { st = EP_ST_CAPACITY | ((rshmem_u64)d << 8) | ((rshmem_u64)s_cnt[d] << 32); break; }
        s_status = st;
    }
    __syncthreads();
    const long long RW = EP_REC_FIXED + El;
    rshmem_u64* rec = (rshmem_u64*)P->rec;
    for (int i = tid; i < n * El && !s_gone; i += nth) {
        int d = i / El, e = i % El;
        rshmem_u64* r = (rshmem_u64*)rshmem_ptr(rec + me * RW + EP_REC_FIXED + e, ep_pe(P, d));
        *(volatile rshmem_u64*)r = s_pairs[i];
    }
    for (int d = tid; d < n && !s_gone; d += nth) {
        rshmem_u64* r = (rshmem_u64*)rshmem_ptr(rec + me * RW, ep_pe(P, d));
        ((volatile rshmem_u64*)r)[0] = s_status;
        ((volatile rshmem_u64*)r)[1] = s_cnt[d];
        ((volatile rshmem_u64*)r)[2] = (rshmem_u64)T;
        ((volatile rshmem_u64*)r)[3] = (rshmem_u64)topk;
    }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = tid; d < n; d += nth) {
        // The abort bit first (ordered before the signal by its fence and release).
        if (s_gone) atomicOr_system((unsigned long long*)rshmem_ptr(ctl + EP_CTL_ERR, ep_pe(P, d)), EP_ERR_ABORT);
        rshmemi_signal_op_collective(sig + me, s_epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d));
    }
    for (int s = tid; s < n; s += nth) rshmemi_wait64(sig + s, RSHMEM_CMP_GE, s_epoch);
    __syncthreads();
    if (tid == 0) asm volatile("fence.acq_rel.sys;" ::: "memory");
    __syncthreads();
    if (tid == 0) {
        rshmem_u64 err = 0, info = 0;
        for (int s = 0; s < n; s++) {
            rshmem_u64 st = ((volatile rshmem_u64*)rec)[s * RW];
            if (st == EP_ST_INVALID) { err |= (s == me) ? EP_ERR_MINE : EP_ERR_PEER; if (!info) info = (rshmem_u64)s; }
            else if ((st & 0xff) == EP_ST_CAPACITY) { err |= EP_ERR_CAPACITY; info = ((st >> 8) & 0xffffff) | ((rshmem_u64)s << 24) | (st & 0xffffffff00000000ull); }
            else if (((volatile rshmem_u64*)rec)[s * RW + 1] > (rshmem_u64)P->cap) err |= EP_ERR_CORRUPT;
        }
        // A timed-out wait above read records that may not have arrived; an abort latched by an
        // earlier step stays until the host clears it.
        if (ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)) err |= EP_ERR_ABORT;
        if (err) {
            ctl[EP_CTL_GO] = 0;
            atomicOr_system(&ctl[EP_CTL_ERR], err);  // peers' sends may put an abort bit concurrently
            ctl[EP_CTL_INFO] = info;
        } else {
            ctl[EP_CTL_GO] = 1;
        }
        ctl[EP_CTL_TOKENS] = (rshmem_u64)T;
        ctl[EP_CTL_TOPK] = (rshmem_u64)topk;
    }
    __syncthreads();
    if (ctl[EP_CTL_GO]) {
        unsigned* recv_cnt = (unsigned*)P->recv_cnt;
        unsigned* off = (unsigned*)P->expert_off;
        unsigned* fill = (unsigned*)P->fill;
        for (int s = tid; s < n; s += nth) recv_cnt[s] = (unsigned)((volatile rshmem_u64*)rec)[s * RW + 1];
        for (int e = tid; e < El; e += nth) fill[e] = 0;
        if (tid == 0) {
            unsigned acc = 0;
            for (int e = 0; e < El; e++) {
                off[e] = acc;
                for (int s = 0; s < n; s++) acc += (unsigned)((volatile rshmem_u64*)rec)[s * RW + EP_REC_FIXED + e];
            }
            off[El] = acc;
            if (acc > (unsigned)P->rmax) { ctl[EP_CTL_GO] = 0; atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT); }
            ctl[EP_CTL_ROWS] = acc;
        }
    }
}

// Every token once to each destination PE: one warp per token, rows and row records by warp
// puts into the destination's receive area at (this PE's slot) * cap + position. Every block
// then adds 1 to each destination's data signal for this PE (also when nothing moves, so the
// counters stay in step).
extern "C" __global__ void __launch_bounds__(512) ep_send(const ep_params* P, const ep_t* x, const ep_id* ids, const float* w) {
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K;
    const unsigned lane = threadIdx.x & 31;
    if (ctl[EP_CTL_GO]) {
        const int T = (int)ctl[EP_CTL_TOKENS], topk = (int)ctl[EP_CTL_TOPK];
        const int* tok_pos = (const int*)P->tok_pos;
        long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
        for (long long t = gw; t < T; t += nw) {
            for (int d = 0; d < n; d++) {
                int pos = tok_pos[t * n + d];
                if (pos < 0) continue;
                int pe = ep_pe(P, d);
                long long row = me * C + pos;
                ep_t* dst = (ep_t*)rshmem_ptr((ep_t*)P->recv_x + row * H, pe);
                rshmemi_copy(dst, x + t * H, H * sizeof(ep_t), lane, 32);
                unsigned* m = (unsigned*)rshmem_ptr((unsigned*)P->recv_meta + row * RMW, pe);
                for (long long i = lane; i < RMW; i += 32) {
                    unsigned v;
                    if (i == 0) v = (unsigned)t;
                    else if (i <= K) { long long j = i - 1; v = j < topk ? (unsigned)(int)ids[t * topk + j] : 0xffffffffu; }
                    else { long long j = i - 1 - K; v = j < topk ? __float_as_uint(w[t * topk + j]) : 0u; }
                    m[i] = v;
                }
            }
        }
    }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        ep_signal(ctl, sig + n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d));
}

// Waits (one block) until every PE's blocks signalled this step: which 0 dispatch, 1 combine.
extern "C" __global__ void ep_wait(const ep_params* P, int which) {
    __shared__ rshmem_u64 s_c;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n;
    if (threadIdx.x == 0) { s_c = ctl[EP_CTL_DWAIT + which] + 1; ctl[EP_CTL_DWAIT + which] = s_c; }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig + (1 + which) * n;
    for (int s = threadIdx.x; s < n; s += blockDim.x)
        rshmemi_wait64(sig + s, RSHMEM_CMP_GE, s_c * (rshmem_u64)P->grid);
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        ep_abort_if_failed(ctl);
    }
}

// Received tokens into expert-major rows `out` (one row per (token, local slot)); fills the
// handle: row_src[r] = received row * kmax + slot, tok_rows[received row * kmax + slot] = r.
extern "C" __global__ void __launch_bounds__(512) ep_permute(const ep_params* P, ep_t* out) {
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, El = P->el;
    const unsigned lane = threadIdx.x & 31;
    const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
    const unsigned* off = (const unsigned*)P->expert_off;
    unsigned* fill = (unsigned*)P->fill;
    unsigned* row_src = (unsigned*)P->row_src;
    int* tok_rows = (int*)P->tok_rows;
    const long long lo = (long long)me * El;
    long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long g = gw; g < n * C; g += nw) {
        long long s = g / C, i = g % C;
        if (i >= recv_cnt[s]) continue;
        const unsigned* m = (const unsigned*)P->recv_meta + g * RMW;
        for (long long j = 0; j < K; j++) {
            long long id = (long long)(int)m[1 + j];
            int r = -1;
            if (id >= lo && id < lo + El) {
                long long e = id - lo;
                unsigned rr = 0;
                if (lane == 0) rr = off[e] + atomicAdd(&fill[e], 1u);
                rr = __shfl_sync(0xffffffffu, rr, 0);
                if (rr < off[e + 1]) {
                    r = (int)rr;
                    rshmemi_copy((ep_t*)out + (long long)r * H, (const ep_t*)P->recv_x + g * H, H * sizeof(ep_t), lane, 32);
                    if (lane == 0) row_src[r] = (unsigned)(g * K + j);
                } else if (lane == 0) {
                    atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
                }
            }
            if (lane == 0) tok_rows[g * K + j] = r;
        }
    }
}

// 16-byte vectors of hidden elements, widened to f32.
#define EP_VEC (16 / sizeof(ep_t))
struct __align__(16) ep_vec { ep_t v[EP_VEC]; };

// Expert side of combine: for each received token, the weighted sum (slot order, f32) of the
// expert outputs of its local slots, rounded once, put as one row back to its source at
// comb[parity][this PE][position]. Then every block adds 1 to each source's combine signal.
extern "C" __global__ void __launch_bounds__(512) ep_csend(const ep_params* P, const ep_t* y) {
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K;
    const unsigned lane = threadIdx.x & 31;
    if (ctl[EP_CTL_GO]) {
        const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
        const int* tok_rows = (const int*)P->tok_rows;
        const long long parity = (long long)(ctl[EP_CTL_CWAIT] & 1);
        long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
        for (long long g = gw; g < n * C; g += nw) {
            long long s = g / C, i = g % C;
            if (i >= recv_cnt[s]) continue;
            const unsigned* m = (const unsigned*)P->recv_meta + g * RMW;
            ep_t* dst = (ep_t*)rshmem_ptr((ep_t*)P->comb + ((parity * n + me) * C + i) * H, ep_pe(P, (int)s));
            if ((H * sizeof(ep_t)) % 16 == 0 && (((unsigned long long)y | P->comb) & 15) == 0) {
                for (long long v = lane; v < H / (long long)EP_VEC; v += 32) {
                    float acc[EP_VEC];
                    for (int q = 0; q < (int)EP_VEC; q++) acc[q] = 0.f;
                    for (long long j = 0; j < K; j++) {
                        int r = tok_rows[g * K + j];
                        if (r < 0) continue;
                        float wj = __uint_as_float(m[1 + K + j]);
                        ep_vec a = ((const ep_vec*)(y + (long long)r * H))[v];
                        for (int q = 0; q < (int)EP_VEC; q++) acc[q] += wj * ep_f(a.v[q]);
                    }
                    ep_vec o;
                    for (int q = 0; q < (int)EP_VEC; q++) ep_from(acc[q], &o.v[q]);
                    ((ep_vec*)dst)[v] = o;
                }
            } else {
                for (long long h = lane; h < H; h += 32) {
                    float acc = 0.f;
                    for (long long j = 0; j < K; j++) {
                        int r = tok_rows[g * K + j];
                        if (r < 0) continue;
                        acc += __uint_as_float(m[1 + K + j]) * ep_f(y[(long long)r * H + h]);
                    }
                    ep_from(acc, &dst[h]);
                }
            }
        }
    }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        ep_signal(ctl, sig + 2 * n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d));
}

// Source side of combine: out[t] = sum over destination PEs (ascending) of the rows they sent
// back for token t, in f32, rounded once; tokens without experts get zeros.
extern "C" __global__ void __launch_bounds__(512) ep_crecv(const ep_params* P, ep_t* out) {
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const int n = (int)P->n;
    const long long H = P->hidden, C = P->cap;
    const int T = (int)ctl[EP_CTL_TOKENS];
    const long long parity = (long long)((ctl[EP_CTL_CWAIT] - 1) & 1);
    const int* tok_pos = (const int*)P->tok_pos;
    const ep_t* comb = (const ep_t*)P->comb + parity * n * C * H;
    const unsigned lane = threadIdx.x & 31;
    long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    const bool vec = (H * sizeof(ep_t)) % 16 == 0 && (((unsigned long long)out | P->comb) & 15) == 0;
    for (long long t = gw; t < T; t += nw) {
        if (vec) {
            for (long long v = lane; v < H / (long long)EP_VEC; v += 32) {
                float acc[EP_VEC];
                for (int q = 0; q < (int)EP_VEC; q++) acc[q] = 0.f;
                for (int d = 0; d < n; d++) {
                    int pos = tok_pos[t * n + d];
                    if (pos < 0) continue;
                    ep_vec a = ((const ep_vec*)(comb + (d * C + pos) * H))[v];
                    for (int q = 0; q < (int)EP_VEC; q++) acc[q] += ep_f(a.v[q]);
                }
                ep_vec o;
                for (int q = 0; q < (int)EP_VEC; q++) ep_from(acc[q], &o.v[q]);
                ((ep_vec*)(out + t * H))[v] = o;
            }
        } else {
            for (long long h = lane; h < H; h += 32) {
                float acc = 0.f;
                for (int d = 0; d < n; d++) {
                    int pos = tok_pos[t * n + d];
                    if (pos >= 0) acc += ep_f(comb[(d * C + pos) * H + h]);
                }
                ep_from(acc, &out[t * H + h]);
            }
        }
    }
}

// A stand-in expert computation: y[r] = x[r] * factor[local expert of row r], for the rows of
// the last dispatch (count read on the device, so it can be captured in a graph).
extern "C" __global__ void __launch_bounds__(512) ep_scale_experts(const ep_params* P, const ep_t* x, ep_t* y, const float* factor) {
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const long long H = P->hidden, El = P->el;
    const unsigned* off = (const unsigned*)P->expert_off;
    const long long rows = (long long)off[El];
    const unsigned lane = threadIdx.x & 31;
    long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long r = gw; r < rows; r += nw) {
        long long lo = 0, hi = El;  // expert e with off[e] <= r < off[e+1]
        while (hi - lo > 1) { long long mid = (lo + hi) / 2; if ((long long)off[mid] <= r) lo = mid; else hi = mid; }
        float f = factor[lo];
        for (long long h = lane; h < H; h += 32) ep_from(ep_f(x[r * H + h]) * f, &y[r * H + h]);
    }
}
