// rshmem's stream-ordered collectives (rshmem::cuda::GpuColl), compiled with rshmem_device.cuh.
//
// The host runs a collective's plan (rshmem::coll::plan) as a sequence of launches on one
// stream: a team barrier kernel (rshmemi_team_sync, one block, monotonically increasing
// counters in device memory, so graphs replay) for every Sync step, and between two syncs one
// copy kernel (every Copy step of the phase, peers' symmetric buffers read over peer mappings)
// or one reduce kernel (a Reduce step). Data kernels never wait for peers, so PEs sharing a GPU
// cannot deadlock whatever the occupancy. Every typed kernel is generated from one type list
// and one op list below (X-macros instantiating templates).
//
// Cross-PE argument check: the first barrier of every collective (rshmemi_coll_sync_sig, or the
// first barrier inside a fused kernel) carries the call's signature (rshmemi_sig, computed on
// the host and passed as a kernel argument, so graphs replay it). Each member stores its
// signature into every member's slot for it before the barrier; after the barrier each member
// compares every member's slot with its own and clears the slots. On a mismatch it records the
// first differing member and both signatures in the error record (bit RSHMEMI_ERR_MISMATCH),
// sets the call's skip flag (the data kernels of the call then move nothing), and pads its
// barrier count up to the largest any member's call performs, so every member leaves the call
// having done the same number of barriers and nobody hangs.

#define RSHMEMI_COLL_MAX_COPIES 64

// ----- element types: storage type, accumulation type -----
// NAME (rshmem::ElemKind::name, as in the device API), storage T, accumulator A.
#define RSHMEMI_COLL_INT_TYPES(X)                                                   \
    X(int8, signed char, signed char) X(int16, short, short) X(int32, int, int)     \
    X(int64, long long, long long) X(uint8, unsigned char, unsigned char)           \
    X(uint16, unsigned short, unsigned short) X(uint32, unsigned int, unsigned int) \
    X(uint64, unsigned long long, unsigned long long)
#define RSHMEMI_COLL_FLOAT_TYPES(X)                                                 \
    X(half, rshmem_half, float) X(bfloat16, rshmem_bfloat16, float)                \
    X(float, float, float) X(double, double, double)

// Operation codes (rshmem::coll::ReduceOp in declaration order).
#define RSHMEMI_OP_SUM 0
#define RSHMEMI_OP_PROD 1
#define RSHMEMI_OP_MIN 2
#define RSHMEMI_OP_MAX 3
#define RSHMEMI_OP_AND 4
#define RSHMEMI_OP_OR 5
#define RSHMEMI_OP_XOR 6
#define RSHMEMI_COLL_INT_OPS(X, NAME, T, A)                                               \
    X(NAME, T, A, sum, RSHMEMI_OP_SUM) X(NAME, T, A, prod, RSHMEMI_OP_PROD)                \
    X(NAME, T, A, min, RSHMEMI_OP_MIN) X(NAME, T, A, max, RSHMEMI_OP_MAX)                  \
    X(NAME, T, A, and, RSHMEMI_OP_AND) X(NAME, T, A, or, RSHMEMI_OP_OR)                    \
    X(NAME, T, A, xor, RSHMEMI_OP_XOR)
#define RSHMEMI_COLL_FLOAT_OPS(X, NAME, T, A)                                             \
    X(NAME, T, A, sum, RSHMEMI_OP_SUM) X(NAME, T, A, prod, RSHMEMI_OP_PROD)                \
    X(NAME, T, A, min, RSHMEMI_OP_MIN) X(NAME, T, A, max, RSHMEMI_OP_MAX)

template <typename A> struct rshmemi_is_float { static const bool v = false; };
template <> struct rshmemi_is_float<float> { static const bool v = true; };
template <> struct rshmemi_is_float<double> { static const bool v = true; };

