// The bytes these kernels move, as data the simulator reads: coll/cuda/traffic.rs.
// Untyped kernels only (see common.cuh).
#ifndef RSHMEMI_COLL_TYPED_ONLY
// Bytes l·8 .. l·8+8 of a share of nb bytes at d (those below nb), from a line's payload.
__device__ __forceinline__ void rshmemi_ll_unpack(char* d, rshmem_u64 nb, rshmem_u64 l, rshmem_u64 v) {
    char* p = d + l * 8;
    if ((l + 1) * 8 <= nb) {
        if (((rshmem_u64)p & 7) == 0) {
            *(rshmem_u64*)p = v;
            return;
        }
        if (((rshmem_u64)p & 3) == 0) {
            ((unsigned*)p)[0] = (unsigned)v;
            ((unsigned*)p)[1] = (unsigned)(v >> 32);
            return;
        }
    }
#pragma unroll
    for (int q = 0; q < 8; q++)
        if (l * 8 + q < nb) p[q] = (char)(v >> (8 * q));
}

// LL data movement (rshmem::cuda::GpuColl: all_to_all, all_gather, broadcast up to the LL
// sizes): member me sends nb bytes from src + so(j) to each member j, and writes what member
// i sent into dst + ro(i), as 8-byte lines (zero past nb) through the same areas, flags,
// verdicts and end as the LL all_reduce. kind RSHMEMI_LL_A2A: so(j) = j·nb, ro(i) = i·nb;
// RSHMEMI_LL_GATHER: so(j) = 0, ro(i) = i·nb; RSHMEMI_LL_BCAST: only the root sends (so 0) and
// every member takes only the root's (ro 0). Every member pushes its header to every other
// (a broadcast's non-roots too: the header is what tells a member its peer entered the call).
// Line l of every share is pushed, waited for and written by one thread: in place (the same
// bytes read and written, e.g. an all_gather's own share, an all_to_all's shares) is safe, as
// that thread reads line l of every share before it writes any.
#define RSHMEMI_LL_A2A 0
#define RSHMEMI_LL_GATHER 1
#define RSHMEMI_LL_BCAST 2
// The line l of a share at s (nb bytes): WORDS (nb a multiple of 8, 8-byte aligned shares):
// one load, no checks.
template <bool WORDS>
__device__ __forceinline__ rshmem_u64 rshmemi_ll_move_ld(const char* s, rshmem_u64 nb, rshmem_u64 l) {
    if (WORDS) return ((const rshmem_u64*)s)[l];
    return rshmemi_ll_pack(s, nb, l);
}
template <bool WORDS>
__device__ __forceinline__ void rshmemi_ll_move_st(char* d, rshmem_u64 nb, rshmem_u64 l, rshmem_u64 v) {
    if (WORDS) ((rshmem_u64*)d)[l] = v;
    else rshmemi_ll_unpack(d, nb, l, v);
}

// Shares of this many bytes or more: the LL data kernels copy this PE's own share first, then
// take the members' lines from the next member on, so the copy runs while those lines are still
// on their way; smaller shares go in team order (this PE's own in its place among them): own
// first makes calls of large shares faster and calls of small ones slower. (A compile option
// for measurements: 0 always own first, a large value never.)
#ifndef RSHMEMI_LL_OWN_FIRST_BYTES
#define RSHMEMI_LL_OWN_FIRST_BYTES (128u << 10)
#endif
#ifndef RSHMEMI_LL_MOVE_BATCHES
#define RSHMEMI_LL_MOVE_BATCHES 1
#endif
// RSHMEMI_LL_MOVE_PRELOAD 0 (a compile option for measurements): the LL data kernels of word
// shares load their first lines to send only after rshmemi_ll_begin (see rshmemi_ll_move).
#ifndef RSHMEMI_LL_MOVE_PRELOAD
#define RSHMEMI_LL_MOVE_PRELOAD 1
#endif

