// ----- LL paths (small messages; rshmem::cuda::GpuColl::ll_sizes): the one-shot all_reduce and
// reduce_scatter (rshmemi_coll_ll_*), all_to_all, all_gather and broadcast (rshmemi_coll_ll_move_*),
// and the handshake of the pull all_to_all. Described for the all_reduce; the others differ in
// what each member pushes to whom. -----
// No barrier waits: every member pushes its input, 8 bytes per 16-byte line {lo, flag, hi, flag}
// (each 8-byte half is written and read as one access, so a half carrying the current flag
// carries its data), into every member's LL area; each member waits for the lines of every
// other member and folds them in team order with its own input. The call's signature travels
// as the first RSHMEMI_SIG_WORDS lines (the header).
//
// Flag and buffer of a pair (sender s, receiver r): the flag (rshmemi_ll_flag) joins the
// barrier expectation each keeps for the other and the pair's LL sequence, a private note of
// each side (equal on both while the calls match, and new for every call). s writes its lines
// into the half of its region (by world PE) in r's area that the sequence's parity names, and
// r reads the half of the same parity (the sequences are equal). s finishes an LL call only after r started
// it (r's header or slot arrived), so r has finished its call before, and with it the last
// read of the half s writes next. No fence, no barrier counter and no atomic (one block) on
// the way of a matched call: system-scope fences cost a round trip over NVLink each, which
// would more than double a call's time.
//
// A member whose call is not an LL call (another collective, other arguments beyond the
// LL size) writes its signature into this member's slot row before its first barrier (see
// rshmemi_sig_sync); a waiting member that finds it there instead of a header records the
// mismatch, clears its slots and then gives it the arrivals of every barrier that call runs
// (it waits for them), with the expectation moved by as many, so both sides report
// CollectiveMismatch, the counters stay in step, and the pair's next flag is new. A member
// in a plain barrier (no collective) meets neither a header nor a slot: both sides time out.
// A mismatched call writes nothing to dst; a wait that times out stops the writing (dst is
// then partly written; the host reports the timeout).
#define RSHMEMI_LL_MAX_MEMBERS 16
// Most blocks of an LL kernel (rshmem::cuda::GpuColl checks every LL grid against it): each
// block keeps its own copy of the pair sequences (rshmemi_ll::done), which the block alone
// reads and moves in a call, so the blocks of a call never wait for one another at its end.
#define RSHMEMI_LL_MAX_BLOCKS 128

struct rshmemi_ll {
    rshmem_u64 area;   // this PE's LL area of the team's slot (symmetric): [2 halves][source world PE][lines] x 16 B
    rshmem_u64 lines;  // lines per (half, source member)
    unsigned* done;    // private, per slot: [0] the blocks' end arrivals (rshmemi_ll_end),
                       // [1 + block · n_pes + world PE] block's copy of the pair's LL sequence
                       // (its parity: the half written next; every copy of a pair is equal
                       // between calls)
    rshmem_u64 flags;  // RSHMEMI_LL_EARLY_LAUNCH, RSHMEMI_LL_CTRL_WARP
};
// rshmemi_ll::flags: this PE has its GPU to itself, so the kernel lets the next (dependent)
// kernel on its stream launch as soon as it starts (rshmemi_ll_begin): that kernel's blocks wait
// in rshmemi_grid_dep_wait until this one has ended, and its launch no longer follows this
// kernel's end. (With PEs sharing the GPU the trigger waits for the end of the waits for
// peers, rshmemi_ll_end: blocks waiting there could hold SMs a peer's kernel needs.) The host
// sets it for the LL all_reduce / reduce_scatter kernel and the LL data kernels, not for the
// pull kernels (GpuColl::ll_early).
#define RSHMEMI_LL_EARLY_LAUNCH 1ull
// rshmemi_ll::flags (the LL all_reduce kernel on a grid of several blocks, up to 16 KiB; the
// kernel also runs it for the reduce_scatter, which is slower with it): the
// last warp of each block is a control warp, launched beside the data threads (blockDim.x - 32
// of them, a line each): it pushes the header and takes the verdict on the first other member,
// and has no data line, so the data threads poll their first lines beside the verdict instead of
// after it (a warp with both would take the verdict and then one more load round trip for its
// line).
#define RSHMEMI_LL_CTRL_WARP 2ull

__device__ __forceinline__ void rshmemi_ll_store(rshmem_u64* p, rshmem_u64 v, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"((unsigned)v), "r"(flag),
                 "r"((unsigned)(v >> 32)), "r"(flag) : "memory");
}
// True (and the payload in *v) when both halves of the line at p carry `flag`.
__device__ __forceinline__ bool rshmemi_ll_load(const rshmem_u64* p, unsigned flag, rshmem_u64* v) {
    unsigned a, f1, b, f2;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(f1), "=r"(b), "=r"(f2) : "l"(p) : "memory");
    *v = (rshmem_u64)a | ((rshmem_u64)b << 32);
    return f1 == flag && f2 == flag;
}