// Storage <-> accumulator.
template <typename T, typename A> struct rshmemi_cvt {
    static __device__ __forceinline__ A in(T x) { return (A)x; }
    static __device__ __forceinline__ T out(A x) { return (T)x; }
};
template <> struct rshmemi_cvt<rshmem_half, float> {
    static __device__ __forceinline__ float in(rshmem_half x) { return rshmem_half_to_float(x); }
    static __device__ __forceinline__ rshmem_half out(float x) { return rshmem_float_to_half(x); }
};
template <> struct rshmemi_cvt<rshmem_bfloat16, float> {
    static __device__ __forceinline__ float in(rshmem_bfloat16 x) { return rshmem_bfloat16_to_float(x); }
    static __device__ __forceinline__ rshmem_bfloat16 out(float x) { return rshmem_float_to_bfloat16(x); }
};

// a OP b: integers wrap (computed in the unsigned type of the same width), floats IEEE
// (min/max are minNum/maxNum: a NaN operand is ignored unless both are NaN).
template <typename A, int OP> __device__ __forceinline__ A rshmemi_apply(A a, A b) {
    if constexpr (rshmemi_is_float<A>::v) {
        if constexpr (OP == RSHMEMI_OP_SUM) return a + b;
        else if constexpr (OP == RSHMEMI_OP_PROD) return a * b;
        else if constexpr (OP == RSHMEMI_OP_MIN) return a != a ? b : (b != b ? a : (b < a ? b : a));
        else return a != a ? b : (b != b ? a : (b > a ? b : a));
    } else {
        typedef typename rshmemi_bits<A, sizeof(A)>::U U;
        if constexpr (OP == RSHMEMI_OP_SUM) return (A)(U)((U)a + (U)b);
        else if constexpr (OP == RSHMEMI_OP_PROD) return (A)(U)((U)a * (U)b);
        else if constexpr (OP == RSHMEMI_OP_MIN) return b < a ? b : a;
        else if constexpr (OP == RSHMEMI_OP_MAX) return b > a ? b : a;
        else if constexpr (OP == RSHMEMI_OP_AND) return (A)((U)a & (U)b);
        else if constexpr (OP == RSHMEMI_OP_OR) return (A)((U)a | (U)b);
        else return (A)((U)a ^ (U)b);
    }
}

// True once a device wait of this PE timed out (the header's flag, until the host checks it).
// Data kernels then move nothing: a PE that gave up on a barrier must not overwrite what its
// peers may still be reading (they would get wrong data without an error of their own); its own
// results are wrong anyway and the host reports the timeout. Barriers still run (counters stay
// in step).
__device__ __forceinline__ bool rshmemi_coll_gave_up() {
    return rshmemi_failed();
}

__device__ __forceinline__ int rshmemi_member(const rshmem_team& t, int i) { return t.start + i * t.stride; }

// ----- signatures (see the top of the file; layout mirrored by rshmem::cuda::GpuColl) -----
#define RSHMEMI_SIG_WORDS 6
// Word 0: bit 63 set (a written slot is never 0), bits 32..47 the number of barriers the call
// performs.
#define RSHMEMI_SIG_SYNCS(w0) ((unsigned)(((w0) >> 32) & 0xffff))
// Error record (u64 words): [0] flags, [1..5) capacity detail, [5] world PE of the first member
// whose signature differs, [6..12) this PE's signature, [12..18) that member's (0: none
// written), [RSHMEMI_ERR_SKIP + slot] the skip flag of the latest call on a team slot.
#define RSHMEMI_ERR_CAPACITY 1ull
#define RSHMEMI_ERR_A2AV 2ull
#define RSHMEMI_ERR_MISMATCH 4ull
#define RSHMEMI_ERR_MM_PE 5
#define RSHMEMI_ERR_MM_MINE 6
#define RSHMEMI_ERR_MM_THEIRS (RSHMEMI_ERR_MM_MINE + RSHMEMI_SIG_WORDS)
#define RSHMEMI_ERR_SKIP 32

struct rshmemi_sig {
    rshmem_u64 w[RSHMEMI_SIG_WORDS];
};
// What a collective's first barrier needs: the signature, this PE's symmetric slot row of the
// team's slot (u64[n_pes][RSHMEMI_SIG_WORDS], indexed by world PE) and the error record.
struct rshmemi_check {
    rshmemi_sig sig;
    rshmem_u64* slots;
    rshmem_u64* err;
};