// One kind, word or byte shares, as compile-time constants (no branch on them per line).
// Word shares: the first batch of lines to the first member it sends to is loaded beside
// rshmemi_ll_begin's loads (faster for large calls; byte shares, e.g. an 8-byte all_to_all,
// are slower with it). The lines taken from members are waited for only after the verdicts:
// waiting for the first batch beside them (as the LL all_reduce does in a call of one block)
// is slower (every thread polling while the lines still stream in).
template <int KIND, bool WORDS, int U>
__device__ __forceinline__ void rshmemi_ll_move(char* dst, const char* src, rshmem_u64 nb, const rshmem_team& team,
                                                const rshmemi_check& ck, const rshmemi_ll& ll, int root,
                                                rshmemi_ll_shared& S) {
    const bool a2a = KIND == RSHMEMI_LL_A2A, bcast = KIND == RSHMEMI_LL_BCAST;
    const int me = team.my_index, N = team.size;
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)rshmem_dstate.n_pes;
    rshmem_u64* exp = rshmemi_my_sync() + rshmem_dstate.sync_exp + row;
    // As the LL all_reduce: what the begin needs that no kernel writes, before the wait.
    rshmemi_ll_prep P = rshmemi_ll_prepare(team, ll, exp);
    if (RSHMEMI_LL_PREP) rshmemi_ll_pin(P);
    rshmemi_grid_dep_wait();
    const rshmem_u64 gt = blockIdx.x * (rshmem_u64)blockDim.x + threadIdx.x, gn = (rshmem_u64)gridDim.x * blockDim.x;
    const rshmem_u64 dl = (nb + 7) / 8;
    const bool sends = !bcast || me == root;
    const bool pre = RSHMEMI_LL_MOVE_PRELOAD && WORDS;
    const int j1 = (me + 1) % N;
    rshmem_u64 v1[U];
    if (pre && sends && N > 1) {
        const char* s = src + (a2a ? (rshmem_u64)j1 * nb : 0);
#pragma unroll
        for (int u = 0; u < U; u++) v1[u] = gt + u * gn < dl ? rshmemi_ll_move_ld<WORDS>(s, nb, gt + u * gn) : 0;
    }
    long long st[8];
    rshmem_u64 g0 = 0;
    __shared__ long long vt;
    if (RSHMEMI_LL_STAMPS && blockIdx.x == 0 && threadIdx.x == 0) g0 = rshmemi_now();
    RSHMEMI_LL_STAMP(st, 0);
    rshmemi_ll_begin(S, team, ll, P);
    RSHMEMI_LL_STAMP(st, 1);
    rshmemi_ll_push_header(S, team, ck);
    if (sends)
        for (rshmem_u64 l0 = gt; l0 < dl; l0 += U * gn) {
            rshmem_u64 v[U];
            for (int k = 1; k < N; k++) {
                const int j = (me + k) % N;
                // The same lines for every member unless all_to_all: loaded once.
                if (pre && k == 1 && l0 == gt) {
#pragma unroll
                    for (int u = 0; u < U; u++) v[u] = v1[u];
                } else if (a2a || k == 1) {
                    const char* s = src + (a2a ? (rshmem_u64)j * nb : 0);
#pragma unroll
                    for (int u = 0; u < U; u++) v[u] = l0 + u * gn < dl ? rshmemi_ll_move_ld<WORDS>(s, nb, l0 + u * gn) : 0;
                }
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (l0 + u * gn < dl) rshmemi_ll_push(S, j, RSHMEMI_SIG_WORDS + l0 + u * gn, v[u]);
            }
        }
    RSHMEMI_LL_STAMP(st, 2);
    rshmemi_ll_verdicts(S, team, ck);
    if (RSHMEMI_LL_STAMPS && blockIdx.x == 0 && threadIdx.x == blockDim.x - 32) vt = clock64();
    RSHMEMI_LL_STAMP(st, 3);
    rshmemi_ll_resolve(S, N);
    RSHMEMI_LL_STAMP(st, 4);
    if (S.verdict == 0) {
        bool lost = false;
        const bool own_first = nb >= RSHMEMI_LL_OWN_FIRST_BYTES;
        for (rshmem_u64 l0 = gt; l0 < dl && !lost; l0 += U * gn) {
            // Every member's lines (this PE's own from src), batch by batch; shares of
            // RSHMEMI_LL_OWN_FIRST_BYTES or more this PE's own first (see there).
            for (int k = 0; k < N && !lost; k++) {
                const int i = own_first ? (me + k) % N : k;
                if (bcast && i != root) continue;
                rshmem_u64 v[U];
                if (i == me) {
                    const char* s = src + (a2a ? (rshmem_u64)me * nb : 0);
#pragma unroll
                    for (int u = 0; u < U; u++) v[u] = l0 + u * gn < dl ? rshmemi_ll_move_ld<WORDS>(s, nb, l0 + u * gn) : 0;
                } else if (!rshmemi_ll_wait_lines<U>(S.peer[i].from + 2 * RSHMEMI_SIG_WORDS, l0, gn, dl, S.peer[i].flag, v,
                                                     (const volatile int*)&S.abort, rshmemi_member(team, i))) {
                    lost = true;  // a line never came: write nothing more
                    break;
                }
                char* d = dst + (bcast ? 0 : (rshmem_u64)i * nb);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (l0 + u * gn < dl) rshmemi_ll_move_st<WORDS>(d, nb, l0 + u * gn, v[u]);
            }
        }
    }
    RSHMEMI_LL_STAMP(st, 5);
    rshmemi_ll_end(S, team, ck, exp, row);