// The 8 bytes of line l of src (elements of T, zeros past n).
template <typename T> __device__ __forceinline__ rshmem_u64 rshmemi_ll_pack(const T* src, rshmem_u64 n, rshmem_u64 l) {
    const int k = 8 / (int)sizeof(T);
    const T* p = src + l * k;
    // A whole line, 8-byte aligned: one load; 4-byte aligned: two.
    if ((l + 1) * k <= n) {
        if (((rshmem_u64)p & 7) == 0) return *(const rshmem_u64*)p;
        if (((rshmem_u64)p & 3) == 0)
            return (rshmem_u64)((const unsigned*)p)[0] | ((rshmem_u64)((const unsigned*)p)[1] << 32);
    }
    union { rshmem_u64 u; T e[8 / sizeof(T)]; } w;
    w.u = 0;
#pragma unroll
    for (int q = 0; q < k; q++) {
        const rshmem_u64 i = l * k + q;
        if (i < n) w.e[q] = src[i];
    }
    return w.u;
}

// Per member i of the team: the flag of this call's pair, where this PE's lines go in i's
// area (the half the pair's sequence names), and where i's lines for this call lie in this
// PE's area (the same half: the sequences are equal on both sides).
struct rshmemi_ll_peer {
    unsigned flag;
    unsigned seq;            // the pair's LL sequence at this call (rshmemi_ll_end moves it)
    rshmem_u64* to;          // 16-byte lines: 2 words each
    const rshmem_u64* from;
};

// Block b's copy of the pair sequence of this PE and world PE pe (done: rshmemi_ll::done).
__device__ __forceinline__ unsigned* rshmemi_ll_seq(unsigned* done, unsigned b, int pe) {
    return done + 1 + (rshmem_u64)b * rshmem_dstate.n_pes + pe;
}

__device__ __forceinline__ const rshmem_u64* rshmemi_ll_lines(const rshmemi_ll& ll, unsigned half, int src, int n_pes) {
    return (const rshmem_u64*)ll.area + (((rshmem_u64)(half & 1) * n_pes + src) * ll.lines) * 2;
}

// True when the header in `h` (RSHMEMI_SIG_WORDS lines) carries `flag`; *same: it equals sig.
__device__ __forceinline__ bool rshmemi_ll_header(const rshmem_u64* h, unsigned flag, const rshmemi_check& ck, bool* same) {
    bool all = true;
    *same = true;
    for (int w = 0; w < RSHMEMI_SIG_WORDS && all; w++) {
        rshmem_u64 v;
        all = rshmemi_ll_load(h + 2 * w, flag, &v);
        *same = *same && v == ck.sig.w[w];
    }
    return all;
}

