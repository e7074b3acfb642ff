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
#define RSHMEMI_COLL_TYPE_int8(X) X(int8, signed char, signed char)
#define RSHMEMI_COLL_TYPE_int16(X) X(int16, short, short)
#define RSHMEMI_COLL_TYPE_int32(X) X(int32, int, int)
#define RSHMEMI_COLL_TYPE_int64(X) X(int64, long long, long long)
#define RSHMEMI_COLL_TYPE_uint8(X) X(uint8, unsigned char, unsigned char)
#define RSHMEMI_COLL_TYPE_uint16(X) X(uint16, unsigned short, unsigned short)
#define RSHMEMI_COLL_TYPE_uint32(X) X(uint32, unsigned int, unsigned int)
#define RSHMEMI_COLL_TYPE_uint64(X) X(uint64, unsigned long long, unsigned long long)
#define RSHMEMI_COLL_TYPE_half(X) X(half, rshmem_half, float)
#define RSHMEMI_COLL_TYPE_bfloat16(X) X(bfloat16, rshmem_bfloat16, float)
#define RSHMEMI_COLL_TYPE_float(X) X(float, float, float)
#define RSHMEMI_COLL_TYPE_double(X) X(double, double, double)
// The types instantiated: every one, unless the source defines the lists first. rshmem compiles
// this source as several modules in parallel (rshmem::cuda::COLL_MODULES): one with every
// untyped kernel and no types, the others with RSHMEMI_COLL_TYPED_ONLY defined (no untyped
// kernel) and a few types each, so that no single NVRTC compile takes long.
#ifndef RSHMEMI_COLL_INT_TYPES
#define RSHMEMI_COLL_INT_TYPES(X)                                                          \
    RSHMEMI_COLL_TYPE_int8(X) RSHMEMI_COLL_TYPE_int16(X) RSHMEMI_COLL_TYPE_int32(X)        \
    RSHMEMI_COLL_TYPE_int64(X) RSHMEMI_COLL_TYPE_uint8(X) RSHMEMI_COLL_TYPE_uint16(X)      \
    RSHMEMI_COLL_TYPE_uint32(X) RSHMEMI_COLL_TYPE_uint64(X)
#endif
#ifndef RSHMEMI_COLL_FLOAT_TYPES
#define RSHMEMI_COLL_FLOAT_TYPES(X)                                                        \
    RSHMEMI_COLL_TYPE_half(X) RSHMEMI_COLL_TYPE_bfloat16(X) RSHMEMI_COLL_TYPE_float(X)     \
    RSHMEMI_COLL_TYPE_double(X)
#endif

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

