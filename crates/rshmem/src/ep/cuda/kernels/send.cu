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
// Destinations on other nodes (ep_remote) get nothing from the blocks: the last block packs
// the tokens bound for each other node and puts them to the forwarder there once
// (ep_pack_nodes), which stores them into its node's receive areas and sets their data words
// (ep_fwd).
extern "C" __global__ void __launch_bounds__(512) ep_send(const ep_params* P, const ep_t* x, const ep_id* ids, const float* w) {
    __shared__ unsigned s_cnt[EP_MAX_PES];
    __shared__ unsigned s_wt[32];
    __shared__ unsigned s_wbase[32];
    __shared__ unsigned s_base[EP_MAX_PES];
    __shared__ int s_go, s_last;
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, E = (int)P->experts, El = (int)P->el;
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, G = P->grid;
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = (nth + 31) / 32;
    // Starts on ep_layout's gate, not on ep_layout's end (microseconds later: its last block
    // still puts the records and their signals). The gate is open by the time this
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
    const bool span = P->xstage != 0;
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
                if (pos < 0 || pos >= C || (span && ep_remote(P, d))) continue;
                const long long row = me * C + pos;
                unsigned* m = (unsigned*)rshmemi_ptr((unsigned*)P->recv_meta + row * RMW, ep_pe(P, d));
                for (long long i = lane; i < RMW; i += 32) m[i] = ep_record_word(ids, w, t, topk, K, i);
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
                const rshmem_u64 word = ep_records_in_word(min(hi, C), min(lo, C));
                if (!(span && ep_remote(P, d))) ep_red_max_release((rshmem_u64*)rshmemi_ptr(prog + me * G + b, ep_pe(P, d)), word);
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
                    if (pos < 0 || pos >= C || ((EP_SEND_SKIP_SELF || em) && d == me) || (span && ep_remote(P, d))) continue;
                    rshmemi_v4* dst = (rshmemi_v4*)rshmemi_ptr((ep_t*)P->recv_x + (me * C + pos) * H, ep_pe(P, d));
                    ep_store<EP_SEND_U>(dst, r, v0, lim);
                }
            } else {
                for (int d = 0; d < n; d++) {
                    const int pos = tok_pos[t * n + d];
                    if (pos < 0 || pos >= C || (em && d == me) || (span && ep_remote(P, d))) continue;
                    ep_t* dst = (ep_t*)rshmemi_ptr((ep_t*)P->recv_x + (me * C + pos) * H, ep_pe(P, d));
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
        if (!(span && ep_remote(P, d)))
            ep_signal(ctl, sig + n + me, (rshmem_u64*)P->ctl + EP_CTL_ERR, ep_pe(P, d), (rshmem_u64)(b1 - b0));
    if (span && ep_last_block(ctl, &s_last)) {
        // Every block's positions are in: once per other node, to its forwarder.
        ep_pack_nodes(P, x, ids, w, s_go ? (int)ctl[EP_CTL_TOKENS] : 0, s_go ? (int)ctl[EP_CTL_TOPK] : 1, s_go,
                      P->prog != 0);
    }
}