// RSHMEMI_LL_NOP 1 (a compile option for measurements, through RSHMEM_CUDA_COLL_NVRTC_OPTS):
// the LL kernels return at once, what is left being the launch floor. Wrong results.
#ifndef RSHMEMI_LL_NOP
#define RSHMEMI_LL_NOP 0
#endif
// RSHMEMI_LL_STOP k (measurements only, wrong results): the LL all_reduce (not reduce_scatter)
// returns after rshmemi_ll_begin (1) or after pushing its header and data lines (2), no wait
// before either: what the launch, the begin loads and the pushes (with whatever the kernel's
// end waits for after remote stores) cost, against RSHMEMI_LL_NOP's bare launch.
#ifndef RSHMEMI_LL_STOP
#define RSHMEMI_LL_STOP 0
#endif
// RSHMEMI_LL_AR_EARLY: whether the LL all_reduce waits for its first lines beside the verdicts
// (1) or after them (0); 2 (the default): beside them in a call of one block or with a control
// warp (RSHMEMI_LL_CTRL_WARP), after them in a call of more blocks without (see
// rshmemi_ll_all_reduce).
#ifndef RSHMEMI_LL_AR_EARLY
#define RSHMEMI_LL_AR_EARLY 2
#endif
// RSHMEMI_LL_HEADER_LAST_WARP 0 (measurements): block 0's threads 0..5 push the header, not
// lanes 0..5 of its last warp (see rshmemi_ll_push_header).
#ifndef RSHMEMI_LL_HEADER_LAST_WARP
#define RSHMEMI_LL_HEADER_LAST_WARP 1
#endif
// RSHMEMI_LL_BEGIN_WEAK 0 (measurements): rshmemi_ll_begin reads the pair sequences, the
// expectations and the error word with volatile loads, not plain ones.
#ifndef RSHMEMI_LL_BEGIN_WEAK
#define RSHMEMI_LL_BEGIN_WEAK 1
#endif
// RSHMEMI_LL_STAMPS 2: also runs the LL all_reduce's header push and data push a second time
// each (the same values: harmless) and prints what the repeats cost. (Not the begin: it moves
// the sequences.)
// RSHMEMI_LL_STAMPS 1 (measurements only): block 0's thread 0 of the LL all_reduce takes the
// SM clock at each step of a call (and the last warp when its verdict is in), and every 32nd
// call prints the steps' cycles, the globaltimer span of the call and the gap since the
// previous call's end (device printf). Calls count per module (rshmem::cuda::COLL_MODULES):
// the calls and gaps of one element type's kernels, or of the LL data movers.
#ifndef RSHMEMI_LL_STAMPS
#define RSHMEMI_LL_STAMPS 0
#endif
#if RSHMEMI_LL_STAMPS
__device__ unsigned long long rshmemi_stamp_prev_end;
__device__ unsigned rshmemi_stamp_calls;
// Block 0's thread 0 at the end of a call: st[0..k] (cycles), g0 the globaltimer at st[0].
__device__ void rshmemi_ll_stamps_print(const char* what, rshmem_u64 n, const long long* st, int k, rshmem_u64 g0, long long vt,
                                        long long sb, const long long* x = nullptr) {
    const rshmem_u64 g1 = rshmemi_now(), prev = rshmemi_stamp_prev_end;
    rshmemi_stamp_prev_end = g1;
    if (atomicAdd(&rshmemi_stamp_calls, 1u) % 32 != 31) return;
    long long d[8];
    for (int i = 0; i < 8; i++) d[i] = i < k ? st[i + 1] - st[i] : 0;
    printf("ll_stamps %s pe %d n %llu blocks %u cyc %lld %lld %lld %lld %lld %lld %lld %lld loads %lld verdict %lld | ns span %llu gap %llu\n",
           what, rshmem_dstate.my_pe, (unsigned long long)n, gridDim.x, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
           sb - st[0], vt - st[0], (unsigned long long)(g1 - g0), (unsigned long long)(g0 - prev));
    if (x) printf("ll_stamps %s pe %d n %llu again: header %lld data %lld\n", what, rshmem_dstate.my_pe,
                  (unsigned long long)n, x[1], x[2]);
}
#endif
#define RSHMEMI_LL_STAMP(st, k)                                                                   \
    do {                                                                                           \
        if (RSHMEMI_LL_STAMPS && blockIdx.x == 0 && threadIdx.x == 0) (st)[k] = clock64();       \
    } while (0)

// RSHMEMI_LL_SKIP_VERDICT 1 (measurements only: a mismatched call goes unseen): no header
// verdicts, the data lines' flags alone; what the verdict warps and their poll cost.
#ifndef RSHMEMI_LL_SKIP_VERDICT
#define RSHMEMI_LL_SKIP_VERDICT 0
#endif

// The flag of a pair's LL call: the low 31 bits of the sum of the barrier expectation each
// keeps for the other (moved by barrier-based calls, and by the padding of a mismatch) and the
// pair's LL sequence (moved by every LL call both ran); bit 31 set, so never 0 (the area's
// initial contents). Neither ever goes down and the sequence moves at every LL call, so the sum
// grows with every call: a line left in the area by an earlier call (a larger one, whose lines
// this call does not write) never carries this call's flag within 2^31 calls of the pair. (A
// flag of 16 bits of the expectation beside 15 of the sequence would come back after 32768 LL
// calls without a barrier-based one: a call as large as one 32768 calls before it would take
// that call's stale lines for its own. RSHMEMI_LL_FLAG_15 1, a compile option for the test
// that shows it, builds that flag.)
#ifndef RSHMEMI_LL_FLAG_15
#define RSHMEMI_LL_FLAG_15 0
#endif
__device__ __forceinline__ unsigned rshmemi_ll_flag(rshmem_u64 exp, unsigned seq) {
    if (RSHMEMI_LL_FLAG_15) return ((unsigned)(exp & 0xffff) << 16) | 0x8000u | (seq & 0x7fffu);
    return 0x80000000u | (((unsigned)exp + seq) & 0x7fffffffu);
}

// A wait's check every 256th spin: true when an earlier wait gave up, or this one has waited
// past the timeout since its first check (flagged, naming pe).
__device__ __forceinline__ bool rshmemi_ll_gave_up(unsigned spins, rshmem_u64* t0, int pe) {
    if ((spins & 255) != 0) return false;
    if (rshmemi_failed()) return true;
    if (*t0 == 0) {
        *t0 = rshmemi_now();
        return false;
    }
    if (rshmemi_now() - *t0 <= rshmem_dstate.timeout_ns) return false;
    rshmemi_flag_timeout(pe);
    return true;
}

