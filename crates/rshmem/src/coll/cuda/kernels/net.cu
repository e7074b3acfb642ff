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
//
// Reductions put a node's partial into the receiver's scratch slot of the sender's node, two
// halves used in turn. Before a put overwrites a half whose previous contents another sender
// put (or that nothing in the schedule shows folded), it waits for the receiver's
// acknowledgement: at the start of its next round after the fold, the receiver sets the
// sender's ack word of it to (exp << 32) | (folds of the slot done); the put waits until that
// word reaches (exp << 32) | ack. Acknowledgements ride the same ring as puts, so a receiver's
// are seen in order.
//
// Signal words of a team slot (symmetric, 3 · n_pes): [p] data from world PE p, [n_pes + p]
// ready arrivals from p, [2 · n_pes + p] fold acknowledgements from p. Reductions fold the
// node partials in node order (rshmemi_coll_net_fold).
//
// A call with more partners, or a round with more puts, waits or acknowledgements, than a
// launch's lists hold is split into launches: the ready arrivals to every partner are posted
// (begin = POST) before any is waited for (begin = WAIT, then WAIT | MORE, which only adds to
// the skip flag), and a round's acknowledgements, then its puts, then its waits follow each
// other in that order, as one launch runs them.
#define RSHMEMI_NET_MAX 64
#define RSHMEMI_NET_POST 1
#define RSHMEMI_NET_WAIT 2
#define RSHMEMI_NET_MORE 4
struct rshmemi_net_puts {
    rshmem_u64 dst[RSHMEMI_NET_MAX];  // symmetric address (this PE's copy) at the target
    rshmem_u64 src[RSHMEMI_NET_MAX];  // this PE's device address
    int pe[RSHMEMI_NET_MAX];          // world PE
    unsigned ack[RSHMEMI_NET_MAX];    // folds the target must have acknowledged first (0: none)
};
struct rshmemi_net_waits {
    int pe[RSHMEMI_NET_MAX];
};
struct rshmemi_net_acks {
    int pe[RSHMEMI_NET_MAX];
    unsigned v[RSHMEMI_NET_MAX];  // folds done of the slot that PE's puts use
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

#ifndef RSHMEMI_COLL_TYPED_ONLY // the untyped kernels (see common.cuh)
// A partner may finish a call without hearing from this PE after its arrival (a reduce's
// sender, a broadcast's) and post its next call's signature before this PE compared this
// one's: signature rows alternate with the pair's call count, `ck.slots` for even calls and
// `alt` (the same layout) for odd ones. A partner is at most one call ahead: its next call's
// arrival waits for this PE's, posted after this PE's compare.
extern "C" __global__ void rshmemi_coll_net_round(rshmem_u64* exp, rshmem_u64* sig, int n_pes, int begin,
                                                  unsigned round, rshmem_u64 bytes, rshmemi_net_puts p, int np,
                                                  rshmemi_net_waits w, int nw, rshmemi_net_acks a,
                                                  int na, rshmemi_check ck, rshmem_u64* skip, rshmem_u64* alt) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int me = rshmem_my_pe();
    if (begin) {
        if (begin & RSHMEMI_NET_POST) {
            for (int i = 0; i < nw; i++) {
                const rshmem_u64 call = *(volatile rshmem_u64*)(exp + w.pe[i]) + 1;
                rshmem_u64* mine = ((call & 1) ? alt : ck.slots) + (rshmem_u64)me * RSHMEMI_SIG_WORDS;
                for (int k = 0; k < RSHMEMI_SIG_WORDS; k++) rshmem_uint64_p(mine + k, ck.sig.w[k], w.pe[i]);
                // A set of the pair's call count, never an add: the proxy applies a set by a
                // copy, an add by a one-thread kernel at the target, which cannot become
                // resident while a grid fills that GPU.
                rshmem_signal_op(sig + n_pes + me, call, RSHMEM_SIGNAL_SET, w.pe[i]);
            }
            rshmem_quiet();
        }
        if (!(begin & RSHMEMI_NET_WAIT)) return;
        int bad = -1;
        for (int i = 0; i < nw; i++) {
            const int pe = w.pe[i];
            volatile rshmem_u64* e = exp + pe;
            const rshmem_u64 want = *e + 1;
            *e = want;
            rshmemi_net_wait(sig + n_pes + pe, want, pe);
            if (rshmemi_failed()) continue;
            volatile rshmem_u64* theirs = ((want & 1) ? alt : ck.slots) + (rshmem_u64)pe * RSHMEMI_SIG_WORDS;
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
        if (!(begin & RSHMEMI_NET_MORE)) *(volatile rshmem_u64*)skip = bad >= 0 ? 1 : 0;
        else if (bad >= 0) *(volatile rshmem_u64*)skip = 1;
        return;
    }
    if (*(volatile rshmem_u64*)skip) return;
    for (int i = 0; i < na; i++) {
        const rshmem_u64 v = (*(volatile rshmem_u64*)(exp + a.pe[i]) << 32) | (rshmem_u64)a.v[i];
        rshmem_signal_op(sig + 2 * n_pes + me, v, RSHMEM_SIGNAL_SET, a.pe[i]);
    }
    for (int i = 0; i < np; i++) {
        const rshmem_u64 call = *(volatile rshmem_u64*)(exp + p.pe[i]) << 32;
        if (p.ack[i] != 0) {
            rshmemi_net_wait(sig + 2 * n_pes + p.pe[i], call | (rshmem_u64)p.ack[i], p.pe[i]);
            if (rshmemi_failed()) break;
        }
        rshmem_putmem_signal_nbi((void*)p.dst[i], (const void*)p.src[i], bytes, sig + me,
                                 call | (rshmem_u64)(round + 1), RSHMEM_SIGNAL_SET, p.pe[i]);
    }
    rshmem_quiet();
    for (int i = 0; i < nw; i++) {
        const rshmem_u64 v = (*(volatile rshmem_u64*)(exp + w.pe[i]) << 32) | (rshmem_u64)(round + 1);
        rshmemi_net_wait(sig + w.pe[i], v, w.pe[i]);
    }
}

// all_to_all_v across nodes (counts known on the host). A member's data for a member of another
// node goes straight into that member's dst, at the displacement the receiver chose, which
// only the receiver knows: before its ready arrival each member puts, for each partner, the
// displacement and count it expects from it into the partner's metadata row of it (META;
// requests to one PE are carried out in order, so the row has landed when the arrival is seen;
// the partner read the row of the previous call before it sent that call's data, which this
// member waited for). After the handshake each member reads what each partner expects of it
// and puts its data there with a signal (PUT); where the counts differ it puts nothing, flags
// the error and marks the signal (round value 2), and a receiver that sees the mark flags it
// too (WAIT). Signal words are the rounds' data signals ([p]), the call count of the pair in
// the high half as there.
#define RSHMEMI_NET_A2AV_META 1
#define RSHMEMI_NET_A2AV_PUT 2
#define RSHMEMI_NET_A2AV_WAIT 4
struct rshmemi_net_a2av_list {
    int pe[RSHMEMI_NET_MAX];
    rshmem_u64 at[RSHMEMI_NET_MAX];     // META: where pe's data lands in dst; PUT: where this PE's starts in src
    rshmem_u64 count[RSHMEMI_NET_MAX];  // elements from (META) or to (PUT) pe
};
extern "C" __global__ void rshmemi_coll_net_a2av(rshmem_u64* exp, rshmem_u64* sig, rshmem_u64* meta, int n_pes,
                                                 int phase, rshmem_u64 dst, rshmem_u64 src, rshmem_u64 es,
                                                 rshmemi_net_a2av_list l, int nl, rshmem_u64* err,
                                                 rshmem_u64* skip) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int me = rshmem_my_pe();
    if (phase & RSHMEMI_NET_A2AV_META) {
        for (int i = 0; i < nl; i++) {
            rshmem_uint64_p(meta + 2 * (rshmem_u64)me, l.at[i], l.pe[i]);
            rshmem_uint64_p(meta + 2 * (rshmem_u64)me + 1, l.count[i], l.pe[i]);
        }
        rshmem_quiet();
        return;
    }
    if (rshmemi_coll_gave_up() || *(volatile rshmem_u64*)skip) return;
    if (phase & RSHMEMI_NET_A2AV_PUT) {
        for (int i = 0; i < nl; i++) {
            const int pe = l.pe[i];
            const rshmem_u64 call = *(volatile rshmem_u64*)(exp + pe) << 32;
            volatile const rshmem_u64* m = meta + 2 * (rshmem_u64)pe;
            const rshmem_u64 at = m[0], c = m[1];
            if (c != l.count[i]) {
                atomicOr((unsigned long long*)err, RSHMEMI_ERR_A2AV);
                rshmem_signal_op(sig + me, call | 2, RSHMEM_SIGNAL_SET, pe);
            } else if (c == 0) {
                rshmem_signal_op(sig + me, call | 1, RSHMEM_SIGNAL_SET, pe);
            } else {
                rshmem_putmem_signal_nbi((void*)(dst + at * es), (const void*)(src + l.at[i] * es), c * es,
                                         sig + me, call | 1, RSHMEM_SIGNAL_SET, pe);
            }
        }
        rshmem_quiet();
    }
    if (phase & RSHMEMI_NET_A2AV_WAIT) {
        for (int i = 0; i < nl; i++) {
            const int pe = l.pe[i];
            const rshmem_u64 call = *(volatile rshmem_u64*)(exp + pe) << 32;
            rshmemi_net_wait(sig + pe, call | 1, pe);
            if (!rshmemi_failed() && rshmemi_ld_acquire(sig + pe) == (call | 2))
                atomicOr((unsigned long long*)err, RSHMEMI_ERR_A2AV);
        }
    }
}

