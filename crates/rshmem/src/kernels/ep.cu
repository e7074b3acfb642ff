// MoE dispatch/combine kernels (rshmem::cuda::ep). Compiled by NVRTC after the device header,
// once per (hidden type EP_T, top-k id type EP_ID).
//
// Every buffer address in `ep_params` is this PE's symmetric address; peers' copies are reached
// with rshmem_ptr. Step order on one stream (see ep.rs for why each area is safe to reuse):
//   dispatch: ep_layout (grid) -> ep_send (grid) -> ep_dwait (1 block) -> ep_pstream (grid,
//             expert-major buffers) or ep_permute (grid, token-major: the index only)
//             (the last three launched as programmatic dependents: ep_send and ep_dwait start
//             on ep_layout's gate, ep_pstream on ep_dwait's and moves rows while ep_send still
//             runs, ep_permute with rshmemi_grid_dep_wait; a kernel's predecessor lets it
//             become resident only once that predecessor no longer waits for other PEs, except
//             that ep_pstream's blocks wait for rows: ep_send runs 128 threads per block for
//             expert-major buffers, so they fit beside it and never keep it out)
//   combine:  ep_csend (grid) -> ep_cwait (1 block) -> ep_crecv (grid), all three likewise;
//   combine_tokens pulling: ep_cready (1 block) -> ep_cpull (grid) -> ep_cdone (1 block)
//             [-> ep_ccopy (grid) where out overlaps y], likewise
// Only one block of a kernel waits for peers (ep_layout's last one, the one-block kernels),
// and ep_pstream's blocks only beside a resident ep_send, so kernels that spin never keep out
// the kernels they wait for.
#ifndef EP_T
#define EP_T rshmem_bfloat16
#endif
#ifndef EP_ID
#define EP_ID int
#endif
typedef EP_T ep_t;
typedef EP_ID ep_id;

// Most PEs of an EP team: destinations are bits of a 64-bit mask (ep_tok_mask). ep.rs
// (MAX_GPU_EP_PES) refuses bigger teams.
#define EP_MAX_PES 64

// Parameter block (u64 words; written by the host once per buffer). Keep in step with ep.rs.
struct ep_params {
    unsigned long long recv_x, recv_meta, comb, rec, sig, ctl, recv_cnt, expert_off, fill, tok_pos,
        row_src, tok_rows, acc, prog;
    long long n, me, start, stride, cap, hidden, kmax, el, experts, max_tokens, rmax, grid, sentinel;
};

// EP_STAMPS 1 (a compile option for measurements, through RSHMEM_CUDA_EP_NVRTC_OPTS): clock
// stamps (%globaltimer, ns) of the last dispatch and combine in ctl words 16 + k: 0 layout
// start (block 0), 1 layout done (the last block), 2 peers ready, 3 records and their signals
// out, 4 send start (block 0), 5 send end (the latest block), 6 peers' records in, 7 peers' rows
// in, 8 dispatch wait end, 9 permute start, 10 permute end, 11 csend start, 12 csend end,
// 13 combine wait end, 14 crecv start, 15 crecv end (the pull combine: 11 ep_cready start, 12
// its ready signals out, 13 its wait end, 14-15 ep_cpull), then the latest of ep_layout's blocks:
// 16 start, 17 tokens counted, 18 counts fenced, and 19 the latest of ep_pstream's blocks'
// starts (9 and 10 are ep_pstream's start and end with expert-major buffers), 20 ep_dwait's
// gate open, 21 ep_dwait's start, 22 ep_cwait's start, 23 the latest of ep_crecv's block starts;
// printed by the benchmark's RSHMEM_EP_BREAKDOWN. Compiled away by default.
#ifndef EP_STAMPS
#define EP_STAMPS 0
#endif
#define EP_STAMP(ctl, k) \
    do { if (EP_STAMPS) ((volatile unsigned long long*)(ctl))[16 + (k)] = rshmemi_now(); } while (0)
// Block 0's thread 0 (a grid kernel's start).
#define EP_STAMP_FIRST(ctl, k) \
    do { if (EP_STAMPS && blockIdx.x == 0 && threadIdx.x == 0) EP_STAMP(ctl, k); } while (0)
// Every block's thread 0 after the block's barrier, the latest kept (a grid kernel's end).
#define EP_STAMP_LAST(ctl, k)                                                                      \
    do {                                                                                           \
        if (EP_STAMPS) {                                                                           \
            __syncthreads();                                                                       \
            if (threadIdx.x == 0)                                                                  \
                atomicMax((unsigned long long*)(ctl) + 16 + (k), (unsigned long long)rshmemi_now()); \
        }                                                                                          \
    } while (0)

// Thread 0 of every block, the latest kept (no barrier: a block's own phase end).
#define EP_STAMP_MAX(ctl, k) \
    do { if (EP_STAMPS && threadIdx.x == 0) atomicMax((unsigned long long*)(ctl) + 16 + (k), (unsigned long long)rshmemi_now()); } while (0)

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
// ep_send's gate: 0 from ep_layout's block 0, 1 once ep_layout's last block has every block's
// counts and the step's decision (ep_send starts on it, not on ep_layout's end).
#define EP_CTL_GATE 9
// Combines by the push path (ep_cwait's count; EP_CTL_CWAIT counts every combine).
#define EP_CTL_CPUSH 10
// ep_pstream's gate: 0 from ep_layout's block 0, 1 once ep_dwait has taken the step's decision
// and filled the offsets (ep_pstream starts on it, while ep_send still runs); and its blocks'
// ticket (zeroed by ep_dwait before the gate opens).
#define EP_CTL_PGATE 11
#define EP_CTL_PTICKET 12
// ep_pstream's row tickets (zeroed by ep_dwait before the gate opens).
#define EP_CTL_RTICKET 13
// sig words (this PE's, n each; member s writes word s of a group): records (set to the epoch),
// data (ep_send's blocks add 1), combine (ep_csend's blocks add 1), ready (set to the epoch),
// then the pull combine's: its ready and done (set to the combine's number, ctl[CWAIT]) and the
// heap offset of the member's y (written before its ready signal).
#define EP_SIG_CREADY 4
#define EP_SIG_CDONE 5
#define EP_SIG_YOFF 6
#define EP_SIG_GROUPS 7
// acc words (u32, this PE only): E (token, slot) pairs per expert, n tokens per destination, the
// invalid-input flag and the blocks' ticket (all four added to by ep_layout's blocks, zeroed by
// ep_dwait), then each block's count per destination ([grid][n], written by ep_layout).
// error bits
#define EP_ERR_MINE 1ull
#define EP_ERR_PEER 2ull
#define EP_ERR_CAPACITY 4ull
#define EP_ERR_CORRUPT 8ull
// A device wait of this step timed out on this PE or on a PE that signalled it: what follows the
// wait was not used (nothing combined; ep_pstream may have moved the rows that were in before
// it) and every later signal of this PE carries the
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

// Adds `v` (1 unless given) to PE `pe`'s counter `sig` (this PE's symmetric address) after this
// thread's barrier with its block; an aborted PE first puts the abort bit into the peer's flags
// (ordered before the signal by the release).
__device__ __forceinline__ void ep_signal(const unsigned long long* ctl, rshmem_u64* sig, rshmem_u64* peer_ctl_err, int pe,
                                          rshmem_u64 v = 1) {
    asm volatile("fence.sc.sys;" ::: "memory");
    if (((const volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)
        atomicOr_system((unsigned long long*)rshmem_ptr(peer_ctl_err, pe), EP_ERR_ABORT);
    rshmemi_red_add_release((rshmem_u64*)rshmem_ptr(sig, pe), v);
}
// As ep_signal, setting PE `pe`'s word `sig` to `v` instead of adding 1.
__device__ __forceinline__ void ep_signal_set(const unsigned long long* ctl, rshmem_u64* sig, rshmem_u64 v, int pe) {
    asm volatile("fence.sc.sys;" ::: "memory");
    if (((const volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)
        atomicOr_system((unsigned long long*)rshmem_ptr((const void*)(ctl + EP_CTL_ERR), pe), EP_ERR_ABORT);
    rshmemi_st_release((rshmem_u64*)rshmem_ptr(sig, pe), v);
}

__device__ __forceinline__ int ep_pe(const ep_params* P, int d) { return (int)(P->start + d * P->stride); }
// The block waits until word s of `words` (this PE's signal group) is at least `v` for every
// team member s; then thread 0 fences, stops the step on a timeout or an abort
// (ep_abort_if_failed) and, with EP_STAMPS, stamps `stamp` (< 0: none).
__device__ __forceinline__ void ep_wait_every_pe(const ep_params* P, unsigned long long* ctl, const rshmem_u64* words,
                                                 rshmem_u64 v, int stamp) {
    for (int s = threadIdx.x; s < (int)P->n; s += blockDim.x) rshmemi_wait64(words + s, RSHMEM_CMP_GE, v, ep_pe(P, s));
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        ep_abort_if_failed(ctl);
        if (stamp >= 0) EP_STAMP(ctl, stamp);
    }
}

__device__ __forceinline__ unsigned ep_lanemask_lt() { unsigned m; asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m)); return m; }

// Warp 0 of a block (all 32 lanes): s_wbase[q] = *cnt + the sum of s_wt[0..q) over the block's
// `nwarps` warps, then *cnt += the total (a shuffle scan instead of a serial loop).
__device__ __forceinline__ void ep_scan_warps(const unsigned* s_wt, unsigned* s_wbase, unsigned* cnt, unsigned nwarps,
                                              unsigned lane) {
    const unsigned v = lane < nwarps ? s_wt[lane] : 0;
    unsigned incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (unsigned)o) incl += u;
    }
    const unsigned base = *cnt;
    s_wbase[lane] = base + incl - v;
    __syncwarp();
    if (lane == 31) *cnt = base + incl;
}

// Block-wide exclusive scan (blockDim.x a multiple of 32, at most 1024 threads, all calling):
// each thread passes the sum of its segment, gets the sum of the segments before it; *total
// (shared) gets the sum of all. A shuffle scan in each warp, then of the warp sums (two
// barriers, not two per doubling step).
__device__ __forceinline__ unsigned ep_block_excl_scan(unsigned v, unsigned* s_warp, unsigned* total) {
    const unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
    unsigned incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= (unsigned)o) incl += u;
    }
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const unsigned x = lane < nwarps ? s_warp[lane] : 0;
        unsigned c = x;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned u = __shfl_up_sync(0xffffffffu, c, o);
            if (lane >= (unsigned)o) c += u;
        }
        __syncwarp();
        s_warp[lane] = c - x;
        if (lane == 31) *total = c;
    }
    __syncthreads();
    const unsigned r = s_warp[warp] + incl - v;
    __syncthreads();  // s_warp is free again when this returns
    return r;
}