// One warp's verdict on world PE pe: 0 its header has arrived and equals sig; 1 it differs;
// 2 pe is in a barrier-based call (its signature is in this PE's slot row); -1 gave up
// (timeout flagged). Lanes 0..5 read the header's lines at once (one load's latency per spin,
// not six); *w0: the slot's word 0 (kind 2). Every lane returns the same.
__device__ int rshmemi_ll_verdict(const rshmemi_ll_peer& p, int pe, const rshmemi_check& ck, rshmem_u64* w0) {
    const unsigned lane = threadIdx.x & 31;
    const bool reads = lane < RSHMEMI_SIG_WORDS;
    const rshmem_u64 want = reads ? ck.sig.w[lane] : 0;
    const unsigned all = (1u << RSHMEMI_SIG_WORDS) - 1;
    rshmem_u64 t0 = 0;
    // The header at every spin; the slot (a mismatch, rare) every 8th; the error word and the
    // clock every 256th.
    for (unsigned spins = 1;; spins++) {
        bool slot_seen = false;
        for (int look = 0; look < 2; look++) {
            rshmem_u64 v = 0;
            const bool ok = reads && rshmemi_ll_load(p.from + 2 * lane, p.flag, &v);
            const unsigned okb = __ballot_sync(~0u, ok), same = __ballot_sync(~0u, ok && v == want);
            if ((okb & all) == all) return (same & all) == all ? 0 : 1;
            // A slot write of that member comes after its header of this call would have
            // (that from an earlier kernel of it): seeing the slot, look at the header once more.
            if (slot_seen) return 2;
            if ((spins & 7) != 0) break;
            rshmem_u64 s = 0;
            if (lane == 0) s = rshmemi_ld_acquire(ck.slots + (rshmem_u64)pe * RSHMEMI_SIG_WORDS);
            s = __shfl_sync(~0u, s, 0);
            if (s == 0) break;
            *w0 = s;
            slot_seen = true;
        }
        if ((spins & 255) != 0) continue;
        const int stop = lane == 0 && rshmemi_ll_gave_up(spins, &t0, pe);
        if (__shfl_sync(~0u, stop, 0)) return -1;
    }
}

// Member i's line at p, waited for: false when `abort` rose first (a verdict against the
// call), an earlier wait gave up, or this one timed out (flagged, naming the member).
__device__ __forceinline__ bool rshmemi_ll_wait_line(const rshmem_u64* p, unsigned flag, rshmem_u64* v,
                                                     const volatile int* abort, int pe) {
    rshmem_u64 t0 = 0;
    for (unsigned spins = 1; !rshmemi_ll_load(p, flag, v); spins++) {
        if (*abort) return false;
        // The error word and the clock only every 256 spins (a load fewer per spin).
        if (rshmemi_ll_gave_up(spins, &t0, pe)) return false;
    }
    return true;
}

// Lines a thread handles at once (its lines l0 + u·gn, u < U): every load of a batch is issued
// before any is checked, so a thread with several lines waits one load latency per batch,
// not one per line.
// (Compile options for measurements; the host's grid sizes assume these defaults.)
#ifndef RSHMEMI_LL_U
#define RSHMEMI_LL_U 4
#endif
#ifndef RSHMEMI_LL_A2A_U
#define RSHMEMI_LL_A2A_U 8
#endif

// The data lines base + 2·(l0 + u·gn), u < U, of those below lim, waited for until each
// carries `flag` (payloads in v); false as rshmemi_ll_wait_line.
template <int U>
__device__ __forceinline__ bool rshmemi_ll_wait_lines(const rshmem_u64* base, rshmem_u64 l0, rshmem_u64 gn, rshmem_u64 lim,
                                                      unsigned flag, rshmem_u64* v, const volatile int* abort, int pe) {
    unsigned ok = 0;
#pragma unroll
    for (int u = 0; u < U; u++) {
        v[u] = 0;
        if (l0 + u * gn >= lim) ok |= 1u << u;
    }
    rshmem_u64 t0 = 0;
    for (unsigned spins = 1;; spins++) {
        unsigned a[U], f1[U], b[U], f2[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            a[u] = f1[u] = b[u] = f2[u] = 0;
            if (!((ok >> u) & 1))
                asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a[u]), "=r"(f1[u]), "=r"(b[u]), "=r"(f2[u])
                             : "l"(base + 2 * (l0 + u * gn))
                             : "memory");
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (!((ok >> u) & 1) && f1[u] == flag && f2[u] == flag) {
                v[u] = (rshmem_u64)a[u] | ((rshmem_u64)b[u] << 32);
                ok |= 1u << u;
            }
        if (ok == (1u << U) - 1) return true;
        if (*abort) return false;
        if (rshmemi_ll_gave_up(spins, &t0, pe)) return false;
    }
}