// The skip flag of the current call (set by its first barrier).
__device__ __forceinline__ bool rshmemi_coll_skip(const rshmemi_check& ck, const rshmem_team& t) {
    return *(volatile rshmem_u64*)(ck.err + RSHMEMI_ERR_SKIP + t.slot) != 0;
}

// The signature-carrying barrier (block scope, every thread of one block). Returns true when
// every member passed the same signature (then the call moves data).
__device__ bool rshmemi_sig_sync(rshmem_team team, const rshmemi_check& ck) {
    __shared__ int first_bad;
    __shared__ unsigned max_syncs;
    __shared__ int gave_up;
    const unsigned tid = rshmemi_tid(), nth = rshmemi_nthreads();
    const int my_pe = rshmem_dstate.my_pe;
    if (tid == 0) { first_bad = 0x7fffffff; max_syncs = 0; }
    for (int i = tid; i < team.size; i += nth) {
        volatile rshmem_u64* d = (volatile rshmem_u64*)rshmem_ptr(ck.slots + (rshmem_u64)my_pe * RSHMEMI_SIG_WORDS,
                                                                  rshmemi_member(team, i));
        // What a member wrote before the LL header an earlier call of this PE saw (that
        // member's clearing of this PE's slot, released at the end of its kernel) comes before
        // this write into its slot row. At a kernel's start no store of this thread is pending,
        // so the fence costs no round trip (in the LL kernel, after its pushes, it did).
        asm volatile("fence.acq_rel.sys;" ::: "memory");
#pragma unroll
        for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) d[w] = ck.sig.w[w];
    }
    // Its release arrivals publish the slots (and the shared initialisation above).
    rshmem_team_sync_block(team);
    if (tid == 0) gave_up = rshmemi_coll_gave_up();
    __syncthreads();
    if (gave_up) {
        // A wait timed out: the slots may not be written yet; the host reports the timeout.
        if (tid == 0) ck.err[RSHMEMI_ERR_SKIP + team.slot] = 1;
        return false;
    }
    for (int i = tid; i < team.size; i += nth) {
        const volatile rshmem_u64* s = ck.slots + (rshmem_u64)rshmemi_member(team, i) * RSHMEMI_SIG_WORDS;
        bool eq = true;
#pragma unroll
        for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) eq = eq && s[w] == ck.sig.w[w];
        if (!eq) atomicMin(&first_bad, i);
        atomicMax(&max_syncs, RSHMEMI_SIG_SYNCS(s[0]));
    }
    __syncthreads();
    const bool ok = first_bad == 0x7fffffff;
    if (tid == 0) {
        if (!ok) {
            unsigned long long old = atomicOr((unsigned long long*)ck.err, RSHMEMI_ERR_MISMATCH);
            if (!(old & RSHMEMI_ERR_MISMATCH)) {
                int pe = rshmemi_member(team, first_bad);
                const volatile rshmem_u64* s = ck.slots + (rshmem_u64)pe * RSHMEMI_SIG_WORDS;
                ck.err[RSHMEMI_ERR_MM_PE] = pe;
                for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) {
                    ck.err[RSHMEMI_ERR_MM_MINE + w] = ck.sig.w[w];
                    ck.err[RSHMEMI_ERR_MM_THEIRS + w] = s[w];
                }
            }
        }
        ck.err[RSHMEMI_ERR_SKIP + team.slot] = ok ? 0 : 1;
    }
    __syncthreads();
    // Consumed: a member that passes no signature next time (a different call) reads as 0.
    // Nobody writes these slots again before this PE's next barrier of the team.
    for (int i = tid; i < team.size; i += nth) {
        volatile rshmem_u64* s = ck.slots + (rshmem_u64)rshmemi_member(team, i) * RSHMEMI_SIG_WORDS;
#pragma unroll
        for (int w = 0; w < RSHMEMI_SIG_WORDS; w++) s[w] = 0;
    }
    if (!ok) {
        // Pad to the largest barrier count of any member's call: every member leaves the call
        // with the same number of barriers done (the remaining ones are already enqueued).
        unsigned mine = RSHMEMI_SIG_SYNCS(ck.sig.w[0]);
        for (unsigned k = mine; k < max_syncs; k++) rshmem_team_sync_block(team);
    }
    __syncthreads();
    return ok;
}

