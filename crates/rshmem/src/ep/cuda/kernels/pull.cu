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
        *(volatile rshmem_u64*)rshmemi_ptr(sig + EP_SIG_YOFF * n + me, pe) = yoff;
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
        s_base[d] = (const ep_t*)rshmemi_ptr((const void*)(rshmem_dstate.my_base + yoff[d]), ep_pe(P, d)) + me * C * H;
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