// Destinations of token t (bit d: team member d serves one of its experts); *bad is set for an
// id outside `-1`, `0..E`; with `pairs` (shared memory, not null) also for a used slot's weight
// that is not finite, and the token's (token, slot) pairs are counted per expert there. A
// token's ids and weights are loaded before any of them is looked at (one load latency per 8
// slots).
__device__ __forceinline__ unsigned long long ep_tok_mask(const ep_id* ids, const float* w, long long t, int topk, int E,
                                                          int El, unsigned* pairs, int* bad) {
    unsigned long long mask = 0;
    for (int j0 = 0; j0 < topk; j0 += 8) {
        long long idv[8];
        unsigned wv[8];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            if (j0 + q < topk) {
                idv[q] = (long long)ids[t * topk + j0 + q];
                if (pairs) wv[q] = __float_as_uint(w[t * topk + j0 + q]);
            }
        }
#pragma unroll
        for (int q = 0; q < 8; q++) {
            if (j0 + q >= topk) break;
            const long long id = idv[q];
            if (id == -1) continue;
            if (id < 0 || id >= E) { *bad = 1; continue; }
            mask |= 1ull << ((unsigned)id / (unsigned)El);
            if (pairs) {
                if ((wv[q] & 0x7f800000u) == 0x7f800000u) *bad = 1;  // inf or nan
                atomicAdd(&pairs[id], 1u);
            }
        }
    }
    return mask;
}

// Tokens of ep_layout's block b of G: [T*b/G, T*(b+1)/G), in ep_layout and ep_send alike.
__device__ __forceinline__ void ep_range_tokens(int T, long long b, long long G, int* t0, int* t1) {
    *t0 = (int)((long long)T * b / G);
    *t1 = (int)((long long)T * (b + 1) / G);
}

// Dispatch, step 1 (grid, one block per SM like ep_send; no block waits for another block).
// * Block 0 tells every PE that this PE's receive area, row records and records are free again
//   (every kernel of its previous step that reads them ran before this one on its stream): a
//   ready signal carrying the device-side call number (epoch). A PE that gave up already (a
//   wait of an earlier step timed out here, or a peer's abort arrived) puts the abort bit into
//   every peer first.
// * Every block checks its tokens (ids `-1` or `0..E`, finite weights of used slots), counts
//   their (token, slot) pairs per expert in shared memory (dynamic: `experts` unsigned), adds
//   those and its count per destination PE to this PE's accumulators (`acc`, zeroed by the
//   previous ep_dwait) and writes its own count per destination for ep_send's positions. One
//   block for all tokens (the former ep_prep) took about 19 us at T = 4096 on H200, the grid
//   with a global atomic per slot 10 to 13, with the pairs counted in shared memory about 5.
// * The block that finishes last (a ticket) waits for every PE's ready signal, then puts one
//   record to every PE (status, count for it, tokens, top_k, the pairs of its local experts)
//   with a signal carrying the epoch. A PE that gave up (here or before) writes none (a peer may
//   still read those of the step given up on) and carries the abort bit instead; ctl[GO] says
//   whether ep_send may move rows. No PE waits for another's records: ep_send moves rows at
//   once, and ep_dwait takes the common decision on whether they are used.
// `invalid`: the host checks failed; no pointer is read and the record says invalid.
extern "C" __global__ void __launch_bounds__(512) ep_layout(const ep_params* P, const ep_id* ids, const float* w, int T, int topk,
                                                            int capturable, int invalid) {
    extern __shared__ unsigned s_pairs[];
    __shared__ unsigned s_cnt[EP_MAX_PES];
    __shared__ int s_bad, s_last, s_gone;
    __shared__ rshmem_u64 s_status;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, E = (int)P->experts, El = (int)P->el;
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31;
    const rshmem_u64 epoch = ((volatile unsigned long long*)ctl)[EP_CTL_EPOCH] + 1;
    unsigned* acc = (unsigned*)P->acc;
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    rshmem_u64* ready = sig + 3 * n;
    if (invalid) T = 0;
    EP_STAMP_FIRST(ctl, 0);
    EP_STAMP_MAX(ctl, 16);
    for (int d = tid; d < n; d += nth) s_cnt[d] = 0;
    for (int e = tid; e < E; e += nth) s_pairs[e] = 0;
    if (tid == 0) s_bad = 0;
    // ep_send's and ep_pstream's gates close (the previous step's kernels ended before this
    // kernel began).
    if (blockIdx.x == 0 && tid == 0) {
        ((volatile unsigned long long*)ctl)[EP_CTL_GATE] = 0;
        ((volatile unsigned long long*)ctl)[EP_CTL_PGATE] = 0;
    }
    __syncthreads();
    // The last warp of block 0 signals while the first ones count tokens (when warp 0 sent them,
    // its fences delayed block 0's count by about 3 us).
    if (blockIdx.x == 0 && (tid >> 5) == (nth >> 5) - 1) {
        const bool gone = ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT) != 0;
        // This PE's "records in" words (expert-major buffers) are zero again before any peer may
        // write them (after the ready signal below; the previous step's writers were all seen
        // by its ep_dwait, the previous step's readers ended before this kernel began).
        if (P->prog) {
            const int words = n * (int)P->grid;
            for (int i = lane; i < words; i += 32) ((volatile rshmem_u64*)P->prog)[i] = 0;
            __syncwarp();
        }
        for (int d = lane; d < n; d += 32) {
            // The abort bit first (ordered before the signal by its fence and release).
            if (gone) atomicOr_system((unsigned long long*)rshmem_ptr(ctl + EP_CTL_ERR, ep_pe(P, d)), EP_ERR_ABORT);
            rshmemi_signal_op_collective(ready + me, epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d));
        }
    }
    int t0, t1;
    ep_range_tokens(T, blockIdx.x, gridDim.x, &t0, &t1);
    for (int t = t0 + (int)tid; t < t1; t += nth) {
        int bad = 0;
        const unsigned long long m = ep_tok_mask(ids, w, t, topk, E, El, s_pairs, &bad);
        if (bad) s_bad = 1;
        for (unsigned long long mm = m; mm; mm &= mm - 1) atomicAdd(&s_cnt[__ffsll((long long)mm) - 1], 1u);
    }
    __syncthreads();
    EP_STAMP_MAX(ctl, 17);
    // The block's pairs into the accumulators, one fire-and-forget add per expert and thread:
    // global atomics in the token loop (8 per token, each waited for, on 256 contended words)
    // made the count take about 10 us.
    for (int e = tid; e < E; e += nth) {
        const unsigned c = s_pairs[e];
        if (c) asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(acc + e), "r"(c) : "memory");
    }
    unsigned* bcnt = acc + E + n + 2;
    for (int d = tid; d < n; d += nth) {
        bcnt[(long long)blockIdx.x * n + d] = s_cnt[d];
        if (s_cnt[d]) atomicAdd(&acc[E + d], s_cnt[d]);
    }
    if (tid == 0 && s_bad) atomicOr(&acc[E + n], 1u);
    __threadfence();
    __syncthreads();
    EP_STAMP_MAX(ctl, 18);
    if (tid == 0) s_last = atomicAdd(&acc[E + n + 1], 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    // The last block: every block's counts are in (each fenced before its ticket).
    __threadfence();
    EP_STAMP(ctl, 1);
    const volatile unsigned* va = (const volatile unsigned*)acc;
    if (tid == 0) {
        rshmem_u64 st = 0;
        if (invalid || va[E + n]) st = EP_ST_INVALID;
        else if (capturable)
            for (int d = 0; d < n; d++)
                if (va[E + d] > (unsigned)P->cap) { st = EP_ST_CAPACITY | ((rshmem_u64)d << 8) | ((rshmem_u64)va[E + d] << 32); break; }
        s_status = st;
    }
    for (int s = tid; s < n; s += nth) rshmemi_wait64(ready + s, RSHMEM_CMP_GE, epoch, ep_pe(P, s));
    __syncthreads();
    if (tid == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        EP_STAMP(ctl, 2);
        const bool gone = ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT) != 0;
        s_gone = gone;
        ctl[EP_CTL_GO] = gone ? 0 : 1;
        ctl[EP_CTL_EPOCH] = epoch;
        ctl[EP_CTL_TOKENS] = (rshmem_u64)T;
        ctl[EP_CTL_TOPK] = (rshmem_u64)topk;
        // The gate opens: every block's counts (each fenced before its ticket) and the words
        // above are ordered before it.
        asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(ctl + EP_CTL_GATE), "l"(1ull) : "memory");
    }
    __syncthreads();
    // ep_send may become resident now (it starts on the gate, while this block still puts the
    // records): this block no longer waits for other PEs, and the other blocks have exited.
    rshmemi_grid_dep_launch();
    const long long RW = EP_REC_FIXED + El;
    rshmem_u64* rec = (rshmem_u64*)P->rec;
    for (int i = tid; i < n * El && !s_gone; i += nth) {
        const int d = i / El, e = i % El;
        rshmem_u64* r = (rshmem_u64*)rshmem_ptr(rec + me * RW + EP_REC_FIXED + e, ep_pe(P, d));
        *(volatile rshmem_u64*)r = va[i];
    }
    for (int d = tid; d < n && !s_gone; d += nth) {
        rshmem_u64* r = (rshmem_u64*)rshmem_ptr(rec + me * RW, ep_pe(P, d));
        ((volatile rshmem_u64*)r)[0] = s_status;
        ((volatile rshmem_u64*)r)[1] = va[E + d];
        ((volatile rshmem_u64*)r)[2] = (rshmem_u64)T;
        ((volatile rshmem_u64*)r)[3] = (rshmem_u64)topk;
    }
    __syncthreads();
    for (int d = tid; d < n; d += nth) {
        if (s_gone) atomicOr_system((unsigned long long*)rshmem_ptr(ctl + EP_CTL_ERR, ep_pe(P, d)), EP_ERR_ABORT);
        rshmemi_signal_op_collective(sig + me, epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d));
    }
    if (tid == 0) EP_STAMP(ctl, 3);
}