#if RSHMEMI_LL_STAMPS
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        st[6] = clock64();
        rshmemi_ll_stamps_print(KIND == RSHMEMI_LL_A2A ? "a2a" : KIND == RSHMEMI_LL_GATHER ? "gather" : "bcast", nb, st, 6, g0, vt,
                                S.stamp_b);
    }
#endif
}

// A kernel per kind and share shape (rshmemi_coll_ll_move_<kind>_<words|bytes>): one
// instance of rshmemi_ll_move each, so none carries the others' code and registers (one kernel
// for all six is slower at 8 bytes). words: whole 8-byte words at 8-byte aligned
// addresses (nb a multiple of 8; the host checks).
// Each kernel runs the batch (lines per thread at once) its call needs: 1 where every thread
// has at most one line, 2 or 4 up to two or four, else RSHMEMI_LL_A2A_U. The code of a larger batch is
// executed even where its lines are absent (predicated), so a call in batches larger than its
// lines need is slower.
// RSHMEMI_LL_MOVE_BATCHES 0 (a compile option for measurements): batches of 1 only.
#define RSHMEMI_LL_MOVE_KERNEL(KN, K, SN, W)                                                              \
    extern "C" __global__ void rshmemi_coll_ll_move_##KN##_##SN(char* dst, const char* src, rshmem_u64 nb, \
                                                                rshmem_team team, rshmemi_check ck,       \
                                                                rshmemi_ll ll, rshmem_u64 root) {         \
        __shared__ rshmemi_ll_shared S;                                                                   \
        if (RSHMEMI_LL_NOP) {                                                                             \
            rshmemi_grid_dep_wait();                                                                      \
            return;                                                                                       \
        }                                                                                                 \
        /* rshmemi_ll_move waits (rshmemi_grid_dep_wait) once it has what it can before. */              \
        const rshmem_u64 per = ((nb + 7) / 8 + (rshmem_u64)gridDim.x * blockDim.x - 1) /                  \
                               ((rshmem_u64)gridDim.x * blockDim.x);                                      \
        if (!RSHMEMI_LL_MOVE_BATCHES || per <= 1)                                                         \
            rshmemi_ll_move<K, W, 1>(dst, src, nb, team, ck, ll, (int)root, S);                           \
        else if (per <= 2)                                                                                \
            rshmemi_ll_move<K, W, 2>(dst, src, nb, team, ck, ll, (int)root, S);                           \
        else if (per <= 4)                                                                                \
            rshmemi_ll_move<K, W, 4>(dst, src, nb, team, ck, ll, (int)root, S);                           \
        else                                                                                              \
            rshmemi_ll_move<K, W, RSHMEMI_LL_A2A_U>(dst, src, nb, team, ck, ll, (int)root, S);            \
    }
