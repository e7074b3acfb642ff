// Across nodes (P->xstage set): DeepEP's internode design. A token bound for another node
// crosses once, to the forwarder there (the member of that node with this PE's local index,
// modulo its size: ep_peer), which stores it over NVLink into the receive areas of its node's
// destinations at the rows the source would have used (positions keyed by the source), and in
// combine sums its node's partial rows of the token and puts one row back (the host model:
// fwd_model.rs). The node table (P->ntab, int): each member's node, then the node count and the
// most members of one node.
__device__ __forceinline__ int ep_node(const ep_params* P, int d) { return ((const int*)P->ntab)[d]; }
__device__ __forceinline__ int ep_nodes(const ep_params* P) { return ((const int*)P->ntab)[P->n]; }
__device__ __forceinline__ int ep_lmax(const ep_params* P) { return ((const int*)P->ntab)[P->n + 1]; }
// Members of node j before team member d (d's local index when d is on j).
__device__ __forceinline__ int ep_before(const ep_params* P, int j, int d) {
    int c = 0;
    for (int s = 0; s < d; s++) c += ep_node(P, s) == j;
    return c;
}
// Member q of node j (team order), or -1.
__device__ __forceinline__ int ep_member(const ep_params* P, int j, int q) {
    for (int d = 0; d < (int)P->n; d++)
        if (ep_node(P, d) == j && q-- == 0) return d;
    return -1;
}
__device__ __forceinline__ int ep_node_size(const ep_params* P, int j) { return ep_before(P, j, (int)P->n); }
// Whether member f forwards for member s (s on another node, f its local index's peer there).
__device__ __forceinline__ bool ep_serves(const ep_params* P, int f, int s) {
    const int j = ep_node(P, f);
    if (ep_node(P, s) == j) return false;
    return ep_member(P, j, ep_before(P, ep_node(P, s), s) % ep_node_size(P, j)) == f;
}
__device__ __forceinline__ bool ep_serves_any(const ep_params* P, int f) {
    for (int s = 0; s < (int)P->n; s++)
        if (ep_serves(P, f, s)) return true;
    return false;
}
// u32 words of one source's node records: a header (the row count, 3 words spare), then cap
// records.
__device__ __forceinline__ long long ep_nrec_words(const ep_params* P) { return 4 + P->ncap * (1 + 2 * P->kmax); }

// ep_send's last block (every block's positions are in tok_pos): per other node j, this PE's
// tokens bound there (any destination on j), in token order, get their node positions; their
// rows and records go into the node staging area and out in one request each to the forwarder
// on j (its node area, at this PE's slot), with the row count in the records' header, then the
// forwarder's word for this PE is set to the call number. Also the combine positions (cpos,
// ep_crecv's): this node's destinations as tok_pos, node j's row p of a token as row p % cap of
// the comb slot of j's member p / cap (members of other nodes send this PE no rows of their
// own). With !go only the header (count 0) and the signal.
__device__ void ep_pack_nodes(const ep_params* P, const ep_t* x, const ep_id* ids, const float* w, int T, int topk, bool go,
                              bool em) {
    __shared__ unsigned s_warp[32];
    __shared__ unsigned s_tot;
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, NN = ep_nodes(P), my = ep_node(P, me);
    const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, CN = P->ncap, NR = ep_nrec_words(P);
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nth >> 5;
    const int* tok_pos = (const int*)P->tok_pos;
    int* cpos = (int*)P->cpos;
    int* npos = (int*)P->npos;
    if (!go) T = 0;
    for (int j = 0; j < NN; j++) {
        unsigned base = 0;
        for (int t0 = 0; t0 < T; t0 += (int)nth) {
            const int t = t0 + (int)tid;
            bool f = false;
            for (int d = 0; d < n && t < T; d++) f |= ep_node(P, d) == j && tok_pos[(long long)t * n + d] >= 0;
            const unsigned p = base + ep_block_excl_scan(f ? 1u : 0u, s_warp, &s_tot);
            base += s_tot;
            if (t < T) {
                for (int d = 0; d < n; d++) {
                    if (ep_node(P, d) != j) continue;
                    int c = tok_pos[(long long)t * n + d];
                    if (j != my) c = f && (long long)p / C == ep_before(P, j, d) ? (int)((long long)p % C) : -1;
                    cpos[(long long)t * n + d] = c;
                }
                if (j != my) npos[t] = f ? (int)p : -1;
            }
        }
        if (j == my) continue;
        __syncthreads();
        const long long cnt = min((long long)base, CN);
        unsigned* ms = (unsigned*)P->mstage + j * NR;
        ep_t* xs = (ep_t*)P->xstage + j * CN * H;
        for (int t = (int)warp; t < T; t += (int)nwarps) {
            const long long p = npos[t];
            if (p < 0 || p >= CN) continue;
            unsigned* m = ms + 4 + p * RMW;
            for (long long i = lane; i < RMW; i += 32) m[i] = ep_record_word(ids, w, t, topk, K, i);
            if (em) ep_copy_row_canon(xs + p * H, x + (long long)t * H, H, lane);
            else ep_copy_row(xs + p * H, x + (long long)t * H, H * (long long)sizeof(ep_t), lane);
        }
        __syncthreads();
        if (tid == 0) {
            ms[0] = (unsigned)cnt;
            __threadfence_system();
            const int f = ep_member(P, j, ep_before(P, my, me) % ep_node_size(P, j));
            ep_put_remote((ep_t*)P->nx + me * CN * H, xs, cnt * H * (long long)sizeof(ep_t), P, f);
            ep_put_remote((unsigned*)P->nmeta + me * NR, ms, (4 + cnt * RMW) * 4, P, f);
            atomicAdd((unsigned long long*)P->xcount, (unsigned long long)(cnt * (H * (long long)sizeof(ep_t) + RMW * 4)));
            ep_signal_set(ctl, (rshmem_u64*)P->fsig + me, ctl[EP_CTL_EPOCH], ep_pe(P, f));
        }
        __syncthreads();
    }
}