// Dispatch, step 3 (one block): waits for every PE's record (signal = the epoch) and takes the
// common decision from the records: invalid input anywhere, a count above the capacity, a
// record that cannot be right, or an abort, and no PE uses a row of this step (ctl[GO] = 0, the
// error latched for Buffer::check). Otherwise fills the receive counts and the expert offsets
// (an exclusive scan over local experts of the pairs summed over sources) and zeroes the
// experts' fill counters for ep_permute. Then waits for every PE's send blocks (data signals).
extern "C" __global__ void __launch_bounds__(1024) ep_dwait(const ep_params* P) {
    __shared__ rshmem_u64 s_c, s_epoch;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, El = (int)P->el;
    const unsigned tid = threadIdx.x, nth = blockDim.x;
    // Starts while ep_send runs (it let this kernel in once it passed ep_layout's gate): the
    // gate, acquired here, orders the words ep_layout wrote before it.
    if (tid == 0) {
        EP_STAMP(ctl, 21);
        rshmemi_wait64((const rshmem_u64*)ctl + EP_CTL_GATE, RSHMEM_CMP_EQ, 1, me);
        s_c = ctl[EP_CTL_DWAIT] + 1;
        ctl[EP_CTL_DWAIT] = s_c;
        s_epoch = ctl[EP_CTL_EPOCH];
    }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int s = tid; s < n; s += nth) rshmemi_wait64(sig + s, RSHMEM_CMP_GE, s_epoch, ep_pe(P, s));
    __syncthreads();
    // The decision and the offsets from the records, while the rows are still arriving.
    const long long RW = EP_REC_FIXED + El;
    const rshmem_u64* rec = (const rshmem_u64*)P->rec;
    if (tid == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        EP_STAMP(ctl, 6);
        rshmem_u64 err = 0, info = 0;
        for (int s = 0; s < n; s++) {
            rshmem_u64 st = ((volatile const rshmem_u64*)rec)[s * RW];
            if (st == EP_ST_INVALID) { err |= (s == me) ? EP_ERR_MINE : EP_ERR_PEER; if (!info) info = (rshmem_u64)s; }
            else if ((st & 0xff) == EP_ST_CAPACITY) { err |= EP_ERR_CAPACITY; info = ((st >> 8) & 0xffffff) | ((rshmem_u64)s << 24) | (st & 0xffffffff00000000ull); }
            else if (((volatile const rshmem_u64*)rec)[s * RW + 1] > (rshmem_u64)P->cap) err |= EP_ERR_CORRUPT;
        }
        // A timed-out wait above read records that may not have arrived; an abort latched by an
        // earlier step (or ep_layout's) stays until the host clears it.
        if (ep_timed_out() || (((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)) err |= EP_ERR_ABORT;
        if (err) {
            ctl[EP_CTL_GO] = 0;
            atomicOr_system(&ctl[EP_CTL_ERR], err);  // peers' signals may put an abort bit concurrently
            ctl[EP_CTL_INFO] = info;
        } else {
            ctl[EP_CTL_GO] = 1;
        }
    }
    __syncthreads();
    if (ctl[EP_CTL_GO]) {
        unsigned* recv_cnt = (unsigned*)P->recv_cnt;
        unsigned* off = (unsigned*)P->expert_off;
        unsigned* fill = (unsigned*)P->fill;
        for (int s = tid; s < n; s += nth) recv_cnt[s] = (unsigned)((volatile const rshmem_u64*)rec)[s * RW + 1];
        for (int e = tid; e < El; e += nth) fill[e] = 0;
        // Each thread a segment of experts, not El * n dependent volatile loads by one thread.
        __shared__ unsigned s_part[32];
        __shared__ unsigned s_total;
        const int seg = (El + (int)nth - 1) / (int)nth, e0 = (int)tid * seg, e1 = min(e0 + seg, El);
        unsigned mine = 0;
        for (int e = e0; e < e1; e++)
            for (int s = 0; s < n; s++) mine += (unsigned)((volatile const rshmem_u64*)rec)[s * RW + EP_REC_FIXED + e];
        unsigned acc = ep_block_excl_scan(mine, s_part, &s_total);
        for (int e = e0; e < e1; e++) {
            off[e] = acc;
            for (int s = 0; s < n; s++) acc += (unsigned)((volatile const rshmem_u64*)rec)[s * RW + EP_REC_FIXED + e];
        }
        if (tid == 0) {
            const unsigned total = s_total;
            off[El] = total;
            if (total > (unsigned)P->rmax) { ctl[EP_CTL_GO] = 0; atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT); }
            ctl[EP_CTL_ROWS] = total;
        }
    }
    // The decision and the offsets are out: ep_pstream (expert-major buffers) starts on this
    // gate and moves rows as they come in, while this block waits for the last of them.
    __syncthreads();
    if (tid == 0) {
        EP_STAMP(ctl, 20);
        ctl[EP_CTL_PTICKET] = 0;
        ctl[EP_CTL_RTICKET] = 0;
        asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(ctl + EP_CTL_PGATE), "l"(1ull) : "memory");
    }
    // The next kernel may become resident now: ep_pstream waits for its gate and for rows
    // (never for this kernel's SM), ep_permute (token-major) for this kernel's end.
    rshmemi_grid_dep_launch();
    // Then every source's rows: a wait that times out, or an abort a peer put here before the
    // signals waited for, stops the step.
    for (int s = tid; s < n; s += nth) rshmemi_wait64(sig + n + s, RSHMEM_CMP_GE, s_c * (rshmem_u64)P->grid, ep_pe(P, s));
    __syncthreads();
    if (tid == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        EP_STAMP(ctl, 7);
        ep_abort_if_failed(ctl);
        EP_STAMP(ctl, 8);
    }
    // ep_layout's accumulators, zero for the next dispatch, once ep_send (which read them, and
    // waited for ep_layout's end) has ended.
    rshmemi_grid_dep_wait();
    unsigned* acc = (unsigned*)P->acc;
    for (int i = tid; i < (int)P->experts + n + 2; i += nth) acc[i] = 0;
}

// ----- vector machinery of the grid kernels -----
// Rows move as 16-byte vectors when the hidden row size is a multiple of 16 bytes and the
// pointers involved are 16-byte aligned (scalar fallback otherwise). A warp takes a chunk of
// 32 * U vectors of a row: every lane first issues its U independent loads (U vectors in flight
// per lane), then stores or accumulates them, so the memory system sees many requests per warp.
#ifndef EP_U
#define EP_U 8   // copies: vectors per lane per chunk
#endif
// ep_send: at most this many vectors per lane per chunk, chunks of equal size, and the stores of
// a chunk to the peers before the one to this PE (EP_SEND_PEERS_FIRST 0: ascending PEs). 2x
// H200, T = 4096, H = 7168 bf16, capturable+tokens dispatch: 6 and peers first 194.0-194.3 us;
// ascending PEs 194.4-194.9; 2, 3, 4, 5 and 8 (8: 256-vector chunks, the last half full, the
// former code) 195-198 us (BENCHMARKS.md).
#ifndef EP_SEND_U
#define EP_SEND_U 6
#endif
#ifndef EP_SEND_PEERS_FIRST
#define EP_SEND_PEERS_FIRST 1
#endif
// EP_SEND_SKIP_SELF 1 (measurements only: this PE's own rows are not written): what the copy of
// a PE's own rows costs ep_send.
#ifndef EP_SEND_SKIP_SELF
#define EP_SEND_SKIP_SELF 0
#endif
#define EP_UR 4  // reductions: vectors per lane per chunk (two rows' loads in flight: 8)
__device__ __forceinline__ rshmemi_v4 ep_ldnc(const rshmemi_v4* p) {
    rshmemi_v4 v;
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p));
    return v;
}
// Loads vectors v0 + 32*q (q < U, below nv) of `row` into r.
template <int U>
__device__ __forceinline__ void ep_load(rshmemi_v4 (&r)[U], const rshmemi_v4* row, int v0, int nv, bool nc) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) r[q] = nc ? ep_ldnc(row + v) : row[v];
    }
}
template <int U>
__device__ __forceinline__ void ep_store(rshmemi_v4* row, const rshmemi_v4 (&r)[U], int v0, int nv) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) row[v] = r[q];
    }
}
__device__ __forceinline__ bool ep_al16(unsigned long long a) { return (a & 15) == 0; }
// The scalar fallback (rows of a size or alignment the vector path does not take), kept out of
// line so it does not add to the vector path's registers.
__device__ __noinline__ void ep_copy_row(void* d, const void* s, long long bytes, unsigned lane) {
    rshmemi_copy(d, s, (size_t_rshmem)bytes, lane, 32);
}

// ----- the sentinel: rows that announce themselves -----
// The expert-major dispatch's receive area and the split combine's combine area hold the
// sentinel (every 32-bit word all ones) where no row is (see ep_pstream and ep_csplit); their
// senders never store an all-ones element (ep_canon), and an element is written at once, so a
// reader that finds no sentinel in a vector has the sender's whole vector. The split combine's
// summers check 32-bit words (their senders store whole vectors), the dispatch's readers
// elements (a sender off 16-byte alignment stores single elements).
#define EP_SENTINEL 0xffffffffu
// word w with no all-ones element (16-bit types: per half; an all-ones element is a NaN, and
// clearing its sign bit keeps it one).
__device__ __forceinline__ unsigned ep_canon(unsigned w) {
    if (sizeof(ep_t) == 2) {
        if ((w & 0xffffu) == 0xffffu) w &= ~0x8000u;
        if ((w >> 16) == 0xffffu) w &= ~0x80000000u;
    } else if (w == EP_SENTINEL) {
        w = 0x7fffffffu;
    }
    return w;
}
__device__ __forceinline__ rshmemi_v4 ep_canon4(rshmemi_v4 w) {
    w.a = ep_canon(w.a);
    w.b = ep_canon(w.b);
    w.c = ep_canon(w.c);
    w.d = ep_canon(w.d);
    return w;
}
// Mutations for tests only. EP_SPLIT_KEEP: bit 0, ep_csplit's summers leave the peers' rows as
// they found them; bit 1, so do ep_crecv and ep_ccopy. EP_DISPATCH_KEEP 1: ep_pstream leaves
// the received rows as it found them; EP_DISPATCH_WAIT 0: it takes them without waiting for
// them; EP_DISPATCH_REFILL 0: a dispatch that moves no row does not restore the sentinel.
#ifndef EP_SPLIT_KEEP
#define EP_SPLIT_KEEP 0
#endif
#ifndef EP_DISPATCH_KEEP
#define EP_DISPATCH_KEEP 0
#endif
#ifndef EP_DISPATCH_WAIT
#define EP_DISPATCH_WAIT 1
#endif
#ifndef EP_DISPATCH_REFILL
#define EP_DISPATCH_REFILL 1
#endif
template <int S> struct ep_bits_of;
template <> struct ep_bits_of<2> { typedef unsigned short t; };
template <> struct ep_bits_of<4> { typedef unsigned t; };
typedef ep_bits_of<sizeof(ep_t)>::t ep_bits;
// Stores the sentinel into vectors v0 + 32 q (below nv) of `row`.
template <int U>
__device__ __forceinline__ void ep_put_sentinel(rshmemi_v4* row, int v0, int nv) {
    const rshmemi_v4 snt = {EP_SENTINEL, EP_SENTINEL, EP_SENTINEL, EP_SENTINEL};
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) row[v] = snt;
    }
}

