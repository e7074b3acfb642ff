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
    if (P->xstage) {
        // Across nodes: the PEs of this node and this PE's forwarder on each other node.
        const rshmem_u64* words = (const rshmem_u64*)P->sig + 2 * n;
        for (int s = threadIdx.x; s < n; s += blockDim.x)
            if (!ep_remote(P, s) || ep_serves(P, s, (int)P->me)) rshmemi_wait64(words + s, RSHMEM_CMP_GE, s_c * (rshmem_u64)P->grid, ep_pe(P, s));
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("fence.acq_rel.sys;" ::: "memory");
            ep_abort_if_failed(ctl);
            EP_STAMP(ctl, 13);
        }
    } else {
        ep_wait_every_pe(P, ctl, (const rshmem_u64*)P->sig + 2 * n, s_c * (rshmem_u64)P->grid, 13);
    }
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