// The first barrier of a collective that does not run fused.
extern "C" __global__ void rshmemi_coll_sync_sig(rshmem_team team, rshmemi_check ck) { rshmemi_sig_sync(team, ck); }

// dst[0..n) = fold over the team's members i = 0..size-1 (in team order) of member i's
// src[0..n). `src` is a symmetric address (this PE's), `dst` this PE's memory (symmetric or
// private). Each element is read from every member before it is written, so dst may be this
// PE's src (same index). 16-byte vectors when every address is 16-byte aligned.
template <typename T, typename A, int OP>
__device__ __forceinline__ void rshmemi_reduce(T* dst, const T* src, rshmem_u64 n, rshmem_team team) {
    const rshmem_u64 tid = blockIdx.x * (rshmem_u64)blockDim.x + threadIdx.x;
    const rshmem_u64 nth = (rshmem_u64)gridDim.x * blockDim.x;
    const int V = 16 / sizeof(T);
    rshmem_u64 done = 0;
    if ((((rshmem_u64)dst | (rshmem_u64)src) & 15) == 0) {
        rshmem_u64 nv = n / V;
        for (rshmem_u64 v = tid; v < nv; v += nth) {
            A acc[V];
            {
                rshmemi_v4 x = ((const rshmemi_v4*)rshmem_ptr(src, rshmemi_member(team, 0)))[v];
                const T* e = (const T*)&x;
#pragma unroll
                for (int k = 0; k < V; k++) acc[k] = rshmemi_cvt<T, A>::in(e[k]);
            }
            for (int i = 1; i < team.size; i++) {
                rshmemi_v4 x = ((const rshmemi_v4*)rshmem_ptr(src, rshmemi_member(team, i)))[v];
                const T* e = (const T*)&x;
#pragma unroll
                for (int k = 0; k < V; k++) acc[k] = rshmemi_apply<A, OP>(acc[k], rshmemi_cvt<T, A>::in(e[k]));
            }
            rshmemi_v4 y;
            T* o = (T*)&y;
#pragma unroll
            for (int k = 0; k < V; k++) o[k] = rshmemi_cvt<T, A>::out(acc[k]);
            ((rshmemi_v4*)dst)[v] = y;
        }
        done = nv * V;
    }
    for (rshmem_u64 j = done + tid; j < n; j += nth) {
        A acc = rshmemi_cvt<T, A>::in(((const T*)rshmem_ptr(src, rshmemi_member(team, 0)))[j]);
        for (int i = 1; i < team.size; i++)
            acc = rshmemi_apply<A, OP>(acc, rshmemi_cvt<T, A>::in(((const T*)rshmem_ptr(src, rshmemi_member(team, i)))[j]));
        dst[j] = rshmemi_cvt<T, A>::out(acc);
    }
}

// fused != 0 (launched as one block): the team barriers before (with the signature check)
// and after run in the same kernel (one launch for a small one-shot collective instead of three).
#define RSHMEMI_COLL_REDUCE_KERNEL(NAME, T, A, OPN, OP)                                            \
    extern "C" __global__ void rshmemi_coll_reduce_##NAME##_##OPN(T* dst, const T* src,            \
                                                                   rshmem_u64 n, rshmem_team team, \
                                                                   int fused, rshmemi_check ck) {  \
        bool ok = fused ? rshmemi_sig_sync(team, ck) : !rshmemi_coll_skip(ck, team);               \
        if (ok && !rshmemi_coll_gave_up()) rshmemi_reduce<T, A, OP>(dst, src, n, team);            \
        if (fused) rshmem_team_sync_block(team);                                                   \
    }