// The fold, in team order, of lines l0 + u·gn (u < U, below dl) of every member (this PE's
// from src); false when a line did not come (see rshmemi_ll_wait_line).
template <typename T, typename A, int OP, int U>
__device__ __forceinline__ bool rshmemi_ll_fold(A (*acc)[8 / sizeof(T)], const T* src, rshmem_u64 n, rshmem_u64 l0,
                                                rshmem_u64 gn, rshmem_u64 dl, int me, const rshmem_team& team,
                                                const rshmemi_ll_peer* peers, const volatile int* abort) {
    const int K = 8 / (int)sizeof(T);
    for (int i = 0; i < team.size; i++) {
        rshmem_u64 v[U];
        if (i == me) {
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = l0 + u * gn < dl ? rshmemi_ll_pack(src, n, l0 + u * gn) : 0;
        } else if (!rshmemi_ll_wait_lines<U>(peers[i].from + 2 * RSHMEMI_SIG_WORDS, l0, gn, dl, peers[i].flag, v, abort,
                                             rshmemi_member(team, i))) {
            return false;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            union { rshmem_u64 u; T e[8 / sizeof(T)]; } w;
            w.u = v[u];
#pragma unroll
            for (int q = 0; q < K; q++) {
                const A x = rshmemi_cvt<T, A>::in(w.e[q]);
                acc[u][q] = i == 0 ? x : rshmemi_apply<A, OP>(acc[u][q], x);
            }
        }
    }
    return true;
}

// Lines l0 + u·gn (u < U, below dl) of the result into dst.
template <typename T, typename A, int OP, int U>
__device__ __forceinline__ void rshmemi_ll_write(T* dst, const A (*acc)[8 / sizeof(T)], rshmem_u64 n, rshmem_u64 l0,
                                                 rshmem_u64 gn, rshmem_u64 dl) {
    const int K = 8 / (int)sizeof(T);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const rshmem_u64 l = l0 + u * gn;
        if (l >= dl) continue;
        T* p = dst + l * K;
        if ((l + 1) * K <= n && ((rshmem_u64)p & 7) == 0) {
            union { rshmem_u64 u; T e[8 / sizeof(T)]; } w;
#pragma unroll
            for (int q = 0; q < K; q++) w.e[q] = rshmemi_cvt<T, A>::out(acc[u][q]);
            *(rshmem_u64*)p = w.u;
            continue;
        }
#pragma unroll
        for (int q = 0; q < K; q++)
            if (l * K + q < n) p[q] = rshmemi_cvt<T, A>::out(acc[u][q]);
    }
}

// What the blocks of an LL call keep in shared memory.
struct rshmemi_ll_shared {
    rshmemi_ll_peer peer[RSHMEMI_LL_MAX_MEMBERS];
    int kind[RSHMEMI_LL_MAX_MEMBERS];         // rshmemi_ll_verdict per member
    rshmem_u64 w0[RSHMEMI_LL_MAX_MEMBERS];    // its slot's word 0 (kind 2)
    unsigned* done;   // rshmemi_ll::done and whether the early-launch flag is set: what the end
    unsigned early;   // needs, read at the begin (kernel arguments read late waited for a load)
    int verdict;  // 0 ok, 1 mismatch, -1 gave up
    int abort;    // a verdict against the call: line waits stop
    unsigned syncs;
    int bad;
#if RSHMEMI_LL_STAMPS
    long long stamp_b;  // block 0's thread 0 when its begin loads are in
    long long stamp_e[2];  // its rshmemi_ll_end: start, after the sequences (a matched call)
#endif
};

// What a block's begin needs that no kernel writes (kernel arguments, rshmem_dstate, the heap
// base table), per member thread (thread i < N for member i: N <= RSHMEMI_LL_MAX_MEMBERS < 32
// <= blockDim.x) and for the last thread (the error word). The LL all_reduce computes it before
// rshmemi_grid_dep_wait (RSHMEMI_LL_PREP), so that the loads after the wait are the begin's only
// ones; so do the other LL kernels and the pull kernels (rshmemi_pull_handshake).
struct rshmemi_ll_prep {
    unsigned* sq;           // this block's copy of the pair sequence with the member
    const rshmem_u64* ex;   // this PE's barrier expectation for the member
    rshmem_u64 to;          // where this PE's lines go in the member's area (half 0)
    rshmem_u64 from;        // where the member's lines lie in this PE's area (half 0)
    rshmem_u64 half;        // bytes from half 0 to half 1
    const rshmem_u64* err;  // this PE's error word
};
// RSHMEMI_LL_PREP 0 (measurements): the values are computed before the wait but not kept in
// registers (the compiler may load the arguments again after it), which makes small calls
// slower.
#ifndef RSHMEMI_LL_PREP
#define RSHMEMI_LL_PREP 1
#endif
__device__ __forceinline__ rshmemi_ll_prep rshmemi_ll_prepare(const rshmem_team& team, const rshmemi_ll& ll,
                                                              const rshmem_u64* exp) {
    rshmemi_ll_prep P;
    const int n_pes = rshmem_dstate.n_pes, i = threadIdx.x;
    const int pe = rshmemi_member(team, i < team.size ? i : 0);
    P.sq = rshmemi_ll_seq(ll.done, blockIdx.x, pe);
    P.ex = exp + pe;
    P.to = (rshmem_u64)rshmemi_ptr(rshmemi_ll_lines(ll, 0, rshmem_dstate.my_pe, n_pes), pe);
    P.from = (rshmem_u64)rshmemi_ll_lines(ll, 0, pe, n_pes);
    P.half = (rshmem_u64)n_pes * ll.lines * 16;
    P.err = rshmemi_err_word();
    return P;
}
// Keeps P in registers from here on (before rshmemi_grid_dep_wait: the compiler would otherwise
// load the arguments again where they are used, after the wait).
__device__ __forceinline__ void rshmemi_ll_pin(rshmemi_ll_prep& P) {
    asm volatile("" : "+l"(P.sq), "+l"(P.ex), "+l"(P.to), "+l"(P.from), "+l"(P.half), "+l"(P.err));
}

