// ----- teams spanning nodes (rshmem::cuda::GpuColl, coll/cuda/net.rs) -----
// Inside a node the other kernels of this module run on the node's members; between nodes a
// call is a sequence of rounds, each one launch of rshmemi_coll_net_round by one thread: it
// posts this PE's puts of the round, each with a signal, into the request ring of its proxy
// (rshmem_putmem_signal_nbi: the proxy applies the signal once the data is in the target's GPU
// memory), waits for them to complete (its sources may be overwritten by the next kernel), then
// waits for the signals of the PEs whose data this round brings.
//
// The first launch of a call (begin) exchanges a ready arrival with every partner of the call:
// a PE puts into a partner's memory only after the partner reached the call on its stream (its
// earlier work on those buffers is done). Before its arrival it puts the call's signature into
// the partner's signature slot of it (requests to one PE are carried out in order), and after
// each partner's arrival it compares the partner's signature with its own: on a difference it
// records the mismatch (as rshmemi_sig_sync does) and sets the team slot's skip flag, so the
// call's later rounds and folds neither put, wait nor fold (on the partner too, which sees the
// difference as well) and the host reports CollectiveMismatch. Every begin sets the flag anew.
// (Not the device's gave-up flag: the node phase's barrier would then leave the node's
// signature slots written, and the next call on the node would take them for a mismatch.) As the device barrier's, arrivals count per pair of
// PEs: `exp[p]` (private, per team slot and world PE) is how many calls this PE has had with p,
// equal on both sides while their calls match, whatever other teams used the slot before. A
// data signal carries (exp[p] << 32) | (round + 1): new for every round of every call, so a
// captured graph replays with new values and a signal of an earlier call (one that gave up)
// never satisfies a wait of a later one.
//
// Signal words of a team slot (symmetric, 2 · n_pes): [p] data from world PE p, [n_pes + p]
// ready arrivals from p. Reductions fold the node partials in node order
// (rshmemi_coll_net_fold).
#define RSHMEMI_NET_MAX 64
struct rshmemi_net_puts {
    rshmem_u64 dst[RSHMEMI_NET_MAX];  // symmetric address (this PE's copy) at the target
    rshmem_u64 src[RSHMEMI_NET_MAX];  // this PE's device address
    int pe[RSHMEMI_NET_MAX];          // world PE
};
struct rshmemi_net_waits {
    int pe[RSHMEMI_NET_MAX];
};

// Waits until this PE's word `p` >= `v` (what PE `pe` signals); gives up, flagged as a timeout
// naming `pe`, after the device timeout, at once once an earlier wait of this PE gave up, and as
// soon as the proxy failed a request (a lost node: its PE is named).
__device__ __forceinline__ void rshmemi_net_wait(const rshmem_u64* p, rshmem_u64 v, int pe) {
    if (rshmemi_ld_acquire(p) >= v) return;
    const rshmem_u64* ring = rshmemi_ring();
    const rshmem_u64 t0 = rshmemi_now();
    unsigned spins = 0;
    while (rshmemi_ld_acquire(p) < v) {
        if (rshmemi_failed()) return;
        const rshmem_u64 e = ring ? rshmemi_ld_relaxed(ring + RSHMEMI_RING_ERR) : 0;
        if (e != 0) { rshmemi_flag_timeout((int)(e - 1)); return; }
        if ((++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
            rshmemi_flag_timeout(pe);
            return;
        }
#if __CUDA_ARCH__ >= 700
        __nanosleep(100);
#endif
    }
}

extern "C" __global__ void rshmemi_coll_net_round(rshmem_u64* exp, rshmem_u64* sig, int n_pes, int begin,
                                                  unsigned round, rshmem_u64 bytes, rshmemi_net_puts p, int np,
                                                  rshmemi_net_waits w, int nw, rshmemi_check ck,
                                                  rshmem_u64* skip) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int me = rshmem_my_pe();
    if (begin) {
        rshmem_u64* mine = ck.slots + (rshmem_u64)me * RSHMEMI_SIG_WORDS;
        for (int i = 0; i < nw; i++) {
            for (int k = 0; k < RSHMEMI_SIG_WORDS; k++) rshmem_uint64_p(mine + k, ck.sig.w[k], w.pe[i]);
            rshmem_signal_op(sig + n_pes + me, 1, RSHMEM_SIGNAL_ADD, w.pe[i]);
        }
        rshmem_quiet();
        int bad = -1;
        for (int i = 0; i < nw; i++) {
            const int pe = w.pe[i];
            volatile rshmem_u64* e = exp + pe;
            const rshmem_u64 want = *e + 1;
            *e = want;
            rshmemi_net_wait(sig + n_pes + pe, want, pe);
            if (rshmemi_failed()) continue;
            volatile rshmem_u64* theirs = ck.slots + (rshmem_u64)pe * RSHMEMI_SIG_WORDS;
            bool eq = true;
            for (int k = 0; k < RSHMEMI_SIG_WORDS; k++) eq = eq && theirs[k] == ck.sig.w[k];
            if (!eq && bad < 0) {
                bad = pe;
                unsigned long long old = atomicOr((unsigned long long*)ck.err, RSHMEMI_ERR_MISMATCH);
                if (!(old & RSHMEMI_ERR_MISMATCH)) {
                    ck.err[RSHMEMI_ERR_MM_PE] = pe;
                    for (int k = 0; k < RSHMEMI_SIG_WORDS; k++) {
                        ck.err[RSHMEMI_ERR_MM_MINE + k] = ck.sig.w[k];
                        ck.err[RSHMEMI_ERR_MM_THEIRS + k] = theirs[k];
                    }
                }
            }
            // Consumed: the partner writes it again only in a later call, after this PE's puts.
            for (int k = 0; k < RSHMEMI_SIG_WORDS; k++) theirs[k] = 0;
        }
        *(volatile rshmem_u64*)skip = bad >= 0 ? 1 : 0;
        return;
    }
    if (*(volatile rshmem_u64*)skip) return;
    for (int i = 0; i < np; i++) {
        const rshmem_u64 v = (*(volatile rshmem_u64*)(exp + p.pe[i]) << 32) | (rshmem_u64)(round + 1);
        rshmem_putmem_signal_nbi((void*)p.dst[i], (const void*)p.src[i], bytes, sig + me, v, RSHMEM_SIGNAL_SET,
                                 p.pe[i]);
    }
    rshmem_quiet();
    for (int i = 0; i < nw; i++) {
        const rshmem_u64 v = (*(volatile rshmem_u64*)(exp + w.pe[i]) << 32) | (rshmem_u64)(round + 1);
        rshmemi_net_wait(sig + w.pe[i], v, w.pe[i]);
    }
}

