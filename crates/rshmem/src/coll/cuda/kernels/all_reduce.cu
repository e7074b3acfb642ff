// The bytes these kernels move, as data the simulator reads: coll/cuda/traffic.rs.
// Data line l (0-based) is pushed, folded and written by the same thread (lines l0 + u·gn in
// batches of U): in place (src == dst) no thread overwrites a line another thread has yet to
// push.
// stride > 0 (reduce_scatter): member j's part of the input is src + j·stride (n elements),
// pushed to j; this PE's part folds with what the others pushed it.
template <typename T, typename A, int OP, int U>
__device__ __forceinline__ void rshmemi_ll_all_reduce(T* dst, const T* src, rshmem_u64 n, rshmem_team team,
                                                      const rshmemi_check& ck, const rshmemi_ll& ll,
                                                      rshmemi_ll_shared& S, rshmem_u64 stride) {
    const int me = team.my_index, N = team.size;
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)rshmem_dstate.n_pes;
    rshmem_u64* exp = rshmemi_my_sync() + rshmem_dstate.sync_exp + row;
    // What the begin needs that no kernel writes, before the wait for the kernels before this
    // one (the kernel calls this function without having waited).
    rshmemi_ll_prep P = rshmemi_ll_prepare(team, ll, exp);
    if (RSHMEMI_LL_PREP) rshmemi_ll_pin(P);
    rshmemi_grid_dep_wait();
    const rshmem_u64 dl = (n * sizeof(T) + 7) / 8;  // data lines
    // Data threads (all but a control warp, RSHMEMI_LL_CTRL_WARP): thread t of block b has line
    // b·dth + t first (a control warp's threads none: past every line).
    const bool ctrl = (ll.flags & RSHMEMI_LL_CTRL_WARP) != 0;
    const unsigned dth = blockDim.x - (ctrl ? 32u : 0u);
    const rshmem_u64 gt = threadIdx.x < dth ? blockIdx.x * (rshmem_u64)dth + threadIdx.x : (rshmem_u64)1 << 62,
                     gn = (rshmem_u64)gridDim.x * dth;
    const T* mine = src + (rshmem_u64)me * stride;
    long long st[10], x[4];
    rshmem_u64 g0 = 0;
    __shared__ long long vt;
    if (RSHMEMI_LL_STAMPS && blockIdx.x == 0 && threadIdx.x == 0) g0 = rshmemi_now();
    RSHMEMI_LL_STAMP(st, 0);
    if (stride == 0) {
        // This thread's first batch, loaded beside rshmemi_ll_begin's loads (none waits for another).
        rshmem_u64 v0[U];
#pragma unroll
        for (int u = 0; u < U; u++) v0[u] = gt + u * gn < dl ? rshmemi_ll_pack(src, n, gt + u * gn) : 0;
        rshmemi_ll_begin(S, team, ll, P);
        RSHMEMI_LL_STAMP(st, 1);
        if (RSHMEMI_LL_STOP == 1) return;
        rshmemi_ll_push_header(S, team, ck);
        RSHMEMI_LL_STAMP(st, 2);
        if (RSHMEMI_LL_STAMPS == 2) {
            rshmemi_ll_push_header(S, team, ck);
            RSHMEMI_LL_STAMP(x, 1);
        }
        for (int again = 0; again < (RSHMEMI_LL_STAMPS == 2 ? 2 : 1); again++) {
            for (rshmem_u64 l0 = gt; l0 < dl; l0 += U * gn) {
                rshmem_u64 v[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    v[u] = l0 == gt ? v0[u] : (l0 + u * gn < dl ? rshmemi_ll_pack(src, n, l0 + u * gn) : 0);
                for (int k = 1; k < N; k++)
#pragma unroll
                    for (int u = 0; u < U; u++)
                        if (l0 + u * gn < dl) rshmemi_ll_push(S, (me + k) % N, RSHMEMI_SIG_WORDS + l0 + u * gn, v[u]);
            }
            if (again == 0) RSHMEMI_LL_STAMP(st, 3);
            else RSHMEMI_LL_STAMP(x, 2);
        }
        if (RSHMEMI_LL_STOP == 2) return;
    } else {
        rshmemi_ll_begin(S, team, ll, P);
        rshmemi_ll_push_header(S, team, ck);
        for (rshmem_u64 l0 = gt; l0 < dl; l0 += U * gn)
            for (int k = 1; k < N; k++) {
                const int j = (me + k) % N;
                rshmem_u64 v[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    v[u] = l0 + u * gn < dl ? rshmemi_ll_pack(src + (rshmem_u64)j * stride, n, l0 + u * gn) : 0;
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (l0 + u * gn < dl) rshmemi_ll_push(S, j, RSHMEMI_SIG_WORDS + l0 + u * gn, v[u]);
            }
    }
    rshmemi_ll_verdicts(S, team, ck);
    if (RSHMEMI_LL_STAMPS && blockIdx.x == 0 && threadIdx.x == blockDim.x - 32) vt = clock64();
    // A call of one block folds its first batch beside the verdicts (kept in registers until
    // they are in): its one data line and the header arrive together (waiting after the
    // verdicts would make it slower); so does a call with a control warp (the host runs one on
    // several blocks up to 16 KiB, where it makes calls faster: otherwise the warp that takes
    // the verdict has one more load round trip for its own line after it). A call of more
    // blocks without one folds after them: every thread polling while the lines still stream
    // in slows it (RSHMEMI_LL_AR_EARLY).
    A acc[U][8 / sizeof(T)];
    const volatile int* abort = (const volatile int*)&S.abort;
    const bool early = RSHMEMI_LL_AR_EARLY == 2 ? gridDim.x == 1 || ctrl : RSHMEMI_LL_AR_EARLY != 0;
    const bool first = !early || (gt < dl && S.verdict == 0 &&
                                  rshmemi_ll_fold<T, A, OP, U>(acc, mine, n, gt, gn, dl, me, team, S.peer, abort));
    RSHMEMI_LL_STAMP(st, 4);
    rshmemi_ll_resolve(S, N);
    RSHMEMI_LL_STAMP(st, 5);
    if (S.verdict == 0 && first && gt < dl &&
        (early || rshmemi_ll_fold<T, A, OP, U>(acc, mine, n, gt, gn, dl, me, team, S.peer, abort))) {
        rshmemi_ll_write<T, A, OP, U>(dst, acc, n, gt, gn, dl);
        RSHMEMI_LL_STAMP(st, 6);
        for (rshmem_u64 l0 = gt + U * gn; l0 < dl; l0 += U * gn) {
            if (!rshmemi_ll_fold<T, A, OP, U>(acc, mine, n, l0, gn, dl, me, team, S.peer, abort))
                break;  // a line never came: write nothing more
            rshmemi_ll_write<T, A, OP, U>(dst, acc, n, l0, gn, dl);
        }
    }
    RSHMEMI_LL_STAMP(st, 7);
    rshmemi_ll_end(S, team, ck, exp, row);
#if RSHMEMI_LL_STAMPS
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        st[8] = clock64();
        if (RSHMEMI_LL_STAMPS == 2) {
            x[1] -= st[2];
            x[2] -= st[3];
        }
        rshmemi_ll_stamps_print("ar", n, st, 8, g0, vt, S.stamp_b, RSHMEMI_LL_STAMPS == 2 ? x : nullptr);
        // A call of several blocks: its end's steps (the arrival and the sequences, the rest),
        // printed with the line above.
        if (gridDim.x > 1 && rshmemi_stamp_calls % 32 == 0)
            printf("ll_stamps ar end pe %d n %llu: sequences %lld rest %lld\n", rshmem_dstate.my_pe, (unsigned long long)n,
                   S.stamp_e[1] - S.stamp_e[0], st[8] - S.stamp_e[1]);
    }
#endif
}