__device__ __forceinline__ rshmemi_v4 ep_ldvol(const rshmemi_v4* p) {
    rshmemi_v4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bool ep_has_sentinel(const rshmemi_v4& v) {
    return v.a == EP_SENTINEL || v.b == EP_SENTINEL || v.c == EP_SENTINEL || v.d == EP_SENTINEL;
}
// Whether an element of v is the sentinel (16-bit types: a half all ones): for rows whose
// senders may store single elements (the dispatch's).
__device__ __forceinline__ bool ep_word_has_snt(unsigned w) {
    return sizeof(ep_t) == 2 ? ((w & 0xffffu) == 0xffffu || (w >> 16) == 0xffffu) : w == EP_SENTINEL;
}
__device__ __forceinline__ bool ep_has_snt_elem(const rshmemi_v4& v) {
    return ep_word_has_snt(v.a) || ep_word_has_snt(v.b) || ep_word_has_snt(v.c) || ep_word_has_snt(v.d);
}
// The split combine's summers' wait: vectors v0 + 32 q (below nv) of a peer's row, loaded until
// none holds the sentinel, then, with `back`, the sentinel stored back. A timeout flags the PE
// (`pe`) and gives up (the step is reported failed; after a failure on this PE later waits give
// up at once).
template <int U>
__device__ __forceinline__ void ep_take_row(rshmemi_v4 (&r)[U], rshmemi_v4* row, int v0, int nv, int pe, bool back) {
    unsigned miss = 0;
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) {
            r[q] = ep_ldvol(row + v);
            if (ep_has_sentinel(r[q])) miss |= 1u << q;
        }
    }
    if (miss && !rshmemi_failed()) {
        const rshmem_u64 t0 = rshmemi_now();
        unsigned spins = 0;
        while (miss) {
#pragma unroll
            for (int q = 0; q < U; q++)
                if (miss & (1u << q)) {
                    r[q] = ep_ldvol(row + v0 + 32 * q);
                    if (!ep_has_sentinel(r[q])) miss &= ~(1u << q);
                }
            if (miss && (++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout(pe);
                break;
            }
        }
    }
    if (back) ep_put_sentinel<U>(row, v0, nv);
}
// One thread waits, a load about every 0.1 us, until vector v of `row` has no sentinel element
// (a timeout flags the PE `pe`).
__device__ __forceinline__ void ep_sleep_until_vec(const rshmemi_v4* row, int v, int pe) {
    const rshmem_u64 t0 = rshmemi_now();
    while (ep_has_snt_elem(ep_ldvol(row + v))) {
        __nanosleep(100);
        if (rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
            rshmemi_flag_timeout(pe);
            break;
        }
    }
}
// The dispatch readers' slow path (kept out of line: the fast path's registers): lane 0 waits
// for vector `last` (the chunk's last, about the last to arrive), then every lane until none of
// its vectors v0 + 32 q (q < U, below nv) has a sentinel element: a few polling loads instead of
// whole chunks polled (the dispatch's readers polling whole chunks took the memory system from
// the rows themselves: 415 us against 279, 2x H200).
__device__ __noinline__ void ep_wait_chunk(const rshmemi_v4* row, int v0, int nv, int U, int last, int pe, unsigned lane) {
    if (lane == 0 && !rshmemi_failed() && ep_has_snt_elem(ep_ldvol(row + last))) ep_sleep_until_vec(row, last, pe);
    __syncwarp();
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv && !rshmemi_failed()) ep_sleep_until_vec(row, v, pe);
    }
    __syncwarp();
}
// A dispatch reader's take of a chunk of a peer's row (the whole warp): the vectors v0 + 32 q
// (below nv) loaded once; where any lane found a sentinel element, the warp waits
// (ep_wait_chunk, `last`: the chunk's last vector) and loads them again; with `back` the
// sentinel is stored back.
template <int U>
__device__ __forceinline__ void ep_take_chunk(rshmemi_v4 (&r)[U], rshmemi_v4* row, int v0, int nv, int last, int pe,
                                              bool back, unsigned lane) {
    bool miss = false;
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) {
            r[q] = ep_ldvol(row + v);
            miss |= ep_has_snt_elem(r[q]);
        }
    }
    if (EP_DISPATCH_WAIT && __any_sync(0xffffffffu, miss)) {
        ep_wait_chunk(row, v0, nv, U, last, pe, lane);
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = v0 + 32 * q;
            if (v < nv) r[q] = ep_ldvol(row + v);
        }
    }
    if (back) ep_put_sentinel<U>(row, v0, nv);
}
// One element of a peer's row (the scalar path), as ep_take_row: its bits.
__device__ __forceinline__ ep_bits ep_take_bits(ep_t* p, int pe, bool back, bool wait = true) {
    const ep_bits snt = (ep_bits)EP_SENTINEL;
    volatile ep_bits* q = (volatile ep_bits*)p;
    ep_bits b = *q;
    if (wait && b == snt && !rshmemi_failed()) {
        const rshmem_u64 t0 = rshmemi_now();
        unsigned spins = 0;
        while ((b = *q) == snt)
            if ((++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout(pe);
                break;
            }
    }
    if (back) *q = snt;
    return b;
}
__device__ __forceinline__ float ep_take_elem(ep_t* p, int pe) {
    ep_t v;
    *(ep_bits*)&v = ep_take_bits(p, pe, !(EP_SPLIT_KEEP & 1));
    return ep_f(v);
}
// An element's bits with no all-ones element (ep_canon, for one element).
__device__ __forceinline__ ep_bits ep_canon_bits(ep_bits b) {
    return b == (ep_bits)EP_SENTINEL ? (ep_bits)(b & (ep_bits)~(1u << (8 * sizeof(ep_t) - 1))) : b;
}

// Row records in (expert-major buffers: ep_params.prog, n * grid words per PE, word source *
// grid + block, zeroed by the receiver's ep_layout before its ready signal): once the row
// records of ep_layout's block b's tokens are written, ep_send tells each destination with one
// release, 1 << 63 | hi << 32 | lo: the block's positions there are lo..hi-1. The rows
// themselves announce their arrival (the sentinel): nothing is published or fenced per row.
__device__ __forceinline__ rshmem_u64 ep_records_in_word(long long hi, long long lo) {
    return (1ull << 63) | ((rshmem_u64)hi << 32) | (rshmem_u64)lo;
}
__device__ __forceinline__ void ep_red_max_release(rshmem_u64* p, rshmem_u64 v) {
    asm volatile("red.release.sys.global.max.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
// The scalar fallback of a row to a peer's receive area with no all-ones element (ep_canon).
__device__ __noinline__ void ep_copy_row_canon(ep_t* d, const ep_t* s, long long H, unsigned lane) {
    for (long long h = lane; h < H; h += 32) ((ep_bits*)d)[h] = ep_canon_bits(((const ep_bits*)s)[h]);
}

// Dispatch, step 2 (grid): every token once to each destination PE, into the destination's
// receive area at (this PE's slot) * cap + position, with its row record, unless a PE gave up
// (ctl[GO] from ep_layout) or the position is beyond the capacity (the record reports the
// overflow). Block i takes the tokens of ep_layout's blocks b0..b1-1 (one block when the grids
// match; the host may launch fewer, RSHMEM_EP_SEND_BLOCKS): their positions are the counts of
// the blocks before b0 (ep_layout wrote them) plus a scan within the range (tok_pos, which
// ep_crecv reads too). Rows move while the records are on their way: ep_dwait decides from the
// records whether any PE uses them. First the row records of every destination (expert-major
// buffers: then one "records in" word per (layout block, destination), see above); then units
// (token, chunk of the row): the chunk is loaded once into registers and stored to every
// destination of the token. Expert-major buffers: only to the peers (ep_pstream reads this
// PE's own rows from x), with no all-ones element (ep_canon: the receive area's sentinel).
// Every block then adds b1 - b0 to each destination's data signal for this PE (also when
// nothing moves, so the counters stay in step: ep_layout's grid is the same on every PE).
extern "C" __global__ void __launch_bounds__(512) ep_send(const ep_params* P, const ep_t* x, const ep_id* ids, const float* w) {
    __shared__ unsigned s_cnt[EP_MAX_PES];
    __shared__ unsigned s_wt[32];
    __shared__ unsigned s_wbase[32];
    __shared__ unsigned s_base[EP_MAX_PES];
    __shared__ int s_go;
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, E = (int)P->experts, El = (int)P->el;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, G = P->grid;
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = (nth + 31) / 32;
    // Starts on ep_layout's gate, not on ep_layout's end (about 9 us later at T = 4096: its
    // last block still puts the records and their signals). The gate is open by the time this
    // kernel is let in; the wait only acquires what ep_layout wrote before it.
    if (tid == 0) {
        rshmemi_wait64((const rshmem_u64*)ctl + EP_CTL_GATE, RSHMEM_CMP_EQ, 1, me);
        s_go = !ep_timed_out() && ctl[EP_CTL_GO] != 0;
    }
    __syncthreads();
    // ep_dwait (one block) may become resident now.
    rshmemi_grid_dep_launch();
    EP_STAMP_FIRST(ctl, 4);
    const int b0 = (int)(G * blockIdx.x / gridDim.x), b1 = (int)(G * (blockIdx.x + 1) / gridDim.x);
    if (s_go) {
        const int T = (int)ctl[EP_CTL_TOKENS], topk = (int)ctl[EP_CTL_TOPK];
        int* tok_pos = (int*)P->tok_pos;
        const unsigned* bcnt = (const unsigned*)P->acc + E + n + 2;
        rshmem_u64* prog = (rshmem_u64*)P->prog;
        const bool em = prog != nullptr;
        for (int d = tid; d < n; d += nth) s_cnt[d] = 0;
        __syncthreads();
        for (int i = tid; i < b0 * n; i += nth) {
            const unsigned c = bcnt[i];
            if (c) atomicAdd(&s_cnt[i % n], c);
        }
        __syncthreads();
        int t0, t1, tx;
        ep_range_tokens(T, b0, G, &t0, &tx);
        ep_range_tokens(T, b1 - 1, G, &tx, &t1);
        for (int d = tid; d < n; d += nth) s_base[d] = s_cnt[d];
        for (int base = t0; base < t1; base += nth) {
            const int t = base + (int)tid;
            int bad = 0;
            const unsigned long long mask = t < t1 ? ep_tok_mask(ids, w, t, topk, E, El, nullptr, &bad) : 0;
            for (int d = 0; d < n; d++) {
                const bool f = (mask >> d) & 1;
                const unsigned bal = __ballot_sync(0xffffffffu, f);
                if (lane == 0) s_wt[warp] = __popc(bal);
                __syncthreads();
                if (warp == 0) ep_scan_warps(s_wt, s_wbase, &s_cnt[d], nwarps, lane);
                __syncthreads();
                if (t < t1) tok_pos[(long long)t * n + d] = f ? (int)(s_wbase[warp] + __popc(bal & ep_lanemask_lt())) : -1;
                __syncthreads();
            }
        }
        // The row records, a warp per token.
        for (int t = t0 + (int)warp; t < t1; t += (int)nwarps) {
            for (int d = 0; d < n; d++) {
                const int pos = tok_pos[(long long)t * n + d];
                if (pos < 0 || pos >= C) continue;
                const long long row = me * C + pos;
                unsigned* m = (unsigned*)rshmem_ptr((unsigned*)P->recv_meta + row * RMW, ep_pe(P, d));
                for (long long i = lane; i < RMW; i += 32) {
                    unsigned v;
                    if (i == 0) v = (unsigned)t;
                    else if (i <= K) { long long j = i - 1; v = j < topk ? (unsigned)(int)ids[(long long)t * topk + j] : 0xffffffffu; }
                    else { long long j = i - 1 - K; v = j < topk ? __float_as_uint(w[(long long)t * topk + j]) : 0u; }
                    m[i] = v;
                }
            }
        }
        if (em) {
            // Every warp's records are written (the barrier), then one release per (layout
            // block, destination) puts them in the destination's view before its word.
            __syncthreads();
            for (int i = (int)tid; i < (b1 - b0) * n; i += (int)nth) {
                const int b = b0 + i / n, d = i % n;
                long long lo = s_base[d];
                for (int bb = b0; bb < b; bb++) lo += bcnt[(long long)bb * n + d];
                const long long hi = lo + bcnt[(long long)b * n + d];
                ep_red_max_release((rshmem_u64*)rshmem_ptr(prog + me * G + b, ep_pe(P, d)), ep_records_in_word(min(hi, C), min(lo, C)));
            }
        }
        const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)x | P->recv_x);
        const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
        // Chunks of about equal size (a multiple of 32 vectors, at most 32 * EP_SEND_U): H =
        // 7168 bf16 is 4 chunks of 192 vectors and one of 128.
        const long long nch = vec ? (nv + 32 * EP_SEND_U - 1) / (32 * EP_SEND_U) : 1;
        const long long chunk = vec ? ((nv + nch - 1) / nch + 31) / 32 * 32 : 0;
        const long long units = (long long)(t1 - t0) * nch;
        for (long long u = warp; u < units; u += nwarps) {
            const long long t = t0 + u / nch, c = u % nch;
            if (vec) {
                rshmemi_v4 r[EP_SEND_U];
                const int v0 = (int)(c * chunk) + (int)lane;
                const int lim = (int)min((long long)nv, (c + 1) * chunk);
                ep_load<EP_SEND_U>(r, (const rshmemi_v4*)(x + t * H), v0, lim, true);
                if (em) {
#pragma unroll
                    for (int q = 0; q < EP_SEND_U; q++) r[q] = ep_canon4(r[q]);
                }
                for (int dd = 0; dd < n; dd++) {
#if EP_SEND_PEERS_FIRST
                    const int d = dd + me + 1 < n ? dd + me + 1 : dd + me + 1 - n;  // this PE last
#else
                    const int d = dd;
#endif
                    const int pos = tok_pos[t * n + d];
                    if (pos < 0 || pos >= C || ((EP_SEND_SKIP_SELF || em) && d == me)) continue;
                    rshmemi_v4* dst = (rshmemi_v4*)rshmem_ptr((ep_t*)P->recv_x + (me * C + pos) * H, ep_pe(P, d));
                    ep_store<EP_SEND_U>(dst, r, v0, lim);
                }
            } else {
                for (int d = 0; d < n; d++) {
                    const int pos = tok_pos[t * n + d];
                    if (pos < 0 || pos >= C || (em && d == me)) continue;
                    ep_t* dst = (ep_t*)rshmem_ptr((ep_t*)P->recv_x + (me * C + pos) * H, ep_pe(P, d));
                    if (em) ep_copy_row_canon(dst, x + t * H, H, lane);
                    else ep_copy_row(dst, x + t * H, H * (long long)sizeof(ep_t), lane);
                }
            }
        }
    }
    // ep_layout's end (long past by now): ep_dwait waits for this kernel's end, so for both.
    rshmemi_grid_dep_wait();
    __syncthreads();
    EP_STAMP_LAST(ctl, 5);
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = tid; d < n && b1 > b0; d += nth)
        ep_signal(ctl, sig + n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d), (rshmem_u64)(b1 - b0));
}

