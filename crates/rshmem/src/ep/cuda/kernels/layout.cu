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
//   block for all tokens, or a global atomic per slot, would make the count several times
//   slower.
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
    // The last warp of block 0 signals while the first ones count tokens (signals from warp 0
    // would delay block 0's count by their fences).
    if (blockIdx.x == 0 && (tid >> 5) == (nth >> 5) - 1) {
        const bool gone = ep_timed_out() || ep_aborted(ctl);
        // This PE's "records in" words (expert-major buffers) are zero again before any peer may
        // write them (after the ready signal below; the previous step's writers were all seen
        // by its ep_dwait, the previous step's readers ended before this kernel began).
        if (P->prog) {
            const int words = n * (int)P->grid;
            for (int i = lane; i < words; i += 32) ((volatile rshmem_u64*)P->prog)[i] = 0;
            __syncwarp();
        }
        for (int d = lane; d < n; d += 32) {
            // A PE of another node: the abort word first (ep_signal).
            if (ep_remote(P, d)) {
                if (gone) ep_xabort(ctl, ep_pe(P, d));
                rshmemi_signal_op_collective(ready + me, epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d));
                continue;
            }
            // The abort bit first (ordered before the signal by its fence and release).
            if (gone) atomicOr_system((unsigned long long*)rshmemi_ptr(ctl + EP_CTL_ERR, ep_pe(P, d)), EP_ERR_ABORT);
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
    // would make the count several times slower.
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
        const bool gone = ep_timed_out() || ep_aborted(ctl);
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
    // The record for PE d: in its records area, or (another node) in this PE's staging row d,
    // put from there with the signal below.
    auto rec_of = [&](int d) -> rshmem_u64* {
        return ep_remote(P, d) ? (rshmem_u64*)P->rstage + d * RW : (rshmem_u64*)rshmemi_ptr(rec + me * RW, ep_pe(P, d));
    };
    for (int i = tid; i < n * El && !s_gone; i += nth) {
        const int d = i / El, e = i % El;
        ((volatile rshmem_u64*)rec_of(d))[EP_REC_FIXED + e] = va[i];
    }
    for (int d = tid; d < n && !s_gone; d += nth) {
        volatile rshmem_u64* r = rec_of(d);
        r[0] = s_status;
        r[1] = va[E + d];
        r[2] = (rshmem_u64)T;
        r[3] = (rshmem_u64)topk;
    }
    __syncthreads();
    for (int d = tid; d < n; d += nth) {
        if (ep_remote(P, d)) {
            // One request: the record, then its signal; a PE that gave up wrote none and sets
            // the abort word before the signal instead.
            asm volatile("fence.sc.sys;" ::: "memory");
            if (s_gone) {
                ep_xabort(ctl, ep_pe(P, d));
                rshmemi_signal_op_collective(sig + me, epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d));
            } else {
                rshmemi_proxy_put_signal(rec + me * RW, rec_of(d), RW * 8, sig + me, epoch, RSHMEM_SIGNAL_SET, ep_pe(P, d),
                                         false);
            }
            continue;
        }
        if (s_gone) atomicOr_system((unsigned long long*)rshmemi_ptr(ctl + EP_CTL_ERR, ep_pe(P, d)), EP_ERR_ABORT);
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
        if (ep_timed_out() || ep_aborted(ctl)) err |= EP_ERR_ABORT;
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