#define RSHMEMI_COLL_INT_REDUCE(NAME, T, A) RSHMEMI_COLL_INT_OPS(RSHMEMI_COLL_REDUCE_KERNEL, NAME, T, A)
#define RSHMEMI_COLL_FLOAT_REDUCE(NAME, T, A) RSHMEMI_COLL_FLOAT_OPS(RSHMEMI_COLL_REDUCE_KERNEL, NAME, T, A)
RSHMEMI_COLL_INT_TYPES(RSHMEMI_COLL_INT_REDUCE)
RSHMEMI_COLL_FLOAT_TYPES(RSHMEMI_COLL_FLOAT_REDUCE)

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
// the way of a matched call: system-scope fences cost a round trip over NVLink each, and a
// first version with them took 12 us where this takes 5 (2x H100, graph replay).
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
// kernel also runs it for the reduce_scatter, which measured slower with it): the
// last warp of each block is a control warp, launched beside the data threads (blockDim.x - 32
// of them, a line each): it pushes the header and takes the verdict on the first other member,
// and has no data line, so the data threads poll their first lines beside the verdict instead of
// after it (a warp with both took the verdict and then one more load round trip for its line).
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
// previous call's end (device printf).
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
// this call does not write) never carries this call's flag within 2^31 calls of the pair. (The
// former flag, 16 bits of the expectation beside 15 of the sequence, came back after 32768 LL
// calls without a barrier-based one: a call as large as one 32768 calls before it took that
// call's stale lines for its own. RSHMEMI_LL_FLAG_15 1, a compile option for the test that
// shows it, builds that flag again.)
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
// not one per line (a thread walking its lines one by one took about 0.6 us per line).
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
// ones; so do the other LL kernels and the pull kernels (rshmemi_pull_handshake). (2x H100,
// stamps: the begin took 1100-1230 cycles when it read the arguments after the wait, 650-700
// now; graph replay, with the per-block sequences: all_reduce 8 B 2.70-2.79 -> 2.54-2.57 us,
// 4 KiB 3.47-3.54 -> 2.99-3.06.)
struct rshmemi_ll_prep {
    unsigned* sq;           // this block's copy of the pair sequence with the member
    const rshmem_u64* ex;   // this PE's barrier expectation for the member
    rshmem_u64 to;          // where this PE's lines go in the member's area (half 0)
    rshmem_u64 from;        // where the member's lines lie in this PE's area (half 0)
    rshmem_u64 half;        // bytes from half 0 to half 1
    const rshmem_u64* err;  // this PE's error word
};
// RSHMEMI_LL_PREP 0 (measurements): the values are computed before the wait but not kept in
// registers (the compiler may load the arguments again after it). 2x H100, graph: all_reduce
// 4 KiB 3.05-3.17 us against 2.98-3.05, 8 KiB 3.11-3.17 against 2.97-3.04.
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
    P.to = (rshmem_u64)rshmem_ptr(rshmemi_ll_lines(ll, 0, rshmem_dstate.my_pe, n_pes), pe);
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
// peer costs its thread about 350 cycles (2x H100), and thread 0 pushes the first data line.
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
// waits for another and a matched call has nothing left to store. (Before, a pair had one
// sequence, which block 0 moved at the end once every block had read it: 850-930 cycles at the
// end of a call of several blocks against 320-440 for one block, 2x H200, the stamps; here the
// end reads only shared memory, its kernel arguments being copied there at the begin.)
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
    // they are in): its one data line and the header arrive together; so does a call with a
    // control warp (the host runs one on several blocks up to 16 KiB: 2x H200, 4 KiB 2.75-2.79
    // against 2.94-2.96 us without; otherwise the warp that took the verdict had one more load
    // round trip for its own line after it). A call of more blocks without one folds after
    // them: every thread polling while the lines still stream in slowed it
    // (RSHMEMI_LL_AR_EARLY; 2x H100, graph: 64 KiB 4.08 -> 3.94-3.97 us, 128 KiB 4.51 -> 4.19;
    // 8 bytes 3.14 -> 3.35-3.63 when its one block waits after the verdicts).
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
// and the system scope waited for this block's local stores to be performed system-wide too
// (2 GPUs, graph replay: all_reduce 1 MiB 11.98 -> 11.03 us, all_to_all 4 MiB 15.67 -> 14.85,
// broadcast 1 MiB 11.25 -> 10.78).
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
// more than both loading from each other (2x H200, 1 GiB each way: 365 against 336 GB/s).
// Block b takes vectors [b·c, (b+1)·c) (c = ceil(nv / blocks)) in steps (a sixteenth of its
// part, 64 to 256 KiB); after storing step k it publishes k + 1 as line RSHMEMI_SIG_WORDS + b
// to the other member (after the block's barrier and a system-scope release fence: the stores
// went to the other GPU's memory), then folds step k - 1 once the other's count says it
// arrived (acquire). A member stores into the other's dst only after the handshake (the other
// is in this call: its dst is free), and its kernel ends only after every step of the other's
// has arrived and been folded, so no store of this call is pending when either kernel ends.
// No member reads the other's memory, so no done lines. A wait that gives up stops this
// member's stores and folds (the other then times out too). The system-scope fence per step
// (about 1.7 us) makes it lose to the pull below about 256 MiB (BENCHMARKS.md).
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
    rshmemi_v4* theirs = (rshmemi_v4*)rshmem_ptr((void*)dst, rshmemi_member(team, other));
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
// after the other like larger teams' (the former code).
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
        from[i] = (const rshmemi_v4*)(i == me ? (const void*)src : rshmem_ptr((const void*)src, rshmemi_member(team, i)));
        // Destinations of the two-shot: the members after this PE in team order, then this PE.
        const int j = (me + 1 + i) % N;
        to[i] = (rshmemi_v4*)(j == me ? (void*)dst : rshmem_ptr((void*)dst, rshmemi_member(team, j)));
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
// measured 0.6 us faster at 8 bytes (2x H200); more: batches of RSHMEMI_LL_U.
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
// on their way; smaller shares go in team order (this PE's own in its place among them).
// 2x H100, graph, same call, own first against team order: all_to_all 1 MiB 6.22 against
// 6.44-6.47 us, 256 KiB 4.09-4.11 against 4.21-4.23, all_gather 1 MiB 6.29-6.34 against
// 6.55-6.57; but all_to_all 8 B 3.56-3.66 against 3.34-3.35 and 64 KiB (32 KiB shares)
// 4.07-4.09 against 3.91, all_gather 64 KiB 4.03 against 3.86-3.92. (A compile option for
// measurements: 0 always own first, a large value never.)
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
// rshmemi_ll_begin's loads (2x H100, graph: all_to_all 1 MiB 7.09-7.17 -> 6.98-7.05 us,
// all_gather 1 MiB 7.40 -> 7.03; byte shares, e.g. an 8-byte all_to_all, measured 0.45 us
// slower with it). The lines taken from members are waited for only after the verdicts: waiting
// for the first batch beside them (as the LL all_reduce does in a call of one block) measured
// slower, 1 MiB 7.21-7.27 -> 7.64-7.68 us (every thread polling while the lines still stream in).
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
// for all six measured slower at 8 bytes). words: whole 8-byte words at 8-byte aligned
// addresses (nb a multiple of 8; the host checks).
// Each kernel runs the batch (lines per thread at once) its call needs: 1 where every thread
// has at most one line, 2 or 4 up to two or four, else RSHMEMI_LL_A2A_U. The code of a larger batch is
// executed even where its lines are absent (predicated), and it cost: 2x H100, graph,
// all_to_all 64 KiB (a line per thread) 4.31-4.34 us with batches of 8, 3.85-3.91 with 2;
// 1 MiB (four lines per thread) 6.97-7.06 with 8, 6.70-6.77 with 4.
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
// once (2x H200: 365 against 336 GB/s each way). A member stores into another's dst only after
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
        from[k] = i == me ? s : (const rshmemi_v4*)rshmem_ptr(s, rshmemi_member(team, i));
        to[k] = i == me ? d : (rshmemi_v4*)rshmem_ptr((void*)d, rshmemi_member(team, i));
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
// scope, which also drops stale lines from its L1). On 4x H200 a system-scope fence per step
// cost about 1.7 us each (1 GiB broadcast: 3.64 ms against 3.22), and letting a third warp
// fence while the others copied the next step did not recover it (3.24 ms).
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
                              : pos == 1 || !chain ? (const rshmemi_v4*)rshmem_ptr((const void*)src, rshmemi_member(team, up))
                                                   : (const rshmemi_v4*)rshmem_ptr((const void*)dst, rshmemi_member(team, up));
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