RSHMEMI_LL_MOVE_KERNEL(a2a, RSHMEMI_LL_A2A, words, true)
RSHMEMI_LL_MOVE_KERNEL(a2a, RSHMEMI_LL_A2A, bytes, false)
RSHMEMI_LL_MOVE_KERNEL(gather, RSHMEMI_LL_GATHER, words, true)
RSHMEMI_LL_MOVE_KERNEL(gather, RSHMEMI_LL_GATHER, bytes, false)
RSHMEMI_LL_MOVE_KERNEL(bcast, RSHMEMI_LL_BCAST, words, true)
RSHMEMI_LL_MOVE_KERNEL(bcast, RSHMEMI_LL_BCAST, bytes, false)
#undef RSHMEMI_LL_MOVE_KERNEL

// Pull all_to_all (rshmem::cuda::GpuColl::pull_a2a_bytes; out of place, shares of whole
// 16-byte vectors at 16-byte aligned addresses): member i's dst[j·w, (j+1)·w) read straight
// from member j's src[i·w, (i+1)·w) over the peer mapping, the data crossing the link once
// (LL lines carry it twice). Handshake through the LL areas, flags, verdicts and end:
//  * enter: block 0 pushes the header (the call's signature) to every member, after a fence
//    (at the kernel's start nothing is pending: no round trip) that releases what this PE's
//    stream wrote into src before the call; a block reads a member's share only after that
//    member's header arrived (its verdict, with an acquire), so src holds the call's input;
//  * leave: block b, having read its part of every member's share, pushes "done" as line
//    RSHMEMI_SIG_WORDS + b to each member (after a fence: its reads are complete, and only
//    local stores are pending) and waits for line RSHMEMI_SIG_WORDS + b of every member
//    (the members' block b read their parts of this PE's src): the kernel ends only when no
//    member still reads this PE's src, so later stream work may overwrite it.
// A member running another call: its header differs (a mismatch, nothing read, no done line
// waited for) or it is in a barrier-based call (padding, as in the LL calls). A member whose
// header never comes: timeout naming it.
// Block b of gridDim.x takes the part [b·c, (b+1)·c) of every share (c = ceil(w / blocks));
// its threads copy member by member, eight 16-byte loads in flight each.
// push (GpuColl::push_a2a_bytes, carried in the call's signature): the same handshake, then
// every member stores its shares into the members' dst instead (member i's src[j·w..] into
// member j's dst[i·w..]): both GPUs of a pair storing at once move more than both loading at
// once. A member stores into another's dst only after
// that member's header arrived (it is in this call: its dst is free); block b's done line then
// follows a system-scope fence (its stores are performed in the members' memory), and waiting
// for every member's block b (acquire) means this PE's part b of dst is complete. Nobody reads
// another's src, so src may be overwritten once the kernel ends, as with the pull.
// push bit 1 (gather, GpuColl::all_gather): every member's share is its whole src (w vectors),
// the same for every receiver: member i's src into member j's dst[i·w..], loaded or stored the
// same way. In place (by stores only: a load would need each member's block at its own
// offset) src is this member's block of dst, which no other member writes (its own copy is
// then skipped).
// Block b starts at member k = b mod N of that order (RSHMEMI_A2A_ROTATE 0, a compile option
// for measurements: every block at k = 0), so the blocks copying this PE's own share locally
// work beside the ones on the link instead of after them.
#ifndef RSHMEMI_A2A_ROTATE
#define RSHMEMI_A2A_ROTATE 1
#endif
extern "C" __global__ void rshmemi_coll_pull_a2a(rshmemi_v4* dst, const rshmemi_v4* src, rshmem_u64 w, rshmem_team team,
                                                 rshmemi_check ck, rshmemi_ll ll, rshmem_u64 push) {
    __shared__ rshmemi_ll_shared S;
    __shared__ const rshmemi_v4* from[RSHMEMI_LL_MAX_MEMBERS];
    if (RSHMEMI_LL_NOP) {
        rshmemi_grid_dep_wait();
        return;
    }
    // (rshmemi_pull_handshake waits for the kernels before: nothing before it reads what they
    // write.)
    const int me = team.my_index, N = team.size;
    const unsigned tid = threadIdx.x, nth = blockDim.x, b = blockIdx.x;
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)rshmem_dstate.n_pes;
    rshmem_u64* exp = rshmemi_my_sync() + rshmem_dstate.sync_exp + row;
    const bool stores = push & 1, gather = (push >> 1) & 1;
    __shared__ rshmemi_v4* to[RSHMEMI_LL_MAX_MEMBERS];
    // k-th, member i = (me + 1 + k) % N (this PE last): the pull reads from[k] (i's src share
    // for this PE) into dst[i·w..]; the push stores src[i·w..] into to[k] (i's dst share from
    // this PE).
    for (int k = tid; k < N; k += nth) {
        const int i = (me + 1 + k) % N;
        const rshmemi_v4* s = gather ? src : src + (rshmem_u64)me * w;
        rshmemi_v4* d = dst + (rshmem_u64)me * w;
        from[k] = i == me ? s : (const rshmemi_v4*)rshmemi_ptr(s, rshmemi_member(team, i));
        to[k] = i == me ? d : (rshmemi_v4*)rshmemi_ptr((void*)d, rshmemi_member(team, i));
    }
    rshmemi_pull_handshake(S, team, ck, ll, exp, RSHMEMI_PULL_FENCES);
    if (S.verdict == 0) {
        const rshmem_u64 c = (w + gridDim.x - 1) / gridDim.x, lo = (rshmem_u64)b * c;
        const rshmem_u64 len = lo < w ? (w - lo < c ? w - lo : c) : 0;
        for (int kk = 0; kk < N; kk++) {
            const int k = RSHMEMI_A2A_ROTATE ? (kk + (int)(b % (unsigned)N)) % N : kk;
            const rshmem_u64 at = (rshmem_u64)((me + 1 + k) % N) * w + lo;
            rshmemi_v4* d = stores ? to[k] + lo : dst + at;
            const rshmemi_v4* s = stores ? src + (gather ? lo : at) : from[k] + lo;
            if (d != s) rshmemi_copy_v4(d, s, len, tid, nth);
        }
        rshmemi_pull_done(S, team, b, stores);
    }
    rshmemi_ll_end(S, team, ck, exp, row);
}