// Dispatch across nodes (grid of n blocks, after ep_send, before ep_dwait; block s for source s
// where this PE forwards for it): waits for s's node rows (put whole before the set of its
// word), gives each row its position at each destination of this node (a scan over the rows in
// their order per destination: the source's own positions, which its count records announced)
// and keeps them (fpos, for combine); stores the records, (expert-major) the "records in" words
// of s at each destination (a pair per block of s's grid, each at most ceil(count / grid) rows,
// as ep_pstream's tickets take them), then the rows; then sets each destination's data word for
// s to what s's grid would have added (ep_xsig). Nothing here waits for an SM of another PE.
extern "C" __global__ void __launch_bounds__(512) ep_fwd(const ep_params* P) {
    __shared__ int s_go;
    __shared__ long long s_cnt;
    __shared__ unsigned s_warp[32], s_tot;
    __shared__ unsigned s_next[EP_MAX_PES];
    // ep_dwait (one block) may become resident now.
    rshmemi_grid_dep_launch();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, s = (int)blockIdx.x, my = ep_node(P, me);
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nth >> 5;
    if (s < n && ep_serves(P, me, s)) {
        const long long H = P->hidden, C = P->cap, K = P->kmax, RMW = 1 + 2 * K, CN = P->ncap, NR = ep_nrec_words(P);
        const long long G = P->grid, El = P->el, LM = ep_lmax(P);
        const int L = ep_node_size(P, my);
        const unsigned* nm = (const unsigned*)P->nmeta + s * NR;
        int* fpos = (int*)P->fpos + s * CN * LM;
        if (tid == 0) {
            // ep_layout's gate: every PE's ready signal of this call is in.
            rshmemi_wait64((const rshmem_u64*)ctl + EP_CTL_GATE, RSHMEM_CMP_EQ, 1, me);
            rshmemi_wait64((const rshmem_u64*)P->fsig + s, RSHMEM_CMP_GE, ctl[EP_CTL_EPOCH], ep_pe(P, s));
            asm volatile("fence.acq_rel.sys;" ::: "memory");
            ep_abort_if_failed(ctl);
            s_go = !ep_timed_out() && !ep_aborted(ctl) && ctl[EP_CTL_GO] != 0;
            s_cnt = s_go ? min((long long)((volatile const unsigned*)nm)[0], CN) : 0;
        }
        for (int q = (int)tid; q < L; q += (int)nth) s_next[q] = 0;
        __syncthreads();
        const long long cnt = s_cnt;
        for (long long i0 = 0; i0 < cnt; i0 += nth) {
            const long long i = i0 + tid;
            unsigned long long mask = 0;
            if (i < cnt) {
                const unsigned* m = nm + 4 + i * RMW;
                for (long long q = 0; q < K; q++) {
                    const unsigned id = m[1 + q];
                    if (id == 0xffffffffu || id >= (unsigned)P->experts) continue;
                    const int d = (int)(id / (unsigned)El);
                    if (ep_node(P, d) == my) mask |= 1ull << ep_before(P, my, d);
                }
            }
            for (int q = 0; q < L; q++) {
                const bool f = (mask >> q) & 1;
                const unsigned p = s_next[q] + ep_block_excl_scan(f ? 1u : 0u, s_warp, &s_tot);
                if (i < cnt) fpos[i * LM + q] = f ? (int)p : -1;
                __syncthreads();
                if (tid == 0) s_next[q] += s_tot;
                __syncthreads();
            }
        }
        // The records, then (expert-major) the "records in" words, then the rows.
        for (long long i = warp; i < cnt; i += nwarps) {
            for (int q = 0; q < L; q++) {
                const long long p = fpos[i * LM + q];
                if (p < 0 || p >= C) continue;
                unsigned* dst = (unsigned*)rshmemi_ptr((unsigned*)P->recv_meta + (s * C + p) * RMW, ep_pe(P, ep_member(P, my, q)));
                for (long long k = lane; k < RMW; k += 32) dst[k] = nm[4 + i * RMW + k];
            }
        }
        if (P->prog) {
            __syncthreads();
            for (long long u = tid; u < L * G; u += nth) {
                const int q = (int)(u / G);
                const long long b = u % G, c = min((long long)s_next[q], C), r = (c + G - 1) / G;
                rshmem_u64* pw = (rshmem_u64*)P->prog + s * G + b;
                ep_red_max_release((rshmem_u64*)rshmemi_ptr(pw, ep_pe(P, ep_member(P, my, q))),
                                   ep_records_in_word(min(c, (b + 1) * r), min(c, b * r)));
            }
        }
        const ep_t* nx = (const ep_t*)P->nx + s * CN * H;
        for (long long i = warp; i < cnt; i += nwarps) {
            for (int q = 0; q < L; q++) {
                const long long p = fpos[i * LM + q];
                if (p < 0 || p >= C) continue;
                ep_t* dst = (ep_t*)rshmemi_ptr((ep_t*)P->recv_x + (s * C + p) * H, ep_pe(P, ep_member(P, my, q)));
                ep_copy_row(dst, nx + i * H, H * (long long)sizeof(ep_t), lane);
            }
        }
        __syncthreads();
        for (int q = (int)tid; q < L; q += (int)nth)
            ep_signal_set(ctl, (rshmem_u64*)P->sig + n + s, ep_xsig(ctl[EP_CTL_EPOCH], G), ep_pe(P, ep_member(P, my, q)));
    }
    // ep_send's end (ep_dwait waits for this kernel's end, so for both).
    rshmemi_grid_dep_wait();
}