// dst[0..n) = fold over i = 0..k-1 (node order) of s.p[i][0..n), where s.p[i] == 0 stands for
// dst itself (this node's partial). Each element is read from every source before it is written.
struct rshmemi_net_srcs {
    rshmem_u64 p[RSHMEMI_NET_MAX];
};
template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_net_fold(T* dst, const rshmemi_net_srcs& s, int k, rshmem_u64 n) {
    const rshmem_u64 tid = blockIdx.x * (rshmem_u64)blockDim.x + threadIdx.x;
    const rshmem_u64 nth = (rshmem_u64)gridDim.x * blockDim.x;
    for (rshmem_u64 j = tid; j < n; j += nth) {
        const T* a = s.p[0] ? (const T*)s.p[0] : dst;
        A acc = rshmemi_cvt<T, A>::in(a[j]);
        for (int i = 1; i < k; i++) {
            const T* b = s.p[i] ? (const T*)s.p[i] : dst;
            acc = rshmemi_apply<A, OP>(acc, rshmemi_cvt<T, A>::in(b[j]));
        }
        dst[j] = rshmemi_cvt<T, A>::out(acc);
    }
}
#define RSHMEMI_COLL_NET_FOLD_KERNEL(NAME, T, A, OPN, OP)                                              \
    extern "C" __global__ void rshmemi_coll_net_fold_##NAME##_##OPN(T* dst, rshmemi_net_srcs s, int k, \
                                                                     rshmem_u64 n,                     \
                                                                     const rshmem_u64* skip) {         \
        if (!rshmemi_coll_gave_up() && !*(volatile const rshmem_u64*)skip)                             \
            rshmemi_net_fold<T, A, OP>(dst, s, k, n);                                                  \
    }
#define RSHMEMI_COLL_INT_NET_FOLD(NAME, T, A) RSHMEMI_COLL_INT_OPS(RSHMEMI_COLL_NET_FOLD_KERNEL, NAME, T, A)
#define RSHMEMI_COLL_FLOAT_NET_FOLD(NAME, T, A) RSHMEMI_COLL_FLOAT_OPS(RSHMEMI_COLL_NET_FOLD_KERNEL, NAME, T, A)
RSHMEMI_COLL_INT_TYPES(RSHMEMI_COLL_INT_NET_FOLD)
RSHMEMI_COLL_FLOAT_TYPES(RSHMEMI_COLL_FLOAT_NET_FOLD)