// Combine's wait (one block): until every PE's ep_csend blocks signalled this step.
extern "C" __global__ void ep_cwait(const ep_params* P) {
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    if (threadIdx.x == 0) EP_STAMP(ctl, 22);
    rshmemi_grid_dep_wait();
    __shared__ rshmem_u64 s_c;
    const int n = (int)P->n;
    if (threadIdx.x == 0) {
        ctl[EP_CTL_CWAIT] += 1;  // every combine (the combine area's parity)
        s_c = ctl[EP_CTL_CPUSH] + 1;  // push combines: their blocks' signals
        ctl[EP_CTL_CPUSH] = s_c;
    }
    __syncthreads();
    ep_wait_every_pe(P, ctl, (const rshmem_u64*)P->sig + 2 * n, s_c * (rshmem_u64)P->grid, 13);
    // ep_crecv may become resident now (no wait for other PEs is left here).
    rshmemi_grid_dep_launch();
}

// Normal mode's readback (one block, after the last dispatch kernel): the first `words` control
// words of this PE's buffer (control words, receive counts, expert offsets) and then this PE's
// device error word into `host` (page-locked host memory mapped for the device), then the
// readback's number, which the host waits for: no copy-engine round trips, no stream
// synchronisation.
extern "C" __global__ void ep_readback(const ep_params* P, unsigned long long* host, int words, unsigned long long seq) {
    rshmemi_grid_dep_wait();
    const volatile unsigned long long* ctl = (const volatile unsigned long long*)P->ctl;
    for (int i = threadIdx.x; i < words; i += blockDim.x) host[i] = ctl[i];
    if (threadIdx.x == 0) host[words] = *(volatile rshmem_u64*)rshmemi_err_word();
    // Then the readback's number (`seq`), once every word above is visible to the host: the
    // host may read them as soon as it sees it, before the stream is done.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned long long*)(host + words + 1) = seq;
    }
}

// Most local experts whose per-block counts the token-major index keeps in shared memory
// (`-DEP_INDEX_EXPERTS=0` takes the one-atomic-per-pair path always, for tests).
#ifndef EP_INDEX_EXPERTS
#define EP_INDEX_EXPERTS 4096
#endif

// How ep_expand_row reads its row (see there).
#define EP_ROW_PLAIN 0
#define EP_ROW_PEER 1
#define EP_ROW_OWN 2
// ep_expand_row's element path (out of line: the vector path's registers). A peer's row is
// waited for whole first, its sentinel stored back once every row has it.
__device__ __noinline__ void ep_expand_row_scalar(ep_t* out, const ep_t* src, unsigned mask, int r, long long H, unsigned lane,
                                                  int how, bool back, int pe) {
    if (how == EP_ROW_PEER) {
        for (long long h = lane; h < H; h += 32) ep_take_bits((ep_t*)src + h, pe, false, EP_DISPATCH_WAIT);
        __syncwarp();
    }
    for (unsigned mm = mask; mm; mm &= mm - 1) {
        const int rb = __shfl_sync(0xffffffffu, r, __ffs(mm) - 1);
        if (how == EP_ROW_OWN) ep_copy_row_canon(out + (long long)rb * H, src, H, lane);
        else ep_copy_row(out + (long long)rb * H, src, H * (long long)sizeof(ep_t), lane);
    }
    if (back) {
        __syncwarp();
        for (long long h = lane; h < H; h += 32) ((volatile ep_bits*)src)[h] = (ep_bits)EP_SENTINEL;
    }
}

// ep_pstream: at most EP_PSTREAM_REGS registers per thread (its blocks of 448 threads fit beside
// ep_send's of 128, whose launch bounds give it at most 128, with room to spare) and
// EP_PSTREAM_U vectors per lane in flight. 2x H200, T = 4096, H = 7168 bf16, capturable
// expert-major dispatch (send / pstream threads, registers, U): 128 / 512, 96, 4: 244-247 us;
// 128 / 448, 96, 4: 244; 128 / 384, 128, 8: 255; 256 / 256, 128, 8: 329; 128 / 512, 96, 8:
// 276; 80 registers or U = 2: 246-248 (BENCHMARKS.md).
#ifndef EP_PSTREAM_REGS
#define EP_PSTREAM_REGS 96
#endif
#ifndef EP_PSTREAM_U
#define EP_PSTREAM_U 4
#endif
// Row `src` into rows `out + r_l * H` for the lanes l of `mask` (r: each lane's row), the whole
// warp: read once, chunk by chunk (vectors when `vec`), each chunk stored to every row. `how`:
// EP_ROW_PLAIN, a row in place; EP_ROW_PEER, a row a peer puts into this PE's receive area
// (waited for until no element is the sentinel; with `back` the sentinel is stored back);
// EP_ROW_OWN, this PE's own row read from x, canonical as the peers' rows arrive (ep_canon).
template <int U>
__device__ __forceinline__ void ep_expand_row(ep_t* out, const ep_t* src, unsigned mask, int r, long long H, bool vec,
                                              int nv, unsigned lane, int how = EP_ROW_PLAIN, bool back = false, int pe = 0) {
    if (!mask) return;
    back = back && how == EP_ROW_PEER && !EP_DISPATCH_KEEP;
    if (vec) {
        // The chunk loop runs as many times on every lane (its bound does not depend on the
        // lane): the shuffles below need the whole warp.
        for (int c0 = 0; c0 < nv; c0 += 32 * U) {
            const int v0 = c0 + (int)lane;
            rshmemi_v4 a[U];
            if (how == EP_ROW_PEER) {
                ep_take_chunk<U>(a, (rshmemi_v4*)src, v0, nv, min(c0 + 32 * U, nv) - 1, pe, back, lane);
            } else {
                ep_load<U>(a, (const rshmemi_v4*)src, v0, nv, false);
                if (how == EP_ROW_OWN) {
#pragma unroll
                    for (int q = 0; q < U; q++) a[q] = ep_canon4(a[q]);
                }
            }
            for (unsigned mm = mask; mm; mm &= mm - 1) {
                const int rb = __shfl_sync(0xffffffffu, r, __ffs(mm) - 1);
                ep_store<U>((rshmemi_v4*)(out + (long long)rb * H), a, v0, nv);
            }
        }
    } else {
        ep_expand_row_scalar(out, src, mask, r, H, lane, how, back, pe);
    }
}

// Received row g (source g / C, position g % C) into expert-major rows `out`, one per local slot
// (the whole warp): lane j takes slot j (its row placed by an atomic on the expert's fill
// counter) and fills the handle (row_src[r] = g * kmax + slot, tok_rows[g * kmax + slot] = r
// or -1), then the warp reads the row once, chunk by chunk, and stores each chunk to every
// local slot's row. A peer's row comes from the receive area as it arrives (EP_ROW_PEER, PE
// `pe`), this PE's own from `x` (not null; its row record holds the token).
__device__ __forceinline__ void ep_permute_row(const ep_params* P, ep_t* out, long long g, bool vec, int nv, unsigned lane,
                                               const ep_t* x, int pe) {
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const long long H = P->hidden, K = P->kmax, RMW = 1 + 2 * K, El = P->el, lo = P->me * El;
    const unsigned* off = (const unsigned*)P->expert_off;
    unsigned* fill = (unsigned*)P->fill;
    const unsigned* m = (const unsigned*)P->recv_meta + g * RMW;
    const ep_t* src = x ? x + (long long)m[0] * H : (const ep_t*)P->recv_x + g * H;
    // A peer's row goes back to the sentinel when the last group of 32 slots with a local
    // expert has read it (slot j0 of that group: jl); a row with none is corrupt.
    long long jl = 0;
    if (K > 32 || !x) {
        jl = -1;
        for (long long j0 = 0; j0 < K; j0 += 32) {
            const long long id = j0 + lane < K ? (long long)(int)m[1 + j0 + lane] : -1;
            if (__ballot_sync(0xffffffffu, id >= lo && id < lo + El)) jl = j0;
        }
        if (jl < 0) {
            if (lane == 0) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
            return;
        }
    }
    for (long long j0 = 0; j0 < K; j0 += 32) {
        const long long j = j0 + lane;
        int r = -1;
        if (j < K) {
            const long long id = (long long)(int)m[1 + j];
            if (id >= lo && id < lo + El) {
                const long long e = id - lo;
                const unsigned rr = off[e] + atomicAdd(&fill[e], 1u);
                if (rr < off[e + 1]) {
                    r = (int)rr;
                    ((unsigned*)P->row_src)[r] = (unsigned)(g * K + j);
                } else {
                    atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
                }
            }
            ((int*)P->tok_rows)[g * K + j] = r;
        }
        ep_expand_row<EP_PSTREAM_U>(out, src, __ballot_sync(0xffffffffu, r >= 0), r, H, vec, nv, lane, x ? EP_ROW_OWN : EP_ROW_PEER,
                      j0 == jl, pe);
    }
}