// ----- copies: every Copy step of one phase in one launch -----

// `bytes` from `src` (translated to world PE `pe`'s copy when pe >= 0, else a local address)
// to this PE's `dst`.
struct rshmemi_copy_desc {
    rshmem_u64 dst;
    rshmem_u64 src;
    rshmem_u64 bytes;
    long long pe;
};
struct rshmemi_copies {
    rshmemi_copy_desc d[RSHMEMI_COLL_MAX_COPIES];
};

// Block b serves copy b % n, as part b / n of gridDim.x / n (the grid is a multiple of n).
// fused != 0 (one block, team given): signature barrier, every copy by the whole block, barrier.
extern "C" __global__ void rshmemi_coll_copy(rshmemi_copies c, int n, rshmem_team team, int fused,
                                             rshmemi_check ck) {
    if (fused) {
        bool ok = rshmemi_sig_sync(team, ck);
        for (int i = 0; i < n && ok && !rshmemi_coll_gave_up(); i++) {
            const rshmemi_copy_desc& d = c.d[i];
            const void* s = d.pe >= 0 ? rshmem_ptr((const void*)d.src, (int)d.pe) : (const void*)d.src;
            rshmemi_copy((void*)d.dst, s, d.bytes, threadIdx.x, blockDim.x);
        }
        rshmem_team_sync_block(team);
        return;
    }
    if (rshmemi_coll_gave_up() || rshmemi_coll_skip(ck, team)) return;
    unsigned i = blockIdx.x % n, part = blockIdx.x / n, parts = gridDim.x / n;
    const rshmemi_copy_desc& d = c.d[i];
    const void* s = d.pe >= 0 ? rshmem_ptr((const void*)d.src, (int)d.pe) : (const void*)d.src;
    rshmemi_copy((void*)d.dst, s, d.bytes, part * blockDim.x + threadIdx.x, parts * blockDim.x);
}