// RSHMEMI_PULL_FENCES 0 (a compile option for measurements only: wrong memory ordering): the
// pull kernels without their acquire and release fences.
#ifndef RSHMEMI_PULL_FENCES
#define RSHMEMI_PULL_FENCES 1
#endif
// RSHMEMI_PULL_DONE_FENCE_SYS 1 (measurements): the done line's release fence at system scope
// (see rshmemi_pull_done).
#ifndef RSHMEMI_PULL_DONE_FENCE_SYS
#define RSHMEMI_PULL_DONE_FENCE_SYS 0
#endif

// The end of a pull kernel's block b (every thread calls, after its reads of the members'
// src): a release fence, this block's done line RSHMEMI_SIG_WORDS + b to every other member,
// and the wait for theirs, with an acquire: when every block has passed it, no member still
// reads this PE's src. The fence is at GPU scope: after the block's barrier every load of the
// block has returned its value (each was stored before it), so no later write of a member can
// change what was read; the fence only keeps the done store after them, which any scope does,
// and the system scope would wait for this block's local stores to be performed system-wide
// too, which makes the calls slower.
// sys (the pushing all_to_all): the block stored into members' memory, so the fence is at
// system scope (the stores are performed at their GPUs before the done line says so).
__device__ __forceinline__ void rshmemi_pull_done(const rshmemi_ll_shared& S, const rshmem_team& team, unsigned b,
                                                  bool sys = false) {
    const unsigned tid = threadIdx.x;
    __syncthreads();
    if (tid < (unsigned)team.size && (int)tid != team.my_index) {
        if (sys) asm volatile("fence.acq_rel.sys;" ::: "memory");
        else if (RSHMEMI_PULL_FENCES) {
            if (RSHMEMI_PULL_DONE_FENCE_SYS) asm volatile("fence.acq_rel.sys;" ::: "memory");
            else asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
        rshmemi_ll_push(S, tid, RSHMEMI_SIG_WORDS + b, 0);
        rshmem_u64 v;
        const rshmem_u64* line = S.peer[tid].from + 2 * (RSHMEMI_SIG_WORDS + b);
        if (rshmemi_ll_wait_line(line, S.peer[tid].flag, &v, (const volatile int*)&S.abort,
                                 rshmemi_member(team, tid)))
            (void)rshmemi_ld_acquire32((const unsigned*)line + 1);
    }
}

// The pull kernels' handshake (after their own setup; every thread calls): a release fence by
// the threads that push the header (this PE's writes before the call are visible before its
// header), the LL begin, the header to every other member, every member's verdict (with an
// acquire when `acquire`: the reads of members' src that follow see what they wrote before
// their headers), resolved.
__device__ __forceinline__ void rshmemi_pull_handshake(rshmemi_ll_shared& S, const rshmem_team& team, const rshmemi_check& ck,
                                                       const rshmemi_ll& ll, rshmem_u64* exp, bool acquire) {
    // What the begin needs that no kernel writes, before the wait for the kernels before this
    // one (the pull kernels call this function without having waited).
    rshmemi_ll_prep P = rshmemi_ll_prepare(team, ll, exp);
    if (RSHMEMI_LL_PREP) rshmemi_ll_pin(P);
    rshmemi_grid_dep_wait();
    if (rshmemi_ll_header_word() < RSHMEMI_SIG_WORDS) asm volatile("fence.acq_rel.sys;" ::: "memory");
    rshmemi_ll_begin(S, team, ll, P);
    rshmemi_ll_push_header(S, team, ck);
    rshmemi_ll_verdicts(S, team, ck, acquire);
    rshmemi_ll_resolve(S, team.size);
}

// `len` 16-byte vectors from s to d by the block, eight loads in flight per thread.
__device__ __forceinline__ void rshmemi_copy_v4(rshmemi_v4* d, const rshmemi_v4* s, rshmem_u64 len, unsigned tid,
                                                unsigned nth) {
    for (rshmem_u64 q = tid; q < len; q += 8 * (rshmem_u64)nth) {
        rshmemi_v4 x[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (q + u * nth < len) x[u] = s[q + u * nth];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (q + u * nth < len) d[q + u * nth] = x[u];
    }
}

// Line l of member `from`'s lines in this PE's area (p), waited for until it carries `flag` and
// a payload of at least `want` (a count its sender raises during one call); then acquired.
// False as rshmemi_ll_wait_line.
__device__ __forceinline__ bool rshmemi_ll_wait_count(const rshmem_u64* p, unsigned flag, rshmem_u64 want,
                                                      const volatile int* abort, int pe) {
    rshmem_u64 t0 = 0, v = 0;
    for (unsigned spins = 1; !(rshmemi_ll_load(p, flag, &v) && v >= want); spins++) {
        if (*abort) return false;
        if (rshmemi_ll_gave_up(spins, &t0, pe)) return false;
    }
    (void)rshmemi_ld_acquire32((const unsigned*)p + 1);
    return true;
}

// A pair's all_reduce by pushes (rshmemi_pull_all_reduce on two-member teams, `push` set by the
// host from GpuColl::push_all_reduce_bytes and carried in the call's signature): each member
// stores its src into the other's dst over the peer mapping, and folds what the other stored
// into its own dst with its src, in team order. Both GPUs storing to each other at once move
// more than both loading from each other.
// Block b takes vectors [b·c, (b+1)·c) (c = ceil(nv / blocks)) in steps (a sixteenth of its
// part, 64 to 256 KiB); after storing step k it publishes k + 1 as line RSHMEMI_SIG_WORDS + b
// to the other member (after the block's barrier and a system-scope release fence: the stores
// went to the other GPU's memory), then folds step k - 1 once the other's count says it
// arrived (acquire). A member stores into the other's dst only after the handshake (the other
// is in this call: its dst is free), and its kernel ends only after every step of the other's
// has arrived and been folded, so no store of this call is pending when either kernel ends.
// No member reads the other's memory, so no done lines. A wait that gives up stops this
// member's stores and folds (the other then times out too). The system-scope fence per step
// (more than a microsecond) makes it lose to the pull below about 256 MiB (BENCHMARKS.md).
#ifndef RSHMEMI_PUSH_MIN_VECS
#define RSHMEMI_PUSH_MIN_VECS 4096
#endif
#ifndef RSHMEMI_PUSH_MAX_VECS
#define RSHMEMI_PUSH_MAX_VECS 16384
#endif
// A pair's fold: d[q] = the fold in team order of this PE's mine[q] and the other member's
// other[q] (me: this PE's index, 0 or 1), for q < len, this thread's q = t, t + nt, ...; U
// vectors of `other` and then of `mine` in flight before any is folded (the pull all_reduce's
// loads over the link wait behind no local load). Registers are indexed by compile-time values
// only (a member index would put them in local memory). `d` may be `other` (the pushing pair:
// the other member's data already in this PE's dst).
template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_pair_fold(rshmemi_v4* d, const rshmemi_v4* other, const rshmemi_v4* mine,
                                                  rshmem_u64 len, int me, rshmem_u64 t, rshmem_u64 nt) {
    const int V = 16 / (int)sizeof(T);
    const int U = 32 / V > 8 ? 8 : 32 / V;
    for (rshmem_u64 q = t; q < len; q += U * nt) {
        rshmemi_v4 xo[U], xm[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (q + u * nt < len) xo[u] = other[q + u * nt];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (q + u * nt < len) xm[u] = mine[q + u * nt];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (q + u * nt >= len) continue;
            const T* eo = (const T*)&xo[u];
            const T* em = (const T*)&xm[u];
            rshmemi_v4 y;
            T* o = (T*)&y;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const A a = rshmemi_cvt<T, A>::in(em[k]), b = rshmemi_cvt<T, A>::in(eo[k]);
                o[k] = rshmemi_cvt<T, A>::out(me == 0 ? rshmemi_apply<A, OP>(a, b) : rshmemi_apply<A, OP>(b, a));
            }
            d[q + u * nt] = y;
        }
    }
}

template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_pair_push_all_reduce(rshmemi_v4* dst, const rshmemi_v4* src, rshmem_u64 nv,
                                                             const rshmem_team& team, rshmemi_ll_shared& S) {
    __shared__ int lost;
    const int me = team.my_index, other = 1 - me;
    const unsigned tid = threadIdx.x, nth = blockDim.x, b = blockIdx.x, G = gridDim.x;
    rshmemi_v4* theirs = (rshmemi_v4*)rshmemi_ptr((void*)dst, rshmemi_member(team, other));
    const rshmem_u64 c = (nv + G - 1) / G, lo = (rshmem_u64)b * c;
    const rshmem_u64 len = lo < nv ? (nv - lo < c ? nv - lo : c) : 0;
    rshmem_u64 st = len / 16;
    st = st < RSHMEMI_PUSH_MIN_VECS ? RSHMEMI_PUSH_MIN_VECS : st > RSHMEMI_PUSH_MAX_VECS ? RSHMEMI_PUSH_MAX_VECS : st;
    const rshmem_u64 steps = (len + st - 1) / st;
    const rshmem_u64* count = S.peer[other].from + 2 * (RSHMEMI_SIG_WORDS + b);
    if (tid == 0) lost = 0;
    for (rshmem_u64 k = 0; k <= steps; k++) {
        if (k < steps) {
            const rshmem_u64 a = k * st;
            rshmemi_copy_v4(theirs + lo + a, src + lo + a, len - a < st ? len - a : st, tid, nth);
            __syncthreads();
            if (tid == 0) {
                asm volatile("fence.acq_rel.sys;" ::: "memory");
                rshmemi_ll_push(S, other, RSHMEMI_SIG_WORDS + b, k + 1);
            }
        }
        if (k >= 1) {
            // Step k - 1 of the other member's part b is in this PE's dst.
            if (tid == 0 && !rshmemi_ll_wait_count(count, S.peer[other].flag, k, (const volatile int*)&S.abort,
                                                   rshmemi_member(team, other)))
                lost = 1;
            __syncthreads();
            if (lost) return;
            const rshmem_u64 a = (k - 1) * st;
            rshmemi_pair_fold<T, A, OP>(dst + lo + a, dst + lo + a, src + lo + a, len - a < st ? len - a : st, me, tid, nth);
        }
    }
}

// Pull all_reduce modes (the kernel's last argument, set by the host and carried in the call's
// signature): a pair moving its data by stores; two-shot (every member folds its own part of
// the vectors, read from every member's src, and stores the result into every member's dst);
// reduce_scatter (every member folds its part of the members' inputs into its own dst).
#define RSHMEMI_PULL_AR_PUSH 1ull
#define RSHMEMI_PULL_AR_TWO_SHOT 2ull
#define RSHMEMI_PULL_AR_SCATTER 4ull

// Vectors [lo, hi) of every member's input (from[0..N), team order) folded, thread t taking
// lo + t, lo + t + nt, ..., U vectors in flight per member; each result stored at index v - shift
// of every destination to[0..nto) (nto 1: this PE's dst alone; the two-shot: every member's,
// the peers' first so that their stores leave before the local one).
template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_pull_fold(rshmemi_v4* const* to, int nto, const rshmemi_v4* const* from, int N,
                                                  rshmem_u64 lo, rshmem_u64 hi, rshmem_u64 shift, rshmem_u64 t,
                                                  rshmem_u64 nt) {
    const int V = 16 / (int)sizeof(T);
    const int U = 32 / V > 8 ? 8 : 32 / V;
    for (rshmem_u64 v0 = lo + t; v0 < hi; v0 += U * nt) {
        A acc[U][V];
        for (int i = 0; i < N; i++) {
            rshmemi_v4 x[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (v0 + u * nt < hi) x[u] = from[i][v0 + u * nt];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const T* e = (const T*)&x[u];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const A y = rshmemi_cvt<T, A>::in(e[k]);
                    acc[u][k] = i == 0 ? y : rshmemi_apply<A, OP>(acc[u][k], y);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (v0 + u * nt >= hi) continue;
            rshmemi_v4 y;
            T* o = (T*)&y;
#pragma unroll
            for (int k = 0; k < V; k++) o[k] = rshmemi_cvt<T, A>::out(acc[u][k]);
            for (int j = 0; j < nto; j++) to[j][v0 + u * nt - shift] = y;
        }
    }
}

// Pull all_reduce (rshmem::cuda::GpuColl::pull_all_reduce_bytes; past the LL size, out of
// place, whole 16-byte vectors at 16-byte aligned addresses): one kernel, the pull
// all_to_all's handshake (release fence, header, acquire on each header seen; a done line per
// block after a release fence, the wait for every member's), and between them a one-shot fold:
// every thread reads its vectors from every member's src (team order), U vectors in flight per
// member, and writes the result into dst. A pair with RSHMEMI_PULL_AR_PUSH
// (GpuColl::push_all_reduce_bytes) moves its data by stores instead, after the same handshake
// (rshmemi_pair_push_all_reduce).
// RSHMEMI_PULL_AR_TWO_SHOT (GpuColl::two_shot_pull_bytes): member i folds only the i-th of N
// equal parts of the vectors (the last one shorter), read from every member's src, and stores
// the result into every member's dst; its done lines follow a system-scope fence (its stores
// went to the members' memory), so when a block has every member's done line for its index,
// every member's block of that index has read this PE's src and written its part into this
// PE's dst. Each member reads and stores (N - 1) / N of the message over its links, where the
// one-shot reads N - 1 times the message. The results are the one-shot's, bit for bit (the
// same fold in team order), and the same on every member (one member computes each vector).
// RSHMEMI_PULL_AR_SCATTER (the pull reduce_scatter; n is the count per member, src holds N
// parts of n): member i folds part i of every member's src into its own dst; plain done lines.
// RSHMEMI_PULL_PAIR_LOADS 0 (a compile option for measurements, through
// RSHMEM_CUDA_COLL_NVRTC_OPTS): a pair's pull all_reduce loads its members' vectors one member
// after the other like larger teams'.
#ifndef RSHMEMI_PULL_PAIR_LOADS
#define RSHMEMI_PULL_PAIR_LOADS 1
#endif
template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_pull_all_reduce(T* dst, const T* src, rshmem_u64 n, const rshmem_team& team,
                                                        const rshmemi_check& ck, const rshmemi_ll& ll,
                                                        rshmemi_ll_shared& S, rshmem_u64 mode) {
    __shared__ const rshmemi_v4* from[RSHMEMI_LL_MAX_MEMBERS];
    __shared__ rshmemi_v4* to[RSHMEMI_LL_MAX_MEMBERS];
    const int V = 16 / (int)sizeof(T);
    const int me = team.my_index, N = team.size;
    const unsigned tid = threadIdx.x, nth = blockDim.x, b = blockIdx.x;
    const bool two = (mode & RSHMEMI_PULL_AR_TWO_SHOT) != 0, scatter = (mode & RSHMEMI_PULL_AR_SCATTER) != 0;
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)rshmem_dstate.n_pes;
    rshmem_u64* exp = rshmemi_my_sync() + rshmem_dstate.sync_exp + row;
    for (int i = tid; i < N; i += nth) {
        from[i] = (const rshmemi_v4*)(i == me ? (const void*)src : rshmemi_ptr((const void*)src, rshmemi_member(team, i)));
        // Destinations of the two-shot: the members after this PE in team order, then this PE.
        const int j = (me + 1 + i) % N;
        to[i] = (rshmemi_v4*)(j == me ? (void*)dst : rshmemi_ptr((void*)dst, rshmemi_member(team, j)));
    }
    rshmemi_pull_handshake(S, team, ck, ll, exp, true);
    if ((mode & RSHMEMI_PULL_AR_PUSH) && N == 2) {
        if (S.verdict == 0) rshmemi_pair_push_all_reduce<T, A, OP>((rshmemi_v4*)dst, (const rshmemi_v4*)src, n / V, team, S);
    } else if (S.verdict == 0) {
        const rshmem_u64 nv = n / V;
        const rshmem_u64 gt = b * (rshmem_u64)nth + tid, gn = (rshmem_u64)gridDim.x * nth;
        if (two) {
            const rshmem_u64 part = (nv + N - 1) / N, lo = (rshmem_u64)me * part;
            const rshmem_u64 hi = lo + part < nv ? lo + part : nv;
            rshmemi_pull_fold<T, A, OP>(to, N, from, N, lo, hi, 0, gt, gn);
        } else if (scatter) {
            rshmemi_v4* mine = (rshmemi_v4*)dst;
            const rshmem_u64 lo = (rshmem_u64)me * nv;
            rshmemi_pull_fold<T, A, OP>(&mine, 1, from, N, lo, lo + nv, lo, gt, gn);
        } else if (RSHMEMI_PULL_PAIR_LOADS && N == 2) {
            rshmemi_pair_fold<T, A, OP>((rshmemi_v4*)dst, from[1 - me], from[me], nv, me, gt, gn);
        } else {
            rshmemi_v4* mine = (rshmemi_v4*)dst;
            rshmemi_pull_fold<T, A, OP>(&mine, 1, from, N, 0, nv, 0, gt, gn);
        }
        rshmemi_pull_done(S, team, b, two);
    }
    rshmemi_ll_end(S, team, ck, exp, row);
}

// One line per thread (small messages): the batch of one, whose fewer registers and checks
// make small calls faster; more: batches of RSHMEMI_LL_U.
#define RSHMEMI_COLL_LL_KERNEL(NAME, T, A, OPN, OP)                                                 \
    extern "C" __global__ void rshmemi_coll_ll_##NAME##_##OPN(T* dst, const T* src, rshmem_u64 n,     \
                                                               rshmem_team team, rshmemi_check ck,   \
                                                               rshmemi_ll ll, rshmem_u64 stride) {   \
        __shared__ rshmemi_ll_shared S;                                                              \
        if (RSHMEMI_LL_NOP) {                                                                        \
            rshmemi_grid_dep_wait();                                                                 \
            return;                                                                                  \
        }                                                                                            \
        /* rshmemi_ll_all_reduce waits (rshmemi_grid_dep_wait) once it has what it can before. */   \
        if ((n * sizeof(T) + 7) / 8 <= (rshmem_u64)gridDim.x * blockDim.x)                           \
            rshmemi_ll_all_reduce<T, A, OP, 1>(dst, src, n, team, ck, ll, S, stride);                \
        else                                                                                         \
            rshmemi_ll_all_reduce<T, A, OP, RSHMEMI_LL_U>(dst, src, n, team, ck, ll, S, stride);     \
    }                                                                                                \
    /* The pull all_reduce, a kernel of its own: in the LL kernel its code and registers slowed \
       the 8-byte call (2x H200, graph: 3.71 -> 4.00 us). */                                     \
    extern "C" __global__ void rshmemi_coll_pull_ar_##NAME##_##OPN(T* dst, const T* src, rshmem_u64 n, \
                                                                    rshmem_team team, rshmemi_check ck, \
                                                                    rshmemi_ll ll, rshmem_u64 mode) { \
        __shared__ rshmemi_ll_shared S;                                                              \
        /* rshmemi_pull_handshake waits (rshmemi_grid_dep_wait). */                                \
        rshmemi_pull_all_reduce<T, A, OP>(dst, src, n, team, ck, ll, S, mode);                       \
    }
#define RSHMEMI_COLL_INT_LL(NAME, T, A) RSHMEMI_COLL_INT_OPS(RSHMEMI_COLL_LL_KERNEL, NAME, T, A)
#define RSHMEMI_COLL_FLOAT_LL(NAME, T, A) RSHMEMI_COLL_FLOAT_OPS(RSHMEMI_COLL_LL_KERNEL, NAME, T, A)
RSHMEMI_COLL_INT_TYPES(RSHMEMI_COLL_INT_LL)
RSHMEMI_COLL_FLOAT_TYPES(RSHMEMI_COLL_FLOAT_LL)