// Elements [0, elems) of p (element-aligned) to the sentinel, grid-stride (i0, st).
__device__ __forceinline__ void ep_fill_sentinel(ep_t* p, long long elems, long long i0, long long st) {
    const long long head = min(elems, (long long)(((16 - ((unsigned long long)p & 15)) & 15) / sizeof(ep_t)));
    const long long nvec = (elems - head) * (long long)sizeof(ep_t) / 16, tail = head + nvec * (16 / (long long)sizeof(ep_t));
    const rshmemi_v4 snt = {EP_SENTINEL, EP_SENTINEL, EP_SENTINEL, EP_SENTINEL};
    for (long long i = i0; i < head; i += st) ((ep_bits*)p)[i] = (ep_bits)EP_SENTINEL;
    for (long long i = i0; i < nvec; i += st) ((rshmemi_v4*)(p + head))[i] = snt;
    for (long long i = tail + i0; i < elems; i += st) ((ep_bits*)p)[i] = (ep_bits)EP_SENTINEL;
}

// Dispatch, step 4, expert-major buffers (grid, started on ep_dwait's gate while ep_send still
// runs on every PE; at most EP_PSTREAM_REGS registers per thread, so its blocks of 448 threads
// fit beside ep_send's of 128, as the host launches them for these buffers): each received row
// moves to its experts' rows (ep_permute_row) as it arrives; the warps take rows by tickets
// (below). A pair (source, source block) starts once its sender's "records in" word is (its
// positions lo..hi-1); then each of its rows is taken as it comes: the receive area holds the
// sentinel where no row is, the sender puts rows with no all-ones element (ep_canon), and a
// vector none of whose elements is the sentinel is the sender's (an element is written at
// once). This PE's own rows come from x (ep_send does not copy them). Every row read goes back
// to the sentinel; so do the peers' rows of a step that moves none (after ep_dwait's end: all of
// them are in), unless a wait timed out (rows may still come; Buffer::check refills the area
// then). A wait that times out stops the warp; the last block to finish checks that every
// expert got its rows and stops the step on a timeout (ep_abort_if_failed), so combine moves
// nothing.
extern "C" __global__ void __maxnreg__(EP_PSTREAM_REGS) ep_pstream(const ep_params* P, ep_t* out, const ep_t* x) {
    __shared__ int s_go, s_last, s_rows;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, G = P->grid;
    const unsigned lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        rshmemi_wait64((const rshmem_u64*)ctl + EP_CTL_PGATE, RSHMEM_CMP_EQ, 1, me);
        s_go = !ep_timed_out() && ctl[EP_CTL_GO] != 0;
    }
    __syncthreads();
    EP_STAMP_MAX(ctl, 19);
    if (s_go) {
        EP_STAMP_FIRST(ctl, 9);
        const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
        const rshmem_u64* prog = (const rshmem_u64*)P->prog;
        const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)out | P->recv_x | (unsigned long long)x);
        const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
        // Rows by tickets (one counter, a warp takes the next ticket when done with a row):
        // ticket t is row t / I of pair t % I (I pairs (source, source block)), so every
        // pair's k-th row comes before any pair's (k+1)-th: this PE's own rows (there from the
        // start) and the peers' (coming in over the whole send) interleave, every warp works
        // while rows come in and none idles at the end.
        // A pair has at most ceil(T_s / G) rows (T_s: source s's tokens, from its record, which
        // ep_dwait read before the gate).
        if (threadIdx.x == 0) {
            const long long RW = EP_REC_FIXED + P->el;
            long long tmax = 0;
            for (int s = 0; s < n; s++) tmax = max(tmax, (long long)((volatile const rshmem_u64*)P->rec)[s * RW + 2]);
            s_rows = (int)min((tmax + G - 1) / G, (P->max_tokens + G - 1) / G);
        }
        __syncthreads();
        const long long I = n * G, NT = I * s_rows;
        bool stop = false;
        while (!stop) {
            unsigned long long t = 0;
            if (lane == 0) t = atomicAdd(&ctl[EP_CTL_RTICKET], 1ull);
            t = __shfl_sync(0xffffffffu, t, 0);
            if ((long long)t >= NT) break;
            const long long item = (long long)t % I, k = (long long)t / I;
            const int s = (int)(item / G);
            // The pair's row records are in: its positions lo..hi-1.
            rshmem_u64 v = 0;
            if (lane == 0) v = rshmemi_wait64(prog + item, RSHMEM_CMP_GE, 1ull << 63, ep_pe(P, s));
            v = __shfl_sync(0xffffffffu, v, 0);
            // Every lane after lane 0's acquire of the word.
            __syncwarp();
            const long long lo = (long long)(v & 0xffffffffu), hi = (long long)((v >> 32) & 0x7fffffffu);
            if (!(v >> 63)) break;  // a timeout (or a failure before it)
            if (hi > min((long long)recv_cnt[s], C) || (s == me && !x)) {
                // Beyond what the sender's record announced.
                if (lane == 0 && k == 0) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
                continue;
            }
            if (lo + k >= hi) continue;
            ep_permute_row(P, out, (long long)s * C + lo + k, vec, nv, lane, s == me ? x : nullptr, ep_pe(P, s));
            stop = ep_timed_out();
        }
    } else if (EP_DISPATCH_REFILL) {
        rshmemi_grid_dep_wait();
        if (!ep_timed_out() && !(((volatile unsigned long long*)ctl)[EP_CTL_ERR] & EP_ERR_ABORT)) {
            const long long RW = EP_REC_FIXED + P->el;
            const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x, st = (long long)gridDim.x * blockDim.x;
            for (int s = 0; s < n; s++) {
                if (s == me) continue;
                const long long k = min((long long)((volatile const rshmem_u64*)P->rec)[s * RW + 1], C);
                ep_fill_sentinel((ep_t*)P->recv_x + (long long)s * C * H, k * H, i0, st);
            }
        }
    }
    // The last block: every expert has its rows (unless a wait gave up), and the step stops on
    // a timeout.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(&ctl[EP_CTL_PTICKET], 1ull) == gridDim.x - 1;
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        if (s_go && !ep_timed_out()) {
            const unsigned* off = (const unsigned*)P->expert_off;
            const unsigned* fill = (const unsigned*)P->fill;
            for (int e = threadIdx.x; e < (int)P->el; e += blockDim.x)
                if (((volatile const unsigned*)fill)[e] != off[e + 1] - off[e]) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            ep_abort_if_failed(ctl);
            EP_STAMP(ctl, 10);
        }
    }
    // The stream's order for what follows (ep_dwait, and through it ep_send, ended).
    rshmemi_grid_dep_wait();
}

// Token-major buffers, dispatch step 4 (grid, after ep_dwait): the expert-major index only,
// row_src[r] = received row * kmax + slot, tok_rows[received row * kmax + slot] = r (or -1), a
// thread per (receive row, slot) pair.
extern "C" __global__ void __launch_bounds__(512) ep_permute(const ep_params* P) {
    rshmemi_grid_dep_wait();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    EP_STAMP_FIRST(ctl, 9);
    const int n = (int)P->n, me = (int)P->me;
    const long long C = P->cap, K = P->kmax, RMW = 1 + 2 * K, El = P->el;
    const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
    const unsigned* off = (const unsigned*)P->expert_off;
    unsigned* fill = (unsigned*)P->fill;
    unsigned* row_src = (unsigned*)P->row_src;
    int* tok_rows = (int*)P->tok_rows;
    const long long lo = (long long)me * El;
    // Token-major buffers: the index only, a thread per (receive row, slot) pair. A block
    // counts its pairs per local expert in shared memory (dynamic: 2 * El unsigned) and
    // reserves each expert's rows with one global atomic; one atomic per pair on the El
    // contended fill counters took about 10 us for T = 4096, k = 8, 2 PEs. More than
    // EP_INDEX_EXPERTS local experts: one atomic per pair.
    extern __shared__ unsigned s_idx[];
    const bool shared_path = El <= EP_INDEX_EXPERTS;
    const unsigned total = (unsigned)(n * C * K), Ku = (unsigned)K, Cu = (unsigned)C;
    const unsigned tid = threadIdx.x, nth = blockDim.x;
    for (unsigned base = blockIdx.x * nth; base < total; base += gridDim.x * nth) {
        const unsigned q = base + tid;
        if (shared_path) {
            for (int x = tid; x < El; x += nth) s_idx[x] = 0;
            __syncthreads();
        }
        long long e = -1;
        if (q < total) {
            const unsigned g = q / Ku, j = q - g * Ku, src = g / Cu;
            if (g - src * Cu < recv_cnt[src]) {
                const long long id = (long long)(int)((const unsigned*)P->recv_meta)[(long long)g * RMW + 1 + j];
                if (id >= lo && id < lo + El) e = id - lo;
                else tok_rows[q] = -1;
            }
        }
        unsigned rank = 0;
        if (shared_path) {
            if (e >= 0) rank = atomicAdd(&s_idx[e], 1u);
            __syncthreads();
            for (int x = tid; x < El; x += nth) {
                const unsigned c = s_idx[x];
                if (c) s_idx[El + x] = atomicAdd(&fill[x], c);
            }
            __syncthreads();
            if (e >= 0) rank += s_idx[El + e];
            __syncthreads();  // s_idx is zeroed for the next pairs
        } else if (e >= 0) {
            rank = atomicAdd(&fill[e], 1u);
        }
        if (e >= 0) {
            const unsigned rr = off[e] + rank;
            int r = -1;
            if (rr < off[e + 1]) {
                r = (int)rr;
                row_src[r] = q;
            } else {
                atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
            }
            tok_rows[q] = r;
        }
    }
    EP_STAMP_LAST(ctl, 10);
}

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
            ep_t* dst = (ep_t*)rshmem_ptr((ep_t*)P->comb + ((parity * n + me) * C + i) * H, ep_pe(P, (int)s));
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
        ep_signal(ctl, sig + 2 * n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d));
}

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
                ep_t* dst = (ep_t*)rshmem_ptr((ep_t*)P->comb + ((parity * n + me) * C + i) * H, ep_pe(P, (int)s));
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