// ----- all_to_all_v with counts in device memory -----
// counts: symmetric u64[team.size] per member (member j sends counts[k] elements to member k,
// packed in member order in its src). Member k receives from j into dst, packed in member
// order; recv_counts[j] (this PE's memory) gets what came from j. Every member reads the whole
// count matrix (after the barrier before this kernel) and checks it: a sender whose counts
// exceed `src_cap` elements or a receiver whose total exceeds `dst_cap` makes every member
// copy nothing, set *err (bit 1) and write the counts it saw; the host turns that into an error.
// The count matrix lives in dynamic shared memory (team.size^2 words, sized by the host).
extern "C" __global__ void rshmemi_coll_a2av_dev(char* dst, const char* src, const rshmem_u64* counts,
                                                 rshmem_u64* recv_counts, rshmem_u64* err, rshmem_u64 elem,
                                                 rshmem_u64 src_cap, rshmem_u64 dst_cap, rshmem_team team) {
    extern __shared__ rshmem_u64 m[];
    __shared__ int bad;
    const int n = team.size, me = team.my_index;
    if (rshmemi_coll_gave_up() || *(volatile rshmem_u64*)(err + RSHMEMI_ERR_SKIP + team.slot)) return;
    if (threadIdx.x == 0) bad = 0;
    for (int t = threadIdx.x; t < n * n; t += blockDim.x) {
        int j = t / n, k = t % n;
        m[t] = rshmemi_vld((const rshmem_u64*)rshmem_ptr(counts + k, rshmemi_member(team, j)));
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        rshmem_u64 sent = 0, got = 0;
        int over = 0;
        for (int k = 0; k < n; k++) {
            rshmem_u64 a = m[j * n + k], b = m[k * n + j];
            if (a > src_cap || b > dst_cap) over = 1;
            else { sent += a; got += b; }
        }
        if (over || sent > src_cap || got > dst_cap) atomicOr(&bad, 1);
    }
    __syncthreads();
    if (blockIdx.x == 0)
        for (int j = threadIdx.x; j < n; j += blockDim.x) recv_counts[j] = m[j * n + me];
    if (bad) {
        // err[1..5): the first offending pair (sender, receiver), the running total of elements
        // that overflowed (sent by the sender, resp. received by the receiver) and the capacity.
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            int found = 0;
            for (int j = 0; j < n && !found; j++) {
                rshmem_u64 sent = 0, got = 0;
                for (int k = 0; k < n; k++) {
                    sent += m[j * n + k];
                    got += m[k * n + j];
                    if (m[j * n + k] > src_cap || sent > src_cap) {
                        err[1] = j; err[2] = k; err[3] = sent; err[4] = src_cap; found = 1; break;
                    }
                    if (m[k * n + j] > dst_cap || got > dst_cap) {
                        err[1] = k; err[2] = j; err[3] = got; err[4] = dst_cap; found = 1; break;
                    }
                }
            }
            atomicOr(err, RSHMEMI_ERR_CAPACITY);
        }
        return;
    }
    unsigned j = blockIdx.x % n, part = blockIdx.x / n, parts = gridDim.x / n;
    rshmem_u64 disp = 0, at = 0;
    for (int k = 0; k < me; k++) disp += m[j * n + k];
    for (unsigned i = 0; i < j; i++) at += m[i * n + me];
    rshmem_u64 bytes = m[j * n + me] * elem;
    const char* s = (const char*)rshmem_ptr(src + disp * elem, rshmemi_member(team, j));
    rshmemi_copy(dst + at * elem, s, bytes, part * blockDim.x + threadIdx.x, parts * blockDim.x);
}