// The pair flags and where lines go and come from, per member; an earlier wait that gave up
// (sticky until the host reads it), after rshmemi_grid_dep_wait. Ends with __syncthreads.
__device__ __forceinline__ void rshmemi_ll_begin(rshmemi_ll_shared& S, const rshmem_team& team, const rshmemi_ll& ll,
                                                 const rshmemi_ll_prep& P) {
    const int N = team.size;
    if (ll.flags & RSHMEMI_LL_EARLY_LAUNCH) rshmemi_grid_dep_launch();
    // The last thread (no member of its own while N < blockDim.x): its load of the error word
    // is not queued behind a member's loads, so the block waits one load latency, not two.
    // Plain loads (RSHMEMI_LL_BEGIN_WEAK): only this PE's earlier kernels and the host (between
    // kernels) write these words, and a kernel sees what the kernels before it wrote.
    if (threadIdx.x == blockDim.x - 1) {
        S.verdict = (RSHMEMI_LL_BEGIN_WEAK ? *P.err != 0 : *(const volatile rshmem_u64*)P.err != 0) ? -1 : 0;
        S.abort = 0;
        S.done = ll.done;
        S.early = (ll.flags & RSHMEMI_LL_EARLY_LAUNCH) != 0;
    }
    const int i = threadIdx.x;
    if (i < N) {
        // (Two statements: `c ? *p : *(volatile T*)p` is a volatile lvalue whatever c, so the
        // weak form, written so until now, compiled to volatile loads too.)
#if RSHMEMI_LL_BEGIN_WEAK
        const unsigned seq = *P.sq;
        const rshmem_u64 e = *P.ex;
#else
        const unsigned seq = *(const volatile unsigned*)P.sq;
        const rshmem_u64 e = *(volatile const rshmem_u64*)P.ex;
#endif
        // This block's copy moves on at once (no block but this one reads it in this call; a
        // mismatch moves some back, rshmemi_ll_end), so the end of a call has nothing to store.
        if (i != team.my_index) *P.sq = seq + 1;
        else S.kind[i] = 0;  // (rshmemi_ll_verdicts takes the others')
        const rshmem_u64 h = (seq & 1) ? P.half : 0;
        S.peer[i].seq = seq;
        S.peer[i].flag = rshmemi_ll_flag(e, seq);
        S.peer[i].to = (rshmem_u64*)(P.to + h);
        S.peer[i].from = (const rshmem_u64*)(P.from + h);
    }
#if RSHMEMI_LL_STAMPS
    if (blockIdx.x == 0 && threadIdx.x == 0) S.stamp_b = clock64();
#endif
    __syncthreads();
}

// Line l to member j (the pair's flag is the same on both sides).
__device__ __forceinline__ void rshmemi_ll_push(const rshmemi_ll_shared& S, int j, rshmem_u64 l, rshmem_u64 v) {
    rshmemi_ll_store(S.peer[j].to + 2 * l, v, S.peer[j].flag);
}

// The header to every other member (lanes 0..5 of block 0's last warp: one copy per pair,
// which the receiver's blocks each check on their own). Not thread 0's: every store into a
// peer costs its thread several hundred cycles, and thread 0 pushes the first data line.
// The header word this thread pushes (rshmemi_ll_push_header), RSHMEMI_SIG_WORDS or more: none.
__device__ __forceinline__ unsigned rshmemi_ll_header_word() {
    if (blockIdx.x != 0) return RSHMEMI_SIG_WORDS;
    return RSHMEMI_LL_HEADER_LAST_WARP ? threadIdx.x - (blockDim.x - 32) : threadIdx.x;
}
__device__ __forceinline__ void rshmemi_ll_push_header(const rshmemi_ll_shared& S, const rshmem_team& team,
                                                       const rshmemi_check& ck) {
    const unsigned t = rshmemi_ll_header_word();
    if (t >= RSHMEMI_SIG_WORDS) return;
    for (int k = 1; k < team.size; k++) rshmemi_ll_push(S, (team.my_index + k) % team.size, t, ck.sig.w[t]);
}

