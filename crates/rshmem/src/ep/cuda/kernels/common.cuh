// MoE dispatch/combine kernels (rshmem::cuda::ep). Compiled by NVRTC after the device header,
// once per (hidden type EP_T, top-k id type EP_ID).
//
// Every buffer address in `ep_params` is this PE's symmetric address; peers' copies are reached
// with rshmem_ptr, those of peers on other nodes through the proxy ring (ep_remote: the data is
// written into this PE's staging area first, then put from there; see mod.rs, "Across nodes",
// and fwd.cu). Step order on one stream (see mod.rs for why each area is safe to reuse):
//   dispatch: ep_layout (grid) -> ep_send (grid) -> ep_dwait (1 block) -> ep_pstream (grid,
//             expert-major buffers) or ep_permute (grid, token-major: the index only)
//             (the last three launched as programmatic dependents: ep_send and ep_dwait start
//             on ep_layout's gate, ep_pstream on ep_dwait's and moves rows while ep_send still
//             runs, ep_permute with rshmemi_grid_dep_wait; a kernel's predecessor lets it
//             become resident only once that predecessor no longer waits for other PEs, except
//             that ep_pstream's blocks wait for rows: ep_send runs 128 threads per block for
//             expert-major buffers, so they fit beside it and never keep it out)
//   combine:  ep_csend (grid) -> ep_cwait (1 block) -> ep_crecv (grid), all three likewise;
//   across nodes ep_fwd (after ep_send) and ep_cfwd (after ep_csend), n blocks each, likewise;
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
        row_src, tok_rows, acc, prog, xstage, mstage, rstage, nx, nmeta, cx, fpos, cpos, npos, fsig, ntab, xcount;
    long long n, me, start, stride, cap, hidden, kmax, el, experts, max_tokens, rmax, grid, sentinel, ncap;
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
// The abort bit from a PE of another node (device atomics do not cross nodes: it sets this
// word through the proxy, before its signal, instead of or-ing the bit into EP_CTL_ERR). Read
// with the abort bit (ep_aborted); cleared by the host with the error word.
#define EP_CTL_XABORT 14
// Across nodes: the ticket of ep_send's and ep_csend's blocks (ep_last_block), 0 between kernels.
#define EP_CTL_XTICKET 15
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

// The abort bit, or one a PE of another node set (EP_CTL_XABORT).
__device__ __forceinline__ bool ep_aborted(const unsigned long long* ctl) {
    const volatile unsigned long long* v = (const volatile unsigned long long*)ctl;
    return (v[EP_CTL_ERR] & EP_ERR_ABORT) != 0 || v[EP_CTL_XABORT] != 0;
}

// True when a device wait of this PE timed out or a device barrier was misused (the device
// header's flag; the host clears it).
__device__ __forceinline__ bool ep_timed_out() {
    return rshmemi_failed();
}

// After this PE's waits of a step (one thread): a timeout here, or an abort a peer put here
// before the signals just waited for, stops the rest of the step on this PE.
__device__ __forceinline__ void ep_abort_if_failed(unsigned long long* ctl) {
    if (ep_timed_out() || ep_aborted(ctl)) {
        atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_ABORT);
        ((volatile unsigned long long*)ctl)[EP_CTL_GO] = 0;
    }
}

// Sets PE `pe`'s (another node's) EP_CTL_XABORT word through the proxy: carried out before any
// request this thread posts after it.
__device__ __forceinline__ void ep_xabort(const unsigned long long* ctl, int pe) {
    rshmemi_proxy_signal_at(rshmemi_offset(ctl + EP_CTL_XABORT), 1, RSHMEM_SIGNAL_SET, pe);
}