// Combine across nodes (grid of n blocks, after ep_csend, before ep_cwait; block s for source s
// where this PE forwards for it): waits until every member of this node wrote its partial rows
// for sources of other nodes (into its idle half of the combine area, rows (1 - parity, s, ·))
// and set this PE's word, sums each node row's partials over the node's destinations
// (ascending, f32), rounds once, and puts the rows back to s in one request per C rows (into
// the comb slots of this node's members at s, as ep_pack_nodes laid out cpos), then sets s's
// combine word for this PE to what a grid's adds would have made it (ep_xsig).
extern "C" __global__ void __launch_bounds__(512) ep_cfwd(const ep_params* P) {
    __shared__ int s_go;
    __shared__ long long s_cnt;
    // ep_cwait (one block) may become resident now.
    rshmemi_grid_dep_launch();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me, s = (int)blockIdx.x, my = ep_node(P, me);
    const unsigned tid = threadIdx.x, nth = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nth >> 5;
    if (s < n && ep_serves(P, me, s)) {
        const long long H = P->hidden, C = P->cap, CN = P->ncap, NR = ep_nrec_words(P), LM = ep_lmax(P);
        const int L = ep_node_size(P, my);
        // ep_cwait counts this push combine after this kernel: the call number is the count so
        // far plus one; the parity is ep_csend's.
        const rshmem_u64 call = ctl[EP_CTL_CPUSH] + 1;
        const long long parity = (long long)(ctl[EP_CTL_CWAIT] & 1);
        if (tid == 0) {
            for (int q = 0; q < L; q++) {
                const int d = ep_member(P, my, q);
                rshmemi_wait64((const rshmem_u64*)P->fsig + n + d, RSHMEM_CMP_GE, call, ep_pe(P, d));
            }
            asm volatile("fence.acq_rel.sys;" ::: "memory");
            ep_abort_if_failed(ctl);
            s_go = !ep_timed_out() && !ep_aborted(ctl) && ctl[EP_CTL_GO] != 0;
            s_cnt = s_go ? min((long long)((volatile const unsigned*)P->nmeta)[s * NR], CN) : 0;
        }
        __syncthreads();
        const long long cnt = min(s_cnt, L * C);
        const int* fpos = (const int*)P->fpos + s * CN * LM;
        ep_t* cx = (ep_t*)P->cx + s * CN * H;
        for (long long i = warp; i < cnt; i += nwarps) {
            for (long long h = lane; h < H; h += 32) {
                float a = 0.f;
                for (int q = 0; q < L; q++) {
                    const long long p = fpos[i * LM + q];
                    if (p < 0 || p >= C) continue;
                    const ep_t* src = (const ep_t*)P->comb + (((1 - parity) * n + s) * C + p) * H + h;
                    a += ep_f(*(const ep_t*)rshmemi_ptr(src, ep_pe(P, ep_member(P, my, q))));
                }
                ep_from(a, &cx[i * H + h]);
            }
        }
        __syncthreads();
        if (tid == 0) {
            __threadfence_system();
            for (int q = 0; q * C < cnt && q < L; q++) {
                const long long rows = min(C, cnt - q * C);
                ep_put_remote((ep_t*)P->comb + ((parity * n + ep_member(P, my, q)) * C) * H, cx + q * C * H,
                              rows * H * (long long)sizeof(ep_t), P, s);
            }
            atomicAdd((unsigned long long*)P->xcount + 1, (unsigned long long)(cnt * H * (long long)sizeof(ep_t)));
            ep_signal_set(ctl, (rshmem_u64*)P->sig + 2 * n + me, ep_xsig(call, P->grid), ep_pe(P, s));
        }
    }
    // ep_csend's end (ep_cwait waits for this kernel's end, so for both).
    rshmemi_grid_dep_wait();
}