// Vectors per step of a chain broadcast block: an eighth of its part, 16 to 64 KiB (compile
// options for measurements).
#ifndef RSHMEMI_CHAIN_MIN_VECS
#define RSHMEMI_CHAIN_MIN_VECS 1024
#endif
#ifndef RSHMEMI_CHAIN_MAX_VECS
#define RSHMEMI_CHAIN_MAX_VECS 4096
#endif
// The release before a chain step's count: at GPU scope. The step's data lies in this PE's own
// memory, and the next member reads it over the peer mapping through this GPU's L2, the point
// of coherence of that memory for local and peer accesses alike; a GPU-scope fence has the
// block's stores performed there before the count is sent (the reader acquires at system
// scope, which also drops stale lines from its L1). A system-scope fence would cost every
// step more than a microsecond, which a third warp fencing while the others copy the next step
// does not hide.
// RSHMEMI_CHAIN_FENCE_SYS 1: the system-scope fence; RSHMEMI_CHAIN_FENCE 0 (measurements
// only: wrong memory ordering): none.
#ifndef RSHMEMI_CHAIN_FENCE
#define RSHMEMI_CHAIN_FENCE 1
#endif
#ifndef RSHMEMI_CHAIN_FENCE_SYS
#define RSHMEMI_CHAIN_FENCE_SYS 0
#endif
__device__ __forceinline__ void rshmemi_chain_fence() {
    if (!RSHMEMI_CHAIN_FENCE) return;
    if (RSHMEMI_CHAIN_FENCE_SYS) asm volatile("fence.acq_rel.sys;" ::: "memory");
    else asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Pull broadcast (rshmem::cuda::GpuColl::pull_broadcast_bytes; past the LL size, whole 16-byte
// vectors at 16-byte aligned addresses, in or out of place; `root` in the low 32 bits, bit 32:
// chain). Every member other than the root reads the root's src into its dst over the peer
// mapping, or along a chain (GpuColl::chain_broadcast_bytes): the member at position
// p = (me - root) mod N reads from the one before it (p = 1 the root's src, p >= 2 the previous
// member's dst), so every byte crosses each link once, as in a ring (everyone reading the
// root's src shares the root's outgoing links among N - 1 readers, but waits one hop, not
// N - 1); the root copies its own src into dst when they differ. With the pull
// all_to_all's handshake: the header after a release fence, the reads only after the root's
// header arrived (acquire), a done line per block and the wait for every member's, so no
// member still reads this PE's src or dst when the kernel ends. Block b copies the part
// [b·c, (b+1)·c) (c = ceil(w / blocks)); on a chain in steps (an eighth of the part, 16 to
// 64 KiB), each step published to the next member as a count on line
// RSHMEMI_SIG_WORDS + blocks + b (after the block's barrier and a release fence: its stores to
// dst are visible first, see rshmemi_chain_fence) and read only when the previous member's
// count says so (acquire).
// A wait that gives up stops this member's copying (the next one then times out too).
extern "C" __global__ void rshmemi_coll_pull_bcast(rshmemi_v4* dst, const rshmemi_v4* src, rshmem_u64 w, rshmem_team team,
                                                   rshmemi_check ck, rshmemi_ll ll, rshmem_u64 root) {
    __shared__ rshmemi_ll_shared S;
    __shared__ int lost;
    if (RSHMEMI_LL_NOP) {
        rshmemi_grid_dep_wait();
        return;
    }
    // (rshmemi_pull_handshake waits for the kernels before: nothing before it reads what they
    // write.)
    const int me = team.my_index, N = team.size, r = (int)(root & 0xffffffffu);
    const bool chain = (root >> 32) & 1;
    const unsigned tid = threadIdx.x, b = blockIdx.x, G = gridDim.x;
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)rshmem_dstate.n_pes;
    rshmem_u64* exp = rshmemi_my_sync() + rshmem_dstate.sync_exp + row;
    if (tid == 0) lost = 0;
    rshmemi_pull_handshake(S, team, ck, ll, exp, RSHMEMI_PULL_FENCES);
    if (S.verdict == 0) {
        const int pos = (me - r + N) % N, up = chain ? (me + N - 1) % N : r, down = (me + 1) % N;
        const rshmemi_v4* s = pos == 0               ? src
                              : pos == 1 || !chain ? (const rshmemi_v4*)rshmemi_ptr((const void*)src, rshmemi_member(team, up))
                                                   : (const rshmemi_v4*)rshmemi_ptr((const void*)dst, rshmemi_member(team, up));
        const rshmem_u64 c = (w + G - 1) / G, lo = (rshmem_u64)b * c;
        const rshmem_u64 len = lo < w ? (w - lo < c ? w - lo : c) : 0;
        rshmem_u64 st = len;
        if (chain) {
            st = len / 8;
            st = st < RSHMEMI_CHAIN_MIN_VECS ? RSHMEMI_CHAIN_MIN_VECS : st > RSHMEMI_CHAIN_MAX_VECS ? RSHMEMI_CHAIN_MAX_VECS : st;
        }
        const rshmem_u64* ready = S.peer[up].from + 2 * (RSHMEMI_SIG_WORDS + G + b);
        if (s != dst)
            for (rshmem_u64 a = 0, k = 1; a < len; a += st, k++) {
                if (chain && pos >= 2) {
                    if (tid == 0 && !rshmemi_ll_wait_count(ready, S.peer[up].flag, k, (const volatile int*)&S.abort,
                                                           rshmemi_member(team, up)))
                        lost = 1;
                    __syncthreads();
                    if (lost) break;
                }
                rshmemi_copy_v4(dst + lo + a, s + lo + a, len - a < st ? len - a : st, tid, blockDim.x);
                if (chain && pos >= 1 && pos < N - 1) {
                    __syncthreads();
                    if (tid == 0) {
                        rshmemi_chain_fence();
                        rshmemi_ll_push(S, down, RSHMEMI_SIG_WORDS + G + b, k);
                    }
                }
            }
        rshmemi_pull_done(S, team, b);
    }
    rshmemi_ll_end(S, team, ck, exp, row);
}

#endif