// out[t] = sum over d ascending of the row bases[d] + tok_pos[t * n + d] * H (rows of negative
// positions skipped), in f32, rounded once; work units (token, chunk of the row), two PEs' rows
// loaded before accumulating. `bases`: a row-0 pointer per PE (shared memory, filled and
// synchronised by the caller). The source side of rshmem's combines and of the baseline's. keep:
// as in ep_sum_bases (< 0: rows left as they are).
__device__ __forceinline__ void ep_sum_rows(const int* tok_pos, int T, int n, long long H, const ep_t* const* bases,
                                            ep_t* out, int keep) {
    const unsigned lane = threadIdx.x & 31;
    // The vector path where the row size and every PE's rows are 16-byte aligned.
    bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)out);
    for (int d = 0; d < n && vec; d++) vec = ep_al16((unsigned long long)bases[d]);
    const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
    const long long chunk = 32 * EP_UR;
    const long long nch = vec ? (nv + chunk - 1) / chunk : 1;
    const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long u = gw; u < (long long)T * nch; u += nw) {
        const long long t = u / nch, c = u % nch;
        const int* pos = tok_pos + t * n;
        if (vec) {
            const int v0 = (int)(c * chunk) + (int)lane;
            float acc[EP_UR][EP_VEC];
#pragma unroll
            for (int q = 0; q < EP_UR; q++)
#pragma unroll
                for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
            ep_sum_bases<EP_UR>(acc, pos, n, bases, H, v0, nv, keep);
            ep_round_store<EP_UR>(out + t * H, acc, v0, nv);
        } else {
            for (long long h = lane; h < H; h += 32) {
                float a = 0.f;
                for (int d = 0; d < n; d++)
                    if (pos[d] >= 0) {
                        ep_t* p = (ep_t*)&bases[d][pos[d] * H + h];
                        a += ep_f(*p);
                        if (keep >= 0 && d != keep) *(ep_bits*)p = (ep_bits)EP_SENTINEL;
                    }
                ep_from(a, &out[t * H + h]);
            }
        }
    }
}

// Source side of combine: out[t] = sum over destination PEs (ascending) of the rows they sent
// back for token t, in f32, rounded once; tokens without experts get zeros. Work units are
// (token, chunk of the row), two PEs' rows loaded before accumulating. `own` (not null: after
// ep_csend with tokens == 2) holds this PE's rows for its own tokens (receive-row layout).
extern "C" __global__ void __launch_bounds__(512) ep_crecv(const ep_params* P, ep_t* out, const ep_t* own) {
    rshmemi_grid_dep_wait();
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    EP_STAMP_MAX(ctl, 23);
    if (!ctl[EP_CTL_GO]) return;
    const int n = (int)P->n;
    const long long H = P->hidden, C = P->cap;
    const int T = (int)ctl[EP_CTL_TOKENS];
    const long long parity = (long long)((ctl[EP_CTL_CWAIT] - 1) & 1);
    const int* tok_pos = (const int*)P->tok_pos;
    const ep_t* comb = (const ep_t*)P->comb + parity * n * C * H;
    __shared__ const ep_t* s_base[EP_MAX_PES];
    for (int d = threadIdx.x; d < n; d += blockDim.x) s_base[d] = (own && d == (int)P->me ? own : comb) + d * C * H;
    __syncthreads();
    EP_STAMP_FIRST(ctl, 14);
    ep_sum_rows(tok_pos, T, n, H, s_base, out, P->sentinel && !(EP_SPLIT_KEEP & 2) ? (int)P->me : -1);
    EP_STAMP_LAST(ctl, 15);
}

// ----- the pull combine (combine_tokens): ep_cready (1 block) -> ep_cpull (grid) -> ep_cdone (1 block)
// Every PE reads the rows its peers hold for its tokens straight from their `y` (symmetric, one
// row per receive row: a token's row on PE d is d's y row me * C + tok_pos[t][d]) and sums them
// with its own, ascending over PEs as ep_crecv does: no copy into combine areas and no second
// pass over them; the link carries loads while the sums are made. A PE's y must stay as it is
// until every peer has read it, hence the done handshake at the end.

// Pull combine, step 1 (one block): this combine's number (ctl[CWAIT] + 1); puts y's heap offset
// (`y`: this PE's address of its symmetric y) and a ready signal carrying the number to every
// PE (y is complete: the kernels before this one on the stream have ended), then waits for
// every PE's. A timeout or an abort, here or from a peer, stops the step (ctl[GO] = 0) as in
// ep_cwait.
extern "C" __global__ void ep_cready(const ep_params* P, const ep_t* y) {
    rshmemi_grid_dep_wait();
    __shared__ rshmem_u64 s_c;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    if (threadIdx.x == 0) {
        EP_STAMP(ctl, 11);
        s_c = ctl[EP_CTL_CWAIT] + 1;
        ctl[EP_CTL_CWAIT] = s_c;
    }
    __syncthreads();
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    const rshmem_u64 yoff = (rshmem_u64)y - rshmem_dstate.my_base;
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
        const int pe = ep_pe(P, d);
        *(volatile rshmem_u64*)rshmem_ptr(sig + EP_SIG_YOFF * n + me, pe) = yoff;
        ep_signal_set(ctl, sig + EP_SIG_CREADY * n + me, s_c, pe);
    }
    EP_STAMP_LAST(ctl, 12);
    ep_wait_every_pe(P, ctl, sig + EP_SIG_CREADY * n, s_c, 13);
    // ep_cpull may become resident now (no wait for other PEs is left here).
    rshmemi_grid_dep_launch();
}

// The pull combine's temporary rows (T <= n * C, checked by the host): the half of this PE's
// combine area that the next push combine (ep_csend writes half ctl[CWAIT] & 1 of its peers'
// areas) leaves alone; no peer writes the other half while this combine runs.
__device__ __forceinline__ ep_t* ep_ptemp(const ep_params* P) {
    const unsigned long long c = ((const volatile unsigned long long*)P->ctl)[EP_CTL_CWAIT];
    return (ep_t*)P->comb + (long long)((c + 1) & 1) * P->n * P->cap * P->hidden;
}

// Pull combine, step 2 (grid): out[t] = sum over PEs d ascending (tok_pos[t][d] >= 0) of row
// me * C + tok_pos[t][d] of PE d's y, in f32, rounded once; zeros for tokens without experts.
// Work units (token, chunk of the row) as in ep_crecv. Waits for no PE. A null `out` (it
// overlaps y) means this PE's temporary rows (ep_ptemp), which ep_ccopy copies to it later.
extern "C" __global__ void __launch_bounds__(512) ep_cpull(const ep_params* P, ep_t* out) {
    rshmemi_grid_dep_wait();
    // ep_cdone (one block) may become resident now.
    rshmemi_grid_dep_launch();
    __shared__ const ep_t* s_base[EP_MAX_PES];
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap;
    const int T = (int)ctl[EP_CTL_TOKENS];
    if (out == nullptr) out = ep_ptemp(P);
    const rshmem_u64* yoff = (const rshmem_u64*)P->sig + EP_SIG_YOFF * n;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        s_base[d] = (const ep_t*)rshmem_ptr((const void*)(rshmem_dstate.my_base + yoff[d]), ep_pe(P, d)) + me * C * H;
    __syncthreads();
    EP_STAMP_FIRST(ctl, 14);
    ep_sum_rows((const int*)P->tok_pos, T, n, H, s_base, out, -1);
    EP_STAMP_LAST(ctl, 15);
}

// Pull combine, step 3 (one block): tells every PE that this PE has read its y (ep_cpull has
// ended) and waits until every PE has read this PE's: the caller may write y again once the
// stream is past this kernel.
extern "C" __global__ void ep_cdone(const ep_params* P) {
    rshmemi_grid_dep_wait();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n;
    const rshmem_u64 c = ctl[EP_CTL_CWAIT];
    rshmem_u64* sig = (rshmem_u64*)P->sig;
    for (int d = threadIdx.x; d < n; d += blockDim.x)
        ep_signal_set(ctl, sig + EP_SIG_CDONE * n + (int)P->me, c, ep_pe(P, d));
    ep_wait_every_pe(P, ctl, sig + EP_SIG_CDONE * n, c, -1);
    // ep_ccopy may become resident now.
    rshmemi_grid_dep_launch();
}

// The pull combine's last step where `out` overlaps this PE's y: ep_cpull wrote the sums to its
// temporary rows (ep_ptemp), copied to out once every PE has read y.
extern "C" __global__ void __launch_bounds__(512) ep_ccopy(const ep_params* P, ep_t* out) {
    rshmemi_grid_dep_wait();
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const long long bytes = (long long)ctl[EP_CTL_TOKENS] * P->hidden * (long long)sizeof(ep_t);
    const long long tid = blockIdx.x * blockDim.x + threadIdx.x, nth = gridDim.x * blockDim.x;
    if (P->sentinel && !(EP_SPLIT_KEEP & 2)) {
        // The temporary rows are peers' rows of the next combine: each thread stores the
        // sentinel back into what it has just read (its own elements: no other thread reads
        // them).
        ep_t* tmp = ep_ptemp(P);
        if (ep_al16((unsigned long long)out | (unsigned long long)tmp) && bytes % 16 == 0) {
            const rshmemi_v4 snt = {EP_SENTINEL, EP_SENTINEL, EP_SENTINEL, EP_SENTINEL};
            rshmemi_v4 *o = (rshmemi_v4*)out, *m = (rshmemi_v4*)tmp;
            for (long long i = tid; i < bytes / 16; i += nth) {
                const rshmemi_v4 v = m[i];
                m[i] = snt;
                o[i] = v;
            }
        } else {
            ep_bits *o = (ep_bits*)out, *m = (ep_bits*)tmp;
            for (long long i = tid; i < bytes / (long long)sizeof(ep_t); i += nth) {
                const ep_bits v = m[i];
                m[i] = (ep_bits)EP_SENTINEL;
                o[i] = v;
            }
        }
        return;
    }
    rshmemi_copy(out, ep_ptemp(P), (size_t_rshmem)bytes, tid, nth);
}

// A stand-in expert computation: y[r] = x[r] * factor[local expert of row r], for the rows of
// the last dispatch (count read on the device, so it can be captured in a graph). With
// `gather` (token-major layout), x is the receive area and row r reads receive row
// row_src[r] / kmax.
extern "C" __global__ void __launch_bounds__(512) ep_scale_experts(const ep_params* P, const ep_t* x, ep_t* y, const float* factor,
                                                                   int gather) {
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
        const long long src = gather ? (long long)(((const unsigned*)P->row_src)[r] / (unsigned)P->kmax) : r;
        for (long long h = lane; h < H; h += 32) ep_from(ep_f(x[src * H + h]) * f, &y[r * H + h]);
    }
}