// all_to_all_v_device across nodes (counts in device memory, rshmemi_coll_a2av_dev beside it).
// Every member needs the whole count matrix (receivers pack in member order; the capacity
// verdict is the team's). ROWS, before the ready arrival: this PE's count row (n words, from
// `counts`, written by earlier stream work) into each partner's `rows` at this PE's row
// (requests to one PE are carried out in order: the row has landed when the arrival is seen;
// the partner read the previous call's row before it signalled that call's data, which this PE
// waited for). Then rshmemi_coll_a2av_dev reads the rows, checks, copies inside the node and
// writes this PE's `plan`; PUT posts, per partner, the plan's elements at the plan's places
// with a signal (a bare signal for none: every pair signals every call, which keeps the rows'
// reuse in step), WAIT waits for the partners' signals. Signal words and values as
// rshmemi_coll_net_a2av's.
#define RSHMEMI_NET_A2AVD_ROWS 1
#define RSHMEMI_NET_A2AVD_PUT 2
#define RSHMEMI_NET_A2AVD_WAIT 4
extern "C" __global__ void rshmemi_coll_net_a2avd(rshmem_u64* exp, rshmem_u64* sig, rshmem_u64* rows,
                                                  rshmem_u64 row_stride, const rshmem_u64* counts, int n,
                                                  int phase, rshmem_u64 dst, rshmem_u64 src, rshmem_u64 es,
                                                  const rshmem_u64* plan, rshmemi_net_waits l, int nl,
                                                  rshmem_u64* skip) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int me = rshmem_my_pe();
    if (phase & RSHMEMI_NET_A2AVD_ROWS) {
        for (int i = 0; i < nl; i++)
            rshmem_putmem_nbi(rows + (rshmem_u64)me * row_stride, counts, (rshmem_u64)n * 8, l.pe[i]);
        rshmem_quiet();
        return;
    }
    if (rshmemi_coll_gave_up() || *(volatile rshmem_u64*)skip) return;
    if (phase & RSHMEMI_NET_A2AVD_PUT) {
        for (int i = 0; i < nl; i++) {
            const int pe = l.pe[i];
            const rshmem_u64 call = *(volatile rshmem_u64*)(exp + pe) << 32;
            const volatile rshmem_u64* p = plan + 3 * (rshmem_u64)pe;
            const rshmem_u64 at = p[0], from = p[1], c = p[2];
            if (c == 0) {
                rshmem_signal_op(sig + me, call | 1, RSHMEM_SIGNAL_SET, pe);
            } else {
                rshmem_putmem_signal_nbi((void*)(dst + at * es), (const void*)(src + from * es), c * es,
                                         sig + me, call | 1, RSHMEM_SIGNAL_SET, pe);
            }
        }
        rshmem_quiet();
    }
    if (phase & RSHMEMI_NET_A2AVD_WAIT) {
        for (int i = 0; i < nl; i++) {
            const int pe = l.pe[i];
            const rshmem_u64 call = *(volatile rshmem_u64*)(exp + pe) << 32;
            rshmemi_net_wait(sig + pe, call | 1, pe);
        }
    }
}

#endif

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