// ----- all_to_all_v with counts known on the host (baked into the launches, so graphs replay) --
// Each member publishes what it sends to whom (counts and displacements, elements) in its
// symmetric `meta` (u64[2 * stride], stride >= team size: counts, then displacements); after a
// barrier, member k pulls from member j `meta_j.count[k]` elements at `meta_j.displ[k]` into
// dst at its own recv displacement. A count that does not match what k expects, or a range
// beyond src_cap / dst_cap, copies nothing for that pair and sets *err (bit 2). The lists travel
// as kernel arguments in chunks of RSHMEMI_A2AV_CHUNK members (one launch per chunk), so any
// team size works and a captured graph holds them.
#define RSHMEMI_A2AV_CHUNK 64
struct rshmemi_a2av_list {
    rshmem_u64 count[RSHMEMI_A2AV_CHUNK];
    rshmem_u64 displ[RSHMEMI_A2AV_CHUNK];
};
// Members base .. base + n of this PE's send list.
extern "C" __global__ void rshmemi_coll_a2av_meta(rshmem_u64* meta, rshmemi_a2av_list send, int base, int n,
                                                  rshmem_u64 stride) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        meta[base + i] = send.count[i];
        meta[stride + base + i] = send.displ[i];
    }
}
// Receives from senders base .. base + cn (recv holds their entries); block b serves sender
// base + b % cn, as part b / cn of gridDim.x / cn.
extern "C" __global__ void rshmemi_coll_a2av_host(char* dst, const char* src, const rshmem_u64* meta,
                                                  rshmemi_a2av_list recv, int base, int cn, rshmem_u64 stride,
                                                  rshmem_u64* err, rshmem_u64 elem, rshmem_u64 src_cap,
                                                  rshmem_u64 dst_cap, rshmem_team team) {
    const int me = team.my_index;
    if (rshmemi_coll_gave_up() || *(volatile rshmem_u64*)(err + RSHMEMI_ERR_SKIP + team.slot)) return;
    unsigned jj = blockIdx.x % cn, part = blockIdx.x / cn, parts = gridDim.x / cn;
    int pe = rshmemi_member(team, base + (int)jj);
    rshmem_u64 c = rshmemi_vld((const rshmem_u64*)rshmem_ptr(meta + me, pe));
    rshmem_u64 d = rshmemi_vld((const rshmem_u64*)rshmem_ptr(meta + stride + me, pe));
    rshmem_u64 at = recv.displ[jj];
    if (c != recv.count[jj] || c > src_cap || d > src_cap - c || c > dst_cap || at > dst_cap - c) {
        if (part == 0 && threadIdx.x == 0) atomicOr(err, RSHMEMI_ERR_A2AV);
        return;
    }
    const char* s = (const char*)rshmem_ptr(src + d * elem, pe);
    rshmemi_copy(dst + at * elem, s, c * elem, part * blockDim.x + threadIdx.x, parts * blockDim.x);
}
