// rshmem's own kernels, compiled together with rshmem_device.cuh.

// Host-API atomics: one thread performs `op` on the word at `addr` (a peer's address as mapped
// on this GPU) and stores the old value in `out`. Ops: 0 fetch, 1 set, 2 swap, 3 compare-swap,
// 4 fetch-add, 5 fetch-and, 6 fetch-or, 7 fetch-xor.
extern "C" __global__ void rshmemi_host_amo(rshmem_u64 addr, int wide, int op, rshmem_u64 a,
                                            rshmem_u64 b, rshmem_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_u64 old = 0;
    if (wide) {
        unsigned long long* p = (unsigned long long*)addr;
        switch (op) {
        case 0: old = rshmemi_ld_acquire((const rshmem_u64*)p); break;
        case 1: rshmemi_st_release((rshmem_u64*)p, a); break;
        case 2: old = atomicExch_system(p, a); break;
        case 3: old = atomicCAS_system(p, a, b); break;
        case 4: old = atomicAdd_system(p, a); break;
        case 5: old = atomicAnd_system(p, a); break;
        case 6: old = atomicOr_system(p, a); break;
        default: old = atomicXor_system(p, a); break;
        }
    } else {
        unsigned* p = (unsigned*)addr;
        unsigned x = (unsigned)a, y = (unsigned)b;
        switch (op) {
        case 0: old = rshmemi_ld_acquire32(p); break;
        case 1: rshmemi_st_release32(p, x); break;
        case 2: old = atomicExch_system(p, x); break;
        case 3: old = atomicCAS_system(p, x, y); break;
        case 4: old = atomicAdd_system(p, x); break;
        case 5: old = atomicAnd_system(p, x); break;
        case 6: old = atomicOr_system(p, x); break;
        default: old = atomicXor_system(p, x); break;
        }
    }
    asm volatile("fence.sc.sys;" ::: "memory");
    *out = old;
}

// Stream-ordered signal add into a peer's word (after everything earlier on the stream).
extern "C" __global__ void rshmemi_signal_add(rshmem_u64 addr, rshmem_u64 v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        asm volatile("fence.sc.sys;" ::: "memory");
        rshmemi_red_add_release((rshmem_u64*)addr, v);
    }
}

// Stream-ordered wait for comparisons the stream-memory operations lack.
extern "C" __global__ void rshmemi_wait(rshmem_u64 addr, int cmp, rshmem_u64 v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) rshmemi_wait64((const rshmem_u64*)addr, cmp, v);
}

// Stream barrier: one block synchronises `team` (rshmem uses the reserved stream slot).
extern "C" __global__ void rshmemi_team_sync(rshmem_team team) { rshmem_team_sync_block(team); }

// Takes this PE's error word and the word after it (the PE a timed-out wait named, plus 1) into
// out[0..2], leaving both 0: each with one atomic exchange, so a bit that a running kernel sets
// is either taken here or left for the next take, never cleared unseen. The error word first:
// a flagging wait writes the name before the bit, so at worst a bit set between the two
// exchanges is left without its name (its timeout is reported naming no PE).
extern "C" __global__ void rshmemi_take_error(rshmem_u64* out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long* w = (unsigned long long*)rshmemi_err_word();
    out[0] = atomicExch(w, 0ull);
    out[1] = atomicExch(w + 1, 0ull);
}


// Stream-ordered operation on a PE on another node: one request to this PE's proxy (kind and
// signal bit in `op`, fields as the ring's entries carry them), waited for, so the stream's
// later work starts once it is complete at the target.
extern "C" __global__ void rshmemi_proxy_op(rshmem_u64 op, int pe, rshmem_u64 dst, rshmem_u64 src, rshmem_u64 len,
                                            rshmem_u64 sig_off, rshmem_u64 sig_val) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    rshmem_u64 t = rshmemi_proxy_post(op, pe, dst, src, len, sig_off, sig_val);
    if (t != RSHMEMI_NO_TICKET) rshmemi_proxy_wait(t, pe);
}