// Adds `v` (1 unless given) to PE `pe`'s counter `sig` (this PE's symmetric address) after this
// thread's barrier with its block; an aborted PE first puts the abort bit into the peer's flags
// (ordered before the signal by the release). PEs of this node only: a PE of another node gets
// ep_signal_set of the count the adds would reach (ep_xsig), since an add served there takes a
// kernel of the target's context; a caller that passes one anyway stops its step (flagged as a
// wait for that PE) rather than reach an address that is not mapped.
__device__ __forceinline__ void ep_signal(const unsigned long long* ctl, rshmem_u64* sig, rshmem_u64* peer_ctl_err, int pe,
                                          rshmem_u64 v = 1) {
    asm volatile("fence.sc.sys;" ::: "memory");
    const bool aborted = ep_aborted(ctl);
    if (rshmemi_remote(pe)) {
        rshmemi_flag_timeout(pe);
        return;
    }
    if (aborted) atomicOr_system((unsigned long long*)rshmemi_ptr(peer_ctl_err, pe), EP_ERR_ABORT);
    rshmemi_red_add_release((rshmem_u64*)rshmemi_ptr(sig, pe), v);
}
// As ep_signal, setting PE `pe`'s word `sig` to `v` instead of adding 1; a PE of another node
// through the proxy, after every request this PE posted before (the ring is carried out in
// order), an aborted PE first setting its EP_CTL_XABORT word (device atomics do not cross
// nodes).
__device__ __forceinline__ void ep_signal_set(const unsigned long long* ctl, rshmem_u64* sig, rshmem_u64 v, int pe) {
    asm volatile("fence.sc.sys;" ::: "memory");
    const bool aborted = ep_aborted(ctl);
    if (rshmemi_remote(pe)) {
        if (aborted) ep_xabort(ctl, pe);
        rshmemi_proxy_signal_at(rshmemi_offset(sig), v, RSHMEM_SIGNAL_SET, pe);
        return;
    }
    if (aborted) atomicOr_system((unsigned long long*)rshmemi_ptr((const void*)(ctl + EP_CTL_ERR), pe), EP_ERR_ABORT);
    rshmemi_st_release((rshmem_u64*)rshmemi_ptr(sig, pe), v);
}

// A counter signal (data, combine) that a PE of another node sets instead of adding to: after
// call `call` (1, 2, ... on every PE alike) the adds of a grid of `grid` blocks on one node
// leave it at call * grid, which the receiver waits for. The word is this source's alone, so a
// set is as good as the adds, and the target's proxy writes a set by a stream memory operation
// with no kernel (an add would take a one-thread kernel there, which may find no room beside
// the kernels that wait for it).
__device__ __forceinline__ rshmem_u64 ep_xsig(rshmem_u64 call, long long grid) { return call * (rshmem_u64)grid; }

__device__ __forceinline__ int ep_pe(const ep_params* P, int d) { return (int)(P->start + d * P->stride); }
// Whether team member d runs on another node: reached through the proxy ring, never by loads
// and stores (its base in the heap base table is 0).
__device__ __forceinline__ bool ep_remote(const ep_params* P, int d) { return rshmemi_remote(ep_pe(P, d)); }
// Across nodes (P->xstage set) the block of ep_send and of ep_csend that finishes last does
// what goes to other nodes (ep_send: packs and puts each node's rows, ep_pack_nodes; ep_csend:
// tells this node's forwarders its partial rows are in): a few requests per node and step
// rather than one per row and block (each request is a round trip through both PEs' proxies).
// True in every thread of the last block, once every other block's writes are visible to the
// proxy's copies; it resets the ticket for the next kernel.
__device__ __forceinline__ bool ep_last_block(const unsigned long long* ctl, int* s_last) {
    unsigned long long* t = (unsigned long long*)ctl + EP_CTL_XTICKET;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        *s_last = atomicAdd(t, 1ull) == gridDim.x - 1;
        if (*s_last) {
            __threadfence_system();
            *(volatile unsigned long long*)t = 0;
        }
    }
    __syncthreads();
    return *s_last != 0;
}
// A non-blocking put of `bytes` from this PE's staging copy `src` to `dst` (this PE's symmetric
// address) on team member d of another node. The source stays unchanged until the proxy
// copied it: it is rewritten only after every PE's next ready signal, which each sends after
// its wait for this PE's signal of the step, posted after the put (the ring is carried out in
// order).
__device__ __forceinline__ void ep_put_remote(void* dst, const void* src, long long bytes, const ep_params* P, int d) {
    if (bytes > 0) rshmemi_proxy_put(dst, src, (size_t_rshmem)bytes, ep_pe(P, d), false);
}
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

// Word i of token t's row record: the token index, then its K expert slots (ids; -1 past
// topk), then their weights' bits (0 past topk). The receivers place and weigh the row by it,
// so the direct sends and the packing for other nodes write the same record.
__device__ __forceinline__ unsigned ep_record_word(const ep_id* ids, const float* w, long long t, int topk, long long K,
                                                   long long i) {
    if (i == 0) return (unsigned)t;
    if (i <= K) { const long long j = i - 1; return j < topk ? (unsigned)(int)ids[t * topk + j] : 0xffffffffu; }
    const long long j = i - 1 - K;
    return j < topk ? __float_as_uint(w[t * topk + j]) : 0u;
}

// Tokens of ep_layout's block b of G: [T*b/G, T*(b+1)/G), in ep_layout and ep_send alike.
__device__ __forceinline__ void ep_range_tokens(int T, long long b, long long G, int* t0, int* t1) {
    *t0 = (int)((long long)T * b / G);
    *t1 = (int)((long long)T * (b + 1) / G);
}