// Block 0 of a call of G blocks: the copies of the pair sequences of blocks G and up (no block
// of this call reads them) move on with block 0's, which rshmemi_ll_begin moved (so every copy
// of a pair is the same at the start of every call, whatever the grids). Every thread of the
// block, after the begin (the LL kernels call it beside their verdicts, where the block waits
// for its peers anyway).
__device__ __forceinline__ void rshmemi_ll_fill(const rshmemi_ll_shared& S, const rshmem_team& team) {
    if (blockIdx.x != 0) return;
    for (int i = 0; i < team.size; i++) {
        if (i == team.my_index) continue;
        const int pe = rshmemi_member(team, i);
        const unsigned v = S.peer[i].seq + 1;
        for (unsigned b = gridDim.x + threadIdx.x; b < RSHMEMI_LL_MAX_BLOCKS; b += blockDim.x)
            *rshmemi_ll_seq(S.done, b, pe) = v;
    }
}

// Every member's verdict, one warp per member from the last warp down (the first warps are
// left to the threads that poll the first data lines meanwhile); a verdict against the call
// raises S.abort. acquire (the pull path, which reads what members wrote before their header):
// a warp that saw a header acquires (its fence after that load; the warps doing this pushed
// nothing, so the fence waits for no round trip), and the block's later reads follow it
// through rshmemi_ll_resolve's __syncthreads.
__device__ __forceinline__ void rshmemi_ll_verdicts(rshmemi_ll_shared& S, const rshmem_team& team, const rshmemi_check& ck,
                                                    bool acquire = false) {
    const unsigned tid = threadIdx.x, nwarps = blockDim.x >> 5, rwarp = nwarps - 1 - (tid >> 5);
    rshmemi_ll_fill(S, team);
    if (RSHMEMI_LL_SKIP_VERDICT) {
        for (int i = tid; i < team.size; i += blockDim.x) S.kind[i] = 0;
        return;
    }
    // The last warp takes the next member's (team order after this PE), the one below it the
    // member after that, and so on (this PE's own kind is 0 from rshmemi_ll_begin).
    for (int k = rwarp; k < team.size - 1; k += nwarps) {
        const int i = (team.my_index + 1 + k) % team.size;
        rshmem_u64 w0 = 0;
        const int v = rshmemi_ll_verdict(S.peer[i], rshmemi_member(team, i), ck, &w0);
        if (acquire && v == 0) asm volatile("fence.acq_rel.sys;" ::: "memory");
        // (The acquire that orders what the member wrote before this header before this PE's
        // later slot writes into its row is the fence in rshmemi_sig_sync, before those writes.)
        if ((tid & 31) == 0) {
            S.kind[i] = v;
            S.w0[i] = w0;
            if (v != 0) *(volatile int*)&S.abort = 1;
            if (v > 0) atomicMax(&S.verdict, 1);
        }
    }
}

// After every thread's verdict work: -1 (gave up, now or before) wins over 1.
__device__ __forceinline__ void rshmemi_ll_resolve(rshmemi_ll_shared& S, int N) {
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 0; i < N; i++)
            if (S.kind[i] < 0) S.verdict = -1;
    __syncthreads();
}

// After a call against which a verdict went (rshmemi_ll_end): this block's copies (in block 0
// also those of blocks gridDim.x and up) of the sequences of members that did not run an LL
// call too (a barrier-based one, kind 2, or whose verdict gave up, -1) go back to this call's
// (rshmemi_ll_begin and rshmemi_ll_fill moved every one on).
__device__ __forceinline__ void rshmemi_ll_unmove_seqs(const rshmemi_ll_shared& S, const rshmem_team& team) {
    const unsigned tid = threadIdx.x, nth = blockDim.x, G = gridDim.x;
    const int N = team.size, me = team.my_index;
    const unsigned nb = blockIdx.x == 0 ? 1 + RSHMEMI_LL_MAX_BLOCKS - G : 1;
    for (int i = 0; i < N; i++) {
        if (i == me || S.kind[i] == 0 || S.kind[i] == 1) continue;
        const int pe = rshmemi_member(team, i);
        for (unsigned w = tid; w < nb; w += nth)
            *rshmemi_ll_seq(S.done, w == 0 ? blockIdx.x : G - 1 + w, pe) = S.peer[i].seq;
    }
}