// ----- The benchmark's same-run baseline (cuda::ep::ep_bench): dispatch and combine through
// NCCL all-to-all-v on plain per-PE buffers (no peer access). C = T rows per (source,
// destination); counts per destination: [tokens, (token, slot) pairs per local expert of the
// destination] = 1 + El ints. The host exchanges them with an NCCL all-to-all, reads them, then
// posts grouped ncclSend/ncclRecv of the packed rows and row records.

// Layout (one block, like ep_layout and ep_send's positions without validation or exchange): tok_pos[t * n + d] (position
// of token t among those sent to d, -1 if none), scnt[d * (1 + El) + ...], zeroes fill[El].
// Dynamic shared memory: n * El unsigned.
extern "C" __global__ void __launch_bounds__(1024) epb_layout(const ep_id* ids, int T, int topk, int n, int El, int* tok_pos,
                                                              int* scnt, unsigned* fill) {
    extern __shared__ unsigned s_pairs[];
    __shared__ unsigned s_cnt[EP_MAX_PES];
    __shared__ unsigned s_wt[32];
    __shared__ unsigned s_wbase[32];
    const int E = n * El;
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < E; i += nth) s_pairs[i] = 0;
    for (int i = tid; i < n; i += nth) s_cnt[i] = 0;
    for (int i = tid; i < El; i += nth) fill[i] = 0;
    __syncthreads();
    for (int base = 0; base < T; base += nth) {
        const int t = base + tid;
        unsigned long long mask = 0;
        if (t < T) {
            for (int j = 0; j < topk; j++) {
                const long long id = (long long)ids[(long long)t * topk + j];
                if (id < 0 || id >= E) continue;
                mask |= 1ull << (int)(id / El);
                atomicAdd(&s_pairs[id], 1u);
            }
        }
        for (int d = 0; d < n; d++) {
            const bool f = (mask >> d) & 1;
            const unsigned bal = __ballot_sync(0xffffffffu, f);
            if (lane == 0) s_wt[warp] = __popc(bal);
            __syncthreads();
            if (warp == 0) ep_scan_warps(s_wt, s_wbase, &s_cnt[d], (nth + 31) / 32, lane);
            __syncthreads();
            if (t < T) tok_pos[(long long)t * n + d] = f ? (int)(s_wbase[warp] + __popc(bal & ep_lanemask_lt())) : -1;
            __syncthreads();
        }
    }
    __syncthreads();
    for (int i = tid; i < n * (1 + El); i += nth) {
        const int d = i / (1 + El), e = i % (1 + El);
        scnt[i] = (int)(e == 0 ? s_cnt[d] : s_pairs[d * El + e - 1]);
    }
}

// Pack (grid; (token, chunk) units like ep_send): each token's row to sx[(d * T + pos) * H] for
// every destination d, its row record (token, topk ids, topk weights) to smeta[(d*T + pos) * RMW].
extern "C" __global__ void __launch_bounds__(512) epb_pack(const ep_t* x, const ep_id* ids, const float* w, const int* tok_pos,
                                                           int T, int topk, int n, long long H, ep_t* sx, unsigned* smeta) {
    const long long K = topk, RMW = 1 + 2 * K;
    const unsigned lane = threadIdx.x & 31;
    const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)x | (unsigned long long)sx);
    const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
    const long long chunk = 32 * EP_U;
    const long long nch = vec ? (nv + chunk - 1) / chunk : 1;
    const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long u = gw; u < (long long)T * nch; u += nw) {
        const long long t = u / nch, c = u % nch;
        if (vec) {
            rshmemi_v4 r[EP_U];
            const int v0 = (int)(c * chunk) + (int)lane;
            ep_load<EP_U>(r, (const rshmemi_v4*)(x + t * H), v0, nv, true);
            for (int d = 0; d < n; d++) {
                const int pos = tok_pos[t * n + d];
                if (pos >= 0) ep_store<EP_U>((rshmemi_v4*)(sx + ((long long)d * T + pos) * H), r, v0, nv);
            }
        } else {
            for (int d = 0; d < n; d++) {
                const int pos = tok_pos[t * n + d];
                if (pos >= 0) ep_copy_row(sx + ((long long)d * T + pos) * H, x + t * H, H * (long long)sizeof(ep_t), lane);
            }
        }
        if (c != 0) continue;
        for (int d = 0; d < n; d++) {
            const int pos = tok_pos[t * n + d];
            if (pos < 0) continue;
            unsigned* m = smeta + ((long long)d * T + pos) * RMW;
            for (long long i = lane; i < RMW; i += 32) {
                unsigned v;
                if (i == 0) v = (unsigned)t;
                else if (i <= K) v = (unsigned)(int)ids[t * K + i - 1];
                else v = __float_as_uint(w[t * K + i - 1 - K]);
                m[i] = v;
            }
        }
    }
}

// Received rows (rx, rmeta: source s's at s * T) into expert-major rows ex, like ep_permute;
// every block first computes the expert offsets from the received counts (shared memory, El + 1
// unsigned, dynamic); block 0 also writes them to off_out.
extern "C" __global__ void __launch_bounds__(512) epb_permute(const int* rcnt, int n, int El, int T, int topk, int me,
                                                              long long H, const ep_t* rx, const unsigned* rmeta, ep_t* ex,
                                                              unsigned* off_out, unsigned* fill, unsigned* row_src,
                                                              int* tok_rows) {
    extern __shared__ unsigned s_off[];
    __shared__ unsigned s_part[32];
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31;
    const int seg = (El + (int)nth - 1) / (int)nth, e0 = (int)tid * seg, e1 = min(e0 + seg, El);
    unsigned sum = 0;
    for (int e = e0; e < e1; e++)
        for (int s = 0; s < n; s++) sum += (unsigned)rcnt[s * (1 + El) + 1 + e];
    unsigned acc = ep_block_excl_scan(sum, s_part, &s_off[El]);
    for (int e = e0; e < e1; e++) {
        s_off[e] = acc;
        for (int s = 0; s < n; s++) acc += (unsigned)rcnt[s * (1 + El) + 1 + e];
    }
    __syncthreads();
    if (blockIdx.x == 0)
        for (int e = tid; e <= El; e += nth) off_out[e] = s_off[e];
    const long long K = topk, RMW = 1 + 2 * K, lo = (long long)me * El;
    const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)ex | (unsigned long long)rx);
    const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
    const long long wpb = nth / 32, gw = blockIdx.x * wpb + (tid >> 5), nw = gridDim.x * wpb;
    for (long long g = gw; g < (long long)n * T; g += nw) {
        const long long s = g / T, i = g % T;
        if (i >= rcnt[s * (1 + El)]) continue;
        const unsigned* m = rmeta + g * RMW;
        const ep_t* src = rx + g * H;
        for (long long j0 = 0; j0 < K; j0 += 32) {
            const long long j = j0 + lane;
            int r = -1;
            if (j < K) {
                const long long id = (long long)(int)m[1 + j];
                if (id >= lo && id < lo + El) {
                    const unsigned rr = s_off[id - lo] + atomicAdd(&fill[id - lo], 1u);
                    if (rr < s_off[id - lo + 1]) {
                        r = (int)rr;
                        row_src[r] = (unsigned)(g * K + j);
                    }
                }
                tok_rows[g * K + j] = r;
            }
            ep_expand_row<EP_U>(ex, src, __ballot_sync(0xffffffffu, r >= 0), r, H, vec, nv, lane);
        }
    }
}

// Expert side of the baseline's combine, as ep_csend: the weighted sum over the token's local
// slots of y, rounded, into cs[(s * T + i) * H] (packed per source for the send back).
extern "C" __global__ void __launch_bounds__(512) epb_csum(const int* rcnt, int n, int El, int T, int topk, long long H,
                                                           const unsigned* rmeta, const int* tok_rows, const ep_t* y, ep_t* cs) {
    const long long K = topk, RMW = 1 + 2 * K;
    const unsigned lane = threadIdx.x & 31;
    const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)y | (unsigned long long)cs);
    const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
    const long long chunk = 32 * EP_UR;
    const long long nch = vec ? (nv + chunk - 1) / chunk : 1;
    const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long u = gw; u < (long long)n * T * nch; u += nw) {
        const long long g = u / nch, c = u % nch;
        const long long s = g / T, i = g % T;
        if (i >= rcnt[s * (1 + El)]) continue;
        const unsigned* m = rmeta + g * RMW;
        ep_t* dst = cs + g * H;
        if (vec) {
            const int v0 = (int)(c * chunk) + (int)lane;
            float acc[EP_UR][EP_VEC];
#pragma unroll
            for (int q = 0; q < EP_UR; q++)
#pragma unroll
                for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
            ep_sum_slots<EP_UR>(acc, tok_rows + g * K, m + 1 + K, K, y, H, v0, nv, lane);
            ep_round_store<EP_UR>(dst, acc, v0, nv);
        } else {
            for (long long h = lane; h < H; h += 32) {
                float acc = 0.f;
                for (long long j = 0; j < K; j++) {
                    const int r = tok_rows[g * K + j];
                    if (r >= 0) acc += __uint_as_float(m[1 + K + j]) * ep_f(y[(long long)r * H + h]);
                }
                ep_from(acc, &dst[h]);
            }
        }
    }
}

// Source side of the baseline's combine, as ep_crecv: out[t] = sum over d ascending of the row
// received from d at cr[(d * T + tok_pos[t * n + d]) * H], rounded once.
extern "C" __global__ void __launch_bounds__(512) epb_crecv(const int* tok_pos, int T, int n, long long H, const ep_t* cr,
                                                            ep_t* out) {
    __shared__ const ep_t* s_base[EP_MAX_PES];
    for (int d = threadIdx.x; d < n; d += blockDim.x) s_base[d] = cr + (long long)d * T * H;
    __syncthreads();
    ep_sum_rows(tok_pos, T, n, H, s_base, out, -1);
}

// Row checksums (the benchmark's data checks): h[r] = sum over i of mix(bits of element i, i)
// mod 2^64, one warp per row. The host computes the same (ep.rs, row_hash).
__device__ __forceinline__ unsigned long long ep_mix(unsigned long long b, unsigned long long i) {
    unsigned long long z = (b << 32) ^ i;
    z *= 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 32;
    return z;
}
extern "C" __global__ void __launch_bounds__(512) epb_rowhash(const ep_t* rows, long long nrows, long long H,
                                                              unsigned long long* h) {
    const unsigned lane = threadIdx.x & 31;
    const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long r = gw; r < nrows; r += nw) {
        unsigned long long acc = 0;
        for (long long i = lane; i < H; i += 32) {
            const ep_t* p = rows + r * H + i;
            const unsigned long long b =
                sizeof(ep_t) == 2 ? (unsigned long long)*(const unsigned short*)p : (unsigned long long)*(const unsigned*)p;
            acc += ep_mix(b, (unsigned long long)i);
        }
        for (int o = 16; o; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) h[r] = acc;
    }
}