// The end of a block's part of an LL call. Sequences: each block reads and moves on its own
// copies at its begin (block 0 also those of the blocks this call does not have), so no block
// waits for another and a matched call has nothing left to store. (One sequence per pair,
// moved by block 0 once every block had read it, would make a call's blocks wait for one
// another at its end; here the end reads only shared memory, its kernel arguments being
// copied there at the begin.)
// A mismatch (only block 0, the last to get here, handles it): its record, the slot clearing
// and the padding. End arrivals: every block of a grid of several adds 1 to done[0] (after a
// fence when its verdict is against the call: its slot reads come before the clearing). Block
// 0 takes gridDim.x off at once when its verdict is for the call (the counter is 0 again once
// every arrival is in, before the stream's next kernel starts), or, against the call, waits
// for every block's arrival first. Blocks' verdicts differ only after a timeout.
__device__ void rshmemi_ll_end(rshmemi_ll_shared& S, const rshmem_team& team, const rshmemi_check& ck, rshmem_u64* exp,
                               rshmem_u64 row) {
    const unsigned tid = threadIdx.x, nth = blockDim.x, G = gridDim.x;
    const int me = team.my_index, N = team.size;
#if RSHMEMI_LL_STAMPS
    if (blockIdx.x == 0 && tid == 0) S.stamp_e[0] = clock64();
#endif
    if (S.verdict == 0) {
        // No wait for other PEs is left in this block: the next kernel, if launched as a
        // dependent, may become resident (already let in at the begin with the early flag;
        // without it, once every thread of the block is here). A mismatch below still waits
        // for the team's barriers, so not there.
        if (!S.early) {
            __syncthreads();
            rshmemi_grid_dep_launch();
        }
        if (G > 1 && tid == 0)
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(S.done), "r"(blockIdx.x == 0 ? 1u - G : 1u)
                         : "memory");
#if RSHMEMI_LL_STAMPS
        if (blockIdx.x == 0 && tid == 0) S.stamp_e[1] = clock64();
#endif
        return;
    }
    __syncthreads();
    if (G > 1) {
        if (tid == 0) {
            __threadfence();
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(S.done) : "memory");
        }
        if (blockIdx.x != 0) {
            rshmemi_ll_unmove_seqs(S, team);
            return;
        }
        if (tid == 0) {
            // Only this grid's blocks are waited for (not a peer, not the error word): a
            // block that never came is a timeout naming no PE.
            unsigned n = 0;
            rshmem_u64 t0 = 0;
            for (unsigned spins = 1; n != G; spins++) {
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(S.done) : "memory");
                if (n == G || (spins & 255) != 0) continue;
                if (t0 == 0) t0 = rshmemi_now();
                else if (rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                    rshmemi_flag_timeout(-1);
                    break;
                }
            }
            __threadfence();
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(S.done), "r"(0u - n) : "memory");
        }
        __syncthreads();
    }
    if (tid == 0) { S.syncs = 0; S.bad = 0x7fffffff; }
    __syncthreads();
    // What this block's verdict saw (a slot written later belongs to that member's next call).
    for (int i = tid; i < N; i += nth) {
        if (S.kind[i] > 0) atomicMin(&S.bad, i);
        if (S.kind[i] == 2) atomicMax(&S.syncs, RSHMEMI_SIG_SYNCS(S.w0[i]));
    }
    __syncthreads();
    if (tid == 0 && S.bad != 0x7fffffff && !rshmemi_failed()) {
        unsigned long long old = atomicOr((unsigned long long*)ck.err, RSHMEMI_ERR_MISMATCH);
        if (!(old & RSHMEMI_ERR_MISMATCH)) {
            const int pe = rshmemi_member(team, S.bad);
            const volatile rshmem_u64* slot = ck.slots + (rshmem_u64)pe * RSHMEMI_SIG_WORDS;
            ck.err[RSHMEMI_ERR_MM_PE] = pe;
            for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) {
                rshmem_u64 v = 0;
                if (S.kind[S.bad] == 2) v = slot[w];
                else rshmemi_ll_load(S.peer[S.bad].from + 2 * w, S.peer[S.bad].flag, &v);
                ck.err[RSHMEMI_ERR_MM_MINE + w] = ck.sig.w[w];
                ck.err[RSHMEMI_ERR_MM_THEIRS + w] = v;
            }
        }
    }
    // Slots written by barrier-based members are consumed (their calls wait for the arrivals
    // below, so none of them writes a slot of its next call before this clearing).
    for (int i = tid; i < N; i += nth)
        if (S.kind[i] == 2) {
            volatile rshmem_u64* slot = ck.slots + (rshmem_u64)rshmemi_member(team, i) * RSHMEMI_SIG_WORDS;
            for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) slot[w] = 0;
        }
    __syncthreads();
    // Members that ran an LL call (kind 0 or 1) move on to the next pair sequence (already
    // done; the others' go back, rshmemi_ll_unmove_seqs); a barrier-based member (kind 2) gets
    // the arrivals of the barriers its call waits for (the most any barrier-based member of
    // this call runs: they pad to it among themselves), and the expectation for it moves by as
    // many (so the next flags differ from this call's). The release arrivals publish the
    // clearing above.
    rshmemi_ll_unmove_seqs(S, team);
    for (int i = tid; i < N; i += nth) {
        if (i == me || S.kind[i] != 2) continue;
        const int pe = rshmemi_member(team, i);
        exp[pe] = exp[pe] + S.syncs;
        rshmemi_red_add_release(rshmemi_sync(pe) + rshmem_dstate.sync_bar + row + rshmem_dstate.my_pe, S.syncs);
    }
}

