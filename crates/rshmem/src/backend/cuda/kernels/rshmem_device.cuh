// rshmem device API: one-sided communication from inside CUDA kernels.
//
// Compiled at run time by NVRTC (rshmem prepends this header to user source). It needs no CUDA
// header: f16 and bf16 are 16-bit storage types with PTX conversions. Symmetric pointers are this
// PE's own addresses of symmetric objects (what rshmem passes for a `Sym` kernel argument); the
// API translates them to a peer's copy with the heap base table `rshmem_dstate.base`, which
// rshmem fills per module per GPU after loading.
//
// No limit on PEs or teams is compiled in: the job's sizes come with `rshmem_dstate`. After each
// PE's heap (`heap_size` bytes from its base) lies its sync area, laid out by the host
// (`SyncLayout` in backend/cuda/mod.rs) in 64-bit words at the offsets `rshmem_dstate` gives:
//   sync_bar: team_slots x n_pes barrier counters (slot s, member p: s * n_pes + p)
//   sync_exp: team_slots x n_pes barrier expectations (same indexing)
//   sync_err: the error word (RSHMEM_ERR_* bits); then the PE that the first timed-out wait
//   naming one waited for, plus 1 (0: none named); then the address of the proxy's request
//   ring (0 in a world on one node) and the ring's head; then 4 reserved words
//   then n_pes words: the table of heap bases `base` points to (this PE's area only)
// Slot 0 is the world's, the last (stream_slot) rshmem's stream barrier's.
#ifndef RSHMEM_DEVICE_CUH
#define RSHMEM_DEVICE_CUH

// Bits of the error word: a device wait timed out; a device barrier got a team outside the job
// or one this PE is not a member of; a device atomic or `g` named a PE on another node (the
// proxy carries puts, put-with-signal, signals, gets and quiet there, not these: it touched
// nothing and returned 0; the PE is kept in the word after, as a timed-out wait's).
#define RSHMEM_ERR_TIMEOUT 1ull
#define RSHMEM_ERR_BAD_TEAM 2ull
#define RSHMEM_ERR_REMOTE_OP 4ull

// Comparisons (same order as rshmem::Cmp) and signal operations (rshmem::SignalOp).
#define RSHMEM_CMP_EQ 0
#define RSHMEM_CMP_NE 1
#define RSHMEM_CMP_GT 2
#define RSHMEM_CMP_GE 3
#define RSHMEM_CMP_LT 4
#define RSHMEM_CMP_LE 5
#define RSHMEM_SIGNAL_SET 0
#define RSHMEM_SIGNAL_ADD 1

typedef unsigned long long rshmem_u64;
typedef unsigned long long size_t_rshmem;

// Must match `DeviceState` in backend/cuda/mod.rs (72 bytes).
struct rshmem_state {
    const rshmem_u64* base;  // n_pes heap bases as mapped on this GPU (in this PE's sync area)
    rshmem_u64 my_base;      // base[my_pe]
    rshmem_u64 heap_size;    // user heap bytes (the sync area follows)
    rshmem_u64 timeout_ns;   // device waits give up after this and flag an error
    rshmem_u64 sync_bar;     // word offsets in the sync area (see above)
    rshmem_u64 sync_exp;
    rshmem_u64 sync_err;
    int my_pe;
    int n_pes;
    int team_slots;          // slots of barrier counters: the configured max teams + 1
    int stream_slot;         // team_slots - 1
};
static_assert(sizeof(rshmem_state) == 72, "rshmem_state must match DeviceState");

// A team as kernels see it: a strided set of world PEs with its barrier slot.
struct rshmem_team {
    int slot;
    int my_index;
    int size;
    int start;
    int stride;
};

__constant__ rshmem_state rshmem_dstate;

struct __align__(2) rshmem_half { unsigned short bits; };
struct __align__(2) rshmem_bfloat16 { unsigned short bits; };

__device__ __forceinline__ float rshmem_half_to_float(rshmem_half h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits)); return f;
}
__device__ __forceinline__ rshmem_half rshmem_float_to_half(float f) {
    rshmem_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h;
}
__device__ __forceinline__ float rshmem_bfloat16_to_float(rshmem_bfloat16 h) {
    return __int_as_float(((unsigned)h.bits) << 16);
}
__device__ __forceinline__ rshmem_bfloat16 rshmem_float_to_bfloat16(float f) {
    rshmem_bfloat16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h;
}

// ----- basics -----

__device__ __forceinline__ int rshmem_my_pe() { return rshmem_dstate.my_pe; }
__device__ __forceinline__ int rshmem_n_pes() { return rshmem_dstate.n_pes; }
__device__ __forceinline__ rshmem_team rshmem_team_world() {
    rshmem_team t; t.slot = 0; t.my_index = rshmem_dstate.my_pe; t.size = rshmem_dstate.n_pes;
    t.start = 0; t.stride = 1; return t;
}

// PE `pe`'s heap base as mapped on this GPU: one read-only (cached) load from the base table.
__device__ __forceinline__ rshmem_u64 rshmemi_base(int pe) { return __ldg(rshmem_dstate.base + pe); }

// The address of `local` (a symmetric address of this PE) in PE `pe`'s copy, for a PE whose heap
// is mapped on this GPU (callers test rshmemi_remote first).
__device__ __forceinline__ void* rshmemi_ptr(const void* local, int pe) {
    return (void*)(rshmemi_base(pe) + ((rshmem_u64)local - rshmem_dstate.my_base));
}
// The address of `local` (a symmetric address of this PE) in PE `pe`'s copy, which this thread
// may load from and store to; NULL where PE `pe` is on another node (its heap is reached only
// through rshmem's put/get, never by loads and stores), as nvshmem_ptr does.
__device__ __forceinline__ void* rshmem_ptr(const void* local, int pe) {
    const rshmem_u64 b = rshmemi_base(pe);
    return b == 0 ? (void*)0 : (void*)(b + ((rshmem_u64)local - rshmem_dstate.my_base));
}

__device__ __forceinline__ rshmem_u64* rshmemi_sync(int pe) {
    return (rshmem_u64*)(rshmemi_base(pe) + rshmem_dstate.heap_size);
}
__device__ __forceinline__ rshmem_u64* rshmemi_my_sync() {
    return (rshmem_u64*)(rshmem_dstate.my_base + rshmem_dstate.heap_size);
}
// This PE's error word (RSHMEM_ERR_* bits; the host reads and clears it).
__device__ __forceinline__ rshmem_u64* rshmemi_err_word() { return rshmemi_my_sync() + rshmem_dstate.sync_err; }
// True once a device wait of this PE timed out or a device barrier was misused (until the host
// checks): later waits give up at once and rshmem's data kernels move nothing.
__device__ __forceinline__ bool rshmemi_failed() { return *(volatile rshmem_u64*)rshmemi_err_word() != 0; }

// Programmatic dependent launch (sm_90 and up). A kernel launched as a dependent
// (CudaPe::launch_dependent) calls rshmemi_grid_dep_wait() before touching anything the work
// before it on the stream writes: it returns once that work is complete and visible (at once
// for a kernel launched without the attribute). rshmemi_grid_dep_launch() lets the next
// kernel, if it is launched as a dependent, become resident (it then waits in its own
// rshmemi_grid_dep_wait): call it only once this block no longer waits for other PEs.
__device__ __forceinline__ void rshmemi_grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void rshmemi_grid_dep_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ rshmem_u64 rshmemi_now() {
    rshmem_u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

__device__ __forceinline__ rshmem_u64 rshmemi_ld_acquire(const rshmem_u64* p) {
    rshmem_u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ unsigned rshmemi_ld_acquire32(const unsigned* p) {
    unsigned v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void rshmemi_st_release(rshmem_u64* p, rshmem_u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void rshmemi_st_release32(unsigned* p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void rshmemi_red_add_release(rshmem_u64* p, rshmem_u64 v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// Orders this thread's earlier puts and atomics before its later ones (to every PE).
__device__ __forceinline__ void rshmem_fence() { asm volatile("fence.sc.sys;" ::: "memory"); }

__device__ __forceinline__ bool rshmemi_cmp(rshmem_u64 a, int cmp, rshmem_u64 b) {
    switch (cmp) {
    case RSHMEM_CMP_EQ: return a == b;
    case RSHMEM_CMP_NE: return a != b;
    case RSHMEM_CMP_GT: return a > b;
    case RSHMEM_CMP_GE: return a >= b;
    case RSHMEM_CMP_LT: return a < b;
    default: return a <= b;
    }
}

// Flags a timed-out wait; `pe` >= 0 names the PE it waited for (the first named one is kept).
__device__ __forceinline__ void rshmemi_flag_timeout(int pe = -1) {
    if (pe >= 0) atomicCAS((unsigned long long*)(rshmemi_err_word() + 1), 0ull, (unsigned long long)pe + 1);
    atomicOr((unsigned long long*)rshmemi_err_word(), RSHMEM_ERR_TIMEOUT);
}

__device__ __forceinline__ rshmem_u64 rshmemi_ld_relaxed(const rshmem_u64* p) {
    rshmem_u64 v; asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;
}

// How device waits poll (a compile option, measured by the benchmarks): 0 polls with
// acquire loads; 1 polls with relaxed loads and ends with an acquire fence.
#ifndef RSHMEMI_WAIT_FENCE
#define RSHMEMI_WAIT_FENCE 0
#endif

// Waits until the 64-bit word at `p` (this PE's memory) compares true; gives up after the
// configured timeout (flagging an error the host reports). What the signaller wrote before its
// release is visible after the wait. Returns the value last seen. `pe` >= 0: the PE whose
// signal this waits for, named in the timeout the host reports.
__device__ __forceinline__ rshmem_u64 rshmemi_wait64(const rshmem_u64* p, int cmp, rshmem_u64 v, int pe = -1) {
#if RSHMEMI_WAIT_FENCE
#define RSHMEMI_POLL rshmemi_ld_relaxed
#else
#define RSHMEMI_POLL rshmemi_ld_acquire
#endif
    rshmem_u64 x = RSHMEMI_POLL(p);
    if (!rshmemi_cmp(x, cmp, v)) {
        // After a timeout on this PE, later waits give up at once: the kernel drains instead
        // of waiting a full timeout per wait; the host reports the error.
        if (rshmemi_failed()) return x;
        rshmem_u64 t0 = rshmemi_now();
        unsigned spins = 0;
        while (!rshmemi_cmp(x = RSHMEMI_POLL(p), cmp, v)) {
            if ((++spins & 1023) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout(pe);
                break;
            }
        }
    }
#undef RSHMEMI_POLL
#if RSHMEMI_WAIT_FENCE
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#endif
    return x;
}

// ----- bulk copies: `tid` of `nth` threads cooperate -----

#define RSHMEMI_COPY_W(T, d, s, n, tid, nth)                               \
    {                                                                     \
        T* dd = (T*)(d); const T* ss = (const T*)(s);                     \
        size_t_rshmem m = (n) / sizeof(T);                                \
        for (size_t_rshmem i = (tid); i < m; i += (nth)) dd[i] = ss[i];   \
        size_t_rshmem done = m * sizeof(T);                               \
        for (size_t_rshmem i = done + (tid); i < (n); i += (nth))         \
            ((char*)(d))[i] = ((const char*)(s))[i];                      \
    }

struct __align__(16) rshmemi_v4 { unsigned a, b, c, d; };

// 16-byte path: four loads in flight per thread before their stores (eight with
// RSHMEMI_COPY_UNROLL=8, a compile option measured by the benchmarks).
#ifndef RSHMEMI_COPY_UNROLL
#define RSHMEMI_COPY_UNROLL 4
#endif
__device__ __forceinline__ void rshmemi_copy16(rshmemi_v4* d, const rshmemi_v4* s, size_t_rshmem m,
                                               unsigned tid, unsigned nth) {
    size_t_rshmem i = tid;
#if RSHMEMI_COPY_UNROLL == 8
    for (; i + 7 * (size_t_rshmem)nth < m; i += 8 * (size_t_rshmem)nth) {
        rshmemi_v4 r[8];
#pragma unroll
        for (int k = 0; k < 8; k++) r[k] = s[i + k * nth];
#pragma unroll
        for (int k = 0; k < 8; k++) d[i + k * nth] = r[k];
    }
#endif
    for (; i + 3 * (size_t_rshmem)nth < m; i += 4 * (size_t_rshmem)nth) {
        rshmemi_v4 a = s[i], b = s[i + nth], c = s[i + 2 * nth], e = s[i + 3 * nth];
        d[i] = a; d[i + nth] = b; d[i + 2 * nth] = c; d[i + 3 * nth] = e;
    }
    for (; i < m; i += nth) d[i] = s[i];
}

__device__ __forceinline__ void rshmemi_copy(void* d, const void* s, size_t_rshmem n, unsigned tid, unsigned nth) {
    rshmem_u64 a = (rshmem_u64)d | (rshmem_u64)s;
    if ((a & 15) == 0 && n >= 16) {
        size_t_rshmem done = (n / 16) * 16;
        rshmemi_copy16((rshmemi_v4*)d, (const rshmemi_v4*)s, n / 16, tid, nth);
        if (done == n) return;
        d = (char*)d + done;
        s = (const char*)s + done;
        n -= done;
        a = (rshmem_u64)d | (rshmem_u64)s;  // still 16-aligned: the rest goes 8 bytes wide
    }
    if ((a & 7) == 0) RSHMEMI_COPY_W(rshmem_u64, d, s, n, tid, nth)
    else if ((a & 3) == 0) RSHMEMI_COPY_W(unsigned, d, s, n, tid, nth)
    else if ((a & 1) == 0) RSHMEMI_COPY_W(unsigned short, d, s, n, tid, nth)
    else RSHMEMI_COPY_W(unsigned char, d, s, n, tid, nth)
}

__device__ __forceinline__ unsigned rshmemi_tid() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
__device__ __forceinline__ unsigned rshmemi_nthreads() { return blockDim.x * blockDim.y * blockDim.z; }
// Lane and width of the calling warp (the last warp of a block may be partial).
__device__ __forceinline__ unsigned rshmemi_lane() { return rshmemi_tid() & 31; }
__device__ __forceinline__ unsigned rshmemi_warp_width() {
    unsigned first = rshmemi_tid() & ~31u, n = rshmemi_nthreads();
    return (n - first) < 32 ? (n - first) : 32;
}
__device__ __forceinline__ void rshmemi_syncwarp() {
    unsigned w = rshmemi_warp_width();
    __syncwarp(w == 32 ? 0xffffffffu : ((1u << w) - 1));
}

// ----- bulk copies by the tensor-memory accelerator (sm_90+) -----
// One thread of the block drives a ring of shared-memory stages: bulk loads (global → shared,
// completing on an mbarrier) and bulk stores (shared → global), two stores in flight. `d`, `s`
// and `n` must be multiples of 16. Every thread of the block calls; returns when the stores are
// complete. The stage count and size are compile options (RSHMEMI_BULK_STAGES ×
// RSHMEMI_BULK_CHUNK bytes of static shared memory, at most 48 KiB).
#ifndef RSHMEMI_BULK_STAGES
#define RSHMEMI_BULK_STAGES 4
#endif
#ifndef RSHMEMI_BULK_CHUNK
#define RSHMEMI_BULK_CHUNK 8192
#endif

__device__ __forceinline__ unsigned rshmemi_smem(const void* p) {
    unsigned a; asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p)); return a;
}

// Where stage chunk k of a block's copy starts in [0, n): piece 0, the block's range whole
// (chunk after chunk); else pieces of `piece` bytes (a multiple of RSHMEMI_BULK_CHUNK) first,
// first + step, first + 2·step, ... (blocks taking the pieces of one range in turn).
__device__ __forceinline__ size_t_rshmem rshmemi_bulk_off(size_t_rshmem k, size_t_rshmem piece, size_t_rshmem first,
                                                          size_t_rshmem step) {
    if (piece == 0) return k * RSHMEMI_BULK_CHUNK;
    const size_t_rshmem cpp = piece / RSHMEMI_BULK_CHUNK;
    return (first + (k / cpp) * step) * piece + (k % cpp) * RSHMEMI_BULK_CHUNK;
}

__device__ __forceinline__ void rshmemi_bulk_copy_pieces(void* d, const void* s, size_t_rshmem n, size_t_rshmem piece,
                                                         size_t_rshmem first, size_t_rshmem step) {
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(128) char buf[RSHMEMI_BULK_STAGES][RSHMEMI_BULK_CHUNK];
    __shared__ __align__(8) rshmem_u64 bar[RSHMEMI_BULK_STAGES];
    if (rshmemi_tid() == 0 && rshmemi_bulk_off(0, piece, first, step) < n) {
        for (int i = 0; i < RSHMEMI_BULK_STAGES; i++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(rshmemi_smem(&bar[i])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        #define RSHMEMI_BULK_LOAD(k)                                                                  \
        {                                                                                              \
            size_t_rshmem k_ = (k), off_ = rshmemi_bulk_off(k_, piece, first, step);                   \
            unsigned len_ = (unsigned)((n - off_) < RSHMEMI_BULK_CHUNK ? (n - off_) : RSHMEMI_BULK_CHUNK); \
            unsigned b_ = rshmemi_smem(&bar[k_ % RSHMEMI_BULK_STAGES]);                                \
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b_), "r"(len_) : "memory"); \
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" \
                         :: "r"(rshmemi_smem(buf[k_ % RSHMEMI_BULK_STAGES])), "l"((const char*)s + off_), \
                            "r"(len_), "r"(b_) : "memory");                                            \
        }
        for (size_t_rshmem k = 0; k < RSHMEMI_BULK_STAGES && rshmemi_bulk_off(k, piece, first, step) < n; k++)
            RSHMEMI_BULK_LOAD(k)
        for (size_t_rshmem k = 0;; k++) {
            const size_t_rshmem off = rshmemi_bulk_off(k, piece, first, step);
            if (off >= n) break;
            unsigned st = (unsigned)(k % RSHMEMI_BULK_STAGES), phase = (unsigned)((k / RSHMEMI_BULK_STAGES) & 1);
            unsigned ok = 0;
            do {
                asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                             : "=r"(ok) : "r"(rshmemi_smem(&bar[st])), "r"(phase) : "memory");
            } while (!ok);
            unsigned len = (unsigned)((n - off) < RSHMEMI_BULK_CHUNK ? (n - off) : RSHMEMI_BULK_CHUNK);
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                         :: "l"((char*)d + off), "r"(rshmemi_smem(buf[st])), "r"(len) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            if (k >= 1 && rshmemi_bulk_off(k - 1 + RSHMEMI_BULK_STAGES, piece, first, step) < n) {
                asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
                RSHMEMI_BULK_LOAD(k - 1 + RSHMEMI_BULK_STAGES)
            }
        }
        #undef RSHMEMI_BULK_LOAD
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        asm volatile("fence.proxy.async.global;" ::: "memory");
        for (int i = 0; i < RSHMEMI_BULK_STAGES; i++)
            asm volatile("mbarrier.inval.shared::cta.b64 [%0];" :: "r"(rshmemi_smem(&bar[i])) : "memory");
    }
    __syncthreads();
#else
    if (piece == 0) {
        rshmemi_copy(d, s, n, rshmemi_tid(), rshmemi_nthreads());
    } else {
        for (size_t_rshmem p = first; p * piece < n; p += step) {
            const size_t_rshmem len = (n - p * piece) < piece ? (n - p * piece) : piece;
            rshmemi_copy((char*)d + p * piece, (const char*)s + p * piece, len, rshmemi_tid(), rshmemi_nthreads());
        }
    }
    __syncthreads();
#endif
}

__device__ __forceinline__ void rshmemi_bulk_copy_block(void* d, const void* s, size_t_rshmem n) {
    rshmemi_bulk_copy_pieces(d, s, n, 0, 0, 1);
}

// ----- PEs on other nodes: requests to this PE's proxy thread -----
// A PE on another node has base 0 in the base table. Operations on it go to a ring of requests
// in mapped host memory that this PE's proxy thread drains, carrying each over the fabric (its
// data staged through host memory) until it is complete at the target; then it advances the
// ring's `done` counter. Layout (64-bit words; `backend/cuda/remote.rs`): `done` at
// RSHMEMI_RING_DONE, the error word (0, or 1 + the PE a failed request was for) at
// RSHMEMI_RING_ERR, entries of 8 words from RSHMEMI_RING_FIRST: tag (ticket + 1), op word (kind,
// bit 8 signal add, PE in the high half), dst, src, len, signal offset, signal value. The ring's
// address and the head (tickets issued) are words of this PE's error line.
#define RSHMEMI_RING_DONE 0
#define RSHMEMI_RING_ERR 8
#define RSHMEMI_RING_FIRST 16
#define RSHMEMI_RING_ENTRIES 256
#define RSHMEMI_RING_ERR_LINE_RING 2
#define RSHMEMI_RING_ERR_LINE_HEAD 3
#define RSHMEMI_OP_PUT 1
#define RSHMEMI_OP_PUT_SIGNAL 2
#define RSHMEMI_OP_SIGNAL 3
#define RSHMEMI_OP_GET 4
#define RSHMEMI_OP_PUT_INLINE 5
#define RSHMEMI_NO_TICKET 0xffffffffffffffffull

// Whether PE `pe` lies on another node (reached through the proxy, not by loads and stores).
__device__ __forceinline__ bool rshmemi_remote(int pe) { return rshmemi_base(pe) == 0; }
// Flags an operation the proxy does not carry, naming PE `pe` (the first named one is kept).
__device__ __forceinline__ void rshmemi_flag_remote_op(int pe) {
    atomicCAS((unsigned long long*)(rshmemi_err_word() + 1), 0ull, (unsigned long long)pe + 1);
    atomicOr((unsigned long long*)rshmemi_err_word(), RSHMEM_ERR_REMOTE_OP);
}
// This PE's ring (0 in a world on one node).
__device__ __forceinline__ rshmem_u64* rshmemi_ring() {
    return (rshmem_u64*)__ldg(rshmemi_err_word() + RSHMEMI_RING_ERR_LINE_RING);
}

// Waits until the proxy completed ticket `t`; false (flagged as a timeout naming the PE, which
// the host reports) when the proxy failed a request or the device timeout passed.
__device__ __forceinline__ bool rshmemi_proxy_wait(rshmem_u64 t, int pe) {
    rshmem_u64* r = rshmemi_ring();
    if (r == 0) return false;
    if (rshmemi_ld_acquire(r + RSHMEMI_RING_DONE) > t) return true;
    const rshmem_u64 t0 = rshmemi_now();
    unsigned spins = 0;
    while (rshmemi_ld_acquire(r + RSHMEMI_RING_DONE) <= t) {
        const rshmem_u64 e = rshmemi_ld_relaxed(r + RSHMEMI_RING_ERR);
        if (e != 0) { rshmemi_flag_timeout((int)(e - 1)); return false; }
        if (rshmemi_failed()) return false;
        if ((++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
            rshmemi_flag_timeout(pe);
            return false;
        }
#if __CUDA_ARCH__ >= 700
        __nanosleep(100);
#endif
    }
    return true;
}

// Posts one request (kind and signal bit in `op`); its ticket, or RSHMEMI_NO_TICKET when the
// ring failed or had no room within the timeout (flagged). What this thread wrote before (a
// put's source) is visible to the proxy's copy.
__device__ __forceinline__ rshmem_u64 rshmemi_proxy_post(rshmem_u64 op, int pe, rshmem_u64 dst, rshmem_u64 src,
                                                         rshmem_u64 len, rshmem_u64 sig_off, rshmem_u64 sig_val) {
    rshmem_u64* r = rshmemi_ring();
    if (r == 0 || rshmemi_failed()) {
        if (r == 0) rshmemi_flag_timeout(pe);
        return RSHMEMI_NO_TICKET;
    }
    asm volatile("fence.sc.sys;" ::: "memory");
    const rshmem_u64 t = atomicAdd((unsigned long long*)(rshmemi_err_word() + RSHMEMI_RING_ERR_LINE_HEAD), 1ull);
    if (t >= RSHMEMI_RING_ENTRIES && !rshmemi_proxy_wait(t - RSHMEMI_RING_ENTRIES, pe)) return RSHMEMI_NO_TICKET;
    volatile rshmem_u64* e = (volatile rshmem_u64*)(r + RSHMEMI_RING_FIRST + (t % RSHMEMI_RING_ENTRIES) * 8);
    e[1] = op | ((rshmem_u64)(unsigned)pe << 32);
    e[2] = dst;
    e[3] = src;
    e[4] = len;
    e[5] = sig_off;
    e[6] = sig_val;
    rshmemi_st_release((rshmem_u64*)e, t + 1);
    return t;
}

// The heap offset of this PE's symmetric address `p` (the same on every PE).
__device__ __forceinline__ rshmem_u64 rshmemi_offset(const void* p) { return (rshmem_u64)p - rshmem_dstate.my_base; }

// Thread-scope operations on a PE on another node; `wait`: return once complete at the target.
__device__ __forceinline__ void rshmemi_proxy_put(void* dest, const void* src, size_t_rshmem n, int pe, bool wait) {
    rshmem_u64 t = rshmemi_proxy_post(RSHMEMI_OP_PUT, pe, rshmemi_offset(dest), (rshmem_u64)src, n, 0, 0);
    if (wait && t != RSHMEMI_NO_TICKET) rshmemi_proxy_wait(t, pe);
}
__device__ __forceinline__ void rshmemi_proxy_get(void* dest, const void* src, size_t_rshmem n, int pe, bool wait) {
    rshmem_u64 t = rshmemi_proxy_post(RSHMEMI_OP_GET, pe, (rshmem_u64)dest, rshmemi_offset(src), n, 0, 0);
    if (wait && t != RSHMEMI_NO_TICKET) rshmemi_proxy_wait(t, pe);
}
// A put of `n` <= 8 bytes carried in the request itself (`bits`, little-endian): nothing for the
// proxy to copy out of the GPU, and the value is this thread's to reuse at once.
__device__ __forceinline__ void rshmemi_proxy_p(void* dest, rshmem_u64 bits, unsigned n, int pe) {
    rshmemi_proxy_post(RSHMEMI_OP_PUT_INLINE, pe, rshmemi_offset(dest), bits, n, 0, 0);
}
// The data, then the signal (set or add) once the data is in the target's GPU memory.
__device__ __forceinline__ void rshmemi_proxy_put_signal(void* dest, const void* src, size_t_rshmem n, rshmem_u64* sig,
                                                         rshmem_u64 value, int op, int pe, bool wait) {
    rshmem_u64 k = RSHMEMI_OP_PUT_SIGNAL | ((rshmem_u64)(op == RSHMEM_SIGNAL_ADD) << 8);
    rshmem_u64 t = rshmemi_proxy_post(k, pe, rshmemi_offset(dest), (rshmem_u64)src, n, rshmemi_offset(sig), value);
    if (wait && t != RSHMEMI_NO_TICKET) rshmemi_proxy_wait(t, pe);
}
// A signal update at heap offset `off` (the sync area after the heap included).
__device__ __forceinline__ void rshmemi_proxy_signal_at(rshmem_u64 off, rshmem_u64 value, int op, int pe) {
    rshmem_u64 k = RSHMEMI_OP_SIGNAL | ((rshmem_u64)(op == RSHMEM_SIGNAL_ADD) << 8);
    rshmemi_proxy_post(k, pe, 0, 0, 0, off, value);
}
// Every request this PE posted so far is complete.
__device__ __forceinline__ void rshmemi_proxy_quiet() {
    rshmem_u64* r = rshmemi_ring();
    if (r == 0) return;
    const rshmem_u64 h = *(volatile rshmem_u64*)(rshmemi_err_word() + RSHMEMI_RING_ERR_LINE_HEAD);
    if (h != 0) rshmemi_proxy_wait(h - 1, -1);
}

// Completes this thread's earlier puts: on NVLink stores are complete once ordered system-wide;
// requests to PEs on other nodes once the proxy has carried them out.
__device__ __forceinline__ void rshmem_quiet() {
    asm volatile("fence.sc.sys;" ::: "memory");
    rshmemi_proxy_quiet();
}

// ----- untyped put/get (bytes) -----
// Thread scope: the calling thread copies. Warp scope: every thread of the warp calls with the
// same arguments. Block scope: every thread of the block calls with the same arguments.
// Blocking and non-blocking forms are equal on NVLink (stores are issued before return);
// completion to the peer is ensured by rshmem_quiet or a barrier.

__device__ __forceinline__ void rshmem_putmem_nbi(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_put(dest, src, n, pe, false); return; }
    rshmemi_copy(rshmemi_ptr(dest, pe), src, n, 0, 1);
}
__device__ __forceinline__ void rshmem_putmem(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_put(dest, src, n, pe, true); return; }
    rshmem_putmem_nbi(dest, src, n, pe);
}
__device__ __forceinline__ void rshmem_getmem_nbi(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_get(dest, src, n, pe, false); return; }
    rshmemi_copy(dest, rshmemi_ptr(src, pe), n, 0, 1);
}
__device__ __forceinline__ void rshmem_getmem(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_get(dest, src, n, pe, true); return; }
    rshmem_getmem_nbi(dest, src, n, pe);
}
__device__ __forceinline__ void rshmem_putmem_nbi_warp(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_syncwarp(); if (rshmemi_lane() == 0) rshmemi_proxy_put(dest, src, n, pe, false); rshmemi_syncwarp(); return; }
    rshmemi_copy(rshmemi_ptr(dest, pe), src, n, rshmemi_lane(), rshmemi_warp_width());
    rshmemi_syncwarp();
}
__device__ __forceinline__ void rshmem_putmem_warp(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_syncwarp(); if (rshmemi_lane() == 0) rshmemi_proxy_put(dest, src, n, pe, true); rshmemi_syncwarp(); return; }
    rshmem_putmem_nbi_warp(dest, src, n, pe);
}
__device__ __forceinline__ void rshmem_getmem_nbi_warp(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_syncwarp(); if (rshmemi_lane() == 0) rshmemi_proxy_get(dest, src, n, pe, false); rshmemi_syncwarp(); return; }
    rshmemi_copy(dest, rshmemi_ptr(src, pe), n, rshmemi_lane(), rshmemi_warp_width());
    rshmemi_syncwarp();
}
__device__ __forceinline__ void rshmem_getmem_warp(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_syncwarp(); if (rshmemi_lane() == 0) rshmemi_proxy_get(dest, src, n, pe, true); rshmemi_syncwarp(); return; }
    rshmem_getmem_nbi_warp(dest, src, n, pe);
}
__device__ __forceinline__ void rshmem_putmem_nbi_block(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { __syncthreads(); if (rshmemi_tid() == 0) rshmemi_proxy_put(dest, src, n, pe, false); __syncthreads(); return; }
    rshmemi_copy(rshmemi_ptr(dest, pe), src, n, rshmemi_tid(), rshmemi_nthreads());
    __syncthreads();
}
__device__ __forceinline__ void rshmem_putmem_block(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { __syncthreads(); if (rshmemi_tid() == 0) rshmemi_proxy_put(dest, src, n, pe, true); __syncthreads(); return; }
    rshmem_putmem_nbi_block(dest, src, n, pe);
}
__device__ __forceinline__ void rshmem_getmem_nbi_block(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { __syncthreads(); if (rshmemi_tid() == 0) rshmemi_proxy_get(dest, src, n, pe, false); __syncthreads(); return; }
    rshmemi_copy(dest, rshmemi_ptr(src, pe), n, rshmemi_tid(), rshmemi_nthreads());
    __syncthreads();
}
__device__ __forceinline__ void rshmem_getmem_block(void* dest, const void* src, size_t_rshmem n, int pe) {
    if (rshmemi_remote(pe)) { __syncthreads(); if (rshmemi_tid() == 0) rshmemi_proxy_get(dest, src, n, pe, true); __syncthreads(); return; }
    rshmem_getmem_nbi_block(dest, src, n, pe);
}

// ----- signals -----

// Updates PE `pe`'s signal word `sig` (set or add) with release semantics: whoever sees the
// new value also sees everything this thread wrote before.
// Signal store (a compile option, measured by the benchmarks): 0 release store/reduction;
// 1 fence.acq_rel.sys then relaxed; 2 fence.sc.sys then relaxed.
#ifndef RSHMEMI_SIGNAL_MODE
#define RSHMEMI_SIGNAL_MODE 0
#endif
__device__ __forceinline__ void rshmem_signal_op(rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_signal_at(rshmemi_offset(sig), value, op, pe); return; }
    rshmem_u64* r = (rshmem_u64*)rshmemi_ptr(sig, pe);
#if RSHMEMI_SIGNAL_MODE == 0
    if (op == RSHMEM_SIGNAL_ADD) rshmemi_red_add_release(r, value);
    else rshmemi_st_release(r, value);
#else
#if RSHMEMI_SIGNAL_MODE == 1
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
    asm volatile("fence.sc.sys;" ::: "memory");
#endif
    if (op == RSHMEM_SIGNAL_ADD)
        asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" :: "l"(r), "l"(value) : "memory");
    else
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(r), "l"(value) : "memory");
#endif
}
// As rshmem_signal_op after a warp or block barrier: a full system fence first makes the
// writes of every thread that met at the barrier visible before the signal.
__device__ __forceinline__ void rshmemi_signal_op_collective(rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    asm volatile("fence.sc.sys;" ::: "memory");
    rshmem_signal_op(sig, value, op, pe);
}
__device__ __forceinline__ rshmem_u64 rshmem_signal_fetch(const rshmem_u64* sig) {
    return rshmemi_ld_acquire(sig);
}
// Waits until this PE's `sig` compares true against `value`; returns the value seen.
__device__ __forceinline__ rshmem_u64 rshmem_signal_wait_until(const rshmem_u64* sig, int cmp, rshmem_u64 value) {
    return rshmemi_wait64(sig, cmp, value);
}
__device__ __forceinline__ void rshmem_putmem_signal(void* dest, const void* src, size_t_rshmem n,
                                                     rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_put_signal(dest, src, n, sig, value, op, pe, true); return; }
    rshmem_putmem(dest, src, n, pe);
    rshmem_signal_op(sig, value, op, pe);
}
__device__ __forceinline__ void rshmem_putmem_signal_nbi(void* dest, const void* src, size_t_rshmem n,
                                                         rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_proxy_put_signal(dest, src, n, sig, value, op, pe, false); return; }
    rshmem_putmem_signal(dest, src, n, sig, value, op, pe);
}
__device__ __forceinline__ void rshmem_putmem_signal_warp(void* dest, const void* src, size_t_rshmem n,
                                                          rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    if (rshmemi_remote(pe)) {
        rshmemi_syncwarp();
        if (rshmemi_lane() == 0) rshmemi_proxy_put_signal(dest, src, n, sig, value, op, pe, true);
        rshmemi_syncwarp();
        return;
    }
    rshmem_putmem_nbi_warp(dest, src, n, pe);
    if (rshmemi_lane() == 0) rshmemi_signal_op_collective(sig, value, op, pe);
    rshmemi_syncwarp();
}
__device__ __forceinline__ void rshmem_putmem_signal_block(void* dest, const void* src, size_t_rshmem n,
                                                           rshmem_u64* sig, rshmem_u64 value, int op, int pe) {
    if (rshmemi_remote(pe)) {
        __syncthreads();
        if (rshmemi_tid() == 0) rshmemi_proxy_put_signal(dest, src, n, sig, value, op, pe, true);
        __syncthreads();
        return;
    }
    rshmem_putmem_nbi_block(dest, src, n, pe);
    if (rshmemi_tid() == 0) rshmemi_signal_op_collective(sig, value, op, pe);
    __syncthreads();
}

// ----- put-with-signal, the flag in the data (small messages) -----
// A message of `n` bytes (a multiple of 8, at most RSHMEM_LL_MAX_BYTES) travels as n / 8 lines
// of 16 bytes {data lo, flag, data hi, flag}, each written by one 16-byte store and read by one
// 16-byte load, so a line that carries the flag carries its data: the receiver sees data and
// signal together after one one-way trip, with no fence and no separate flag store. `area`: a
// symmetric buffer of rshmem_ll_area_bytes(n) bytes, 16-byte aligned, written by one sender at
// a time; `flag`: non-zero and different from the area's previous message's (a sequence
// number 1, 2, ...). The sender must not reuse the area before the receiver has read the
// message (e.g. wait for its reply).
#define RSHMEM_LL_MAX_BYTES 4096
__host__ __device__ __forceinline__ size_t_rshmem rshmem_ll_area_bytes(size_t_rshmem n) { return 2 * n; }
__device__ __forceinline__ void rshmemi_ll_line_store(void* p, rshmem_u64 v, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"((unsigned)v), "r"(flag),
                 "r"((unsigned)(v >> 32)), "r"(flag) : "memory");
}
// Lines each thread keeps in flight: its next RSHMEMI_LL_BATCH lines' sources are loaded (put) or
// the lines themselves polled (wait) before any is stored or compared, so a message costs a few
// load latencies, not one per line.
#define RSHMEMI_LL_BATCH 8
// Thread `tid` of `nth` puts its share of the lines of `src` (`n` bytes, 8-byte aligned) into
// PE `pe`'s `area` with `flag`.
__device__ __forceinline__ void rshmemi_putmem_signal_ll(void* area, const void* src, size_t_rshmem n, unsigned flag,
                                                         int pe, unsigned tid, unsigned nth) {
    char* r = (char*)rshmemi_ptr(area, pe);
    const rshmem_u64* s = (const rshmem_u64*)src;
    const size_t_rshmem nl = n / 8;
    for (size_t_rshmem l0 = tid; l0 < nl; l0 += (size_t_rshmem)nth * RSHMEMI_LL_BATCH) {
        rshmem_u64 v[RSHMEMI_LL_BATCH];
#pragma unroll
        for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
            if (l0 + q * nth < nl) v[q] = s[l0 + q * nth];
#pragma unroll
        for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
            if (l0 + q * nth < nl) rshmemi_ll_line_store(r + 16 * (l0 + q * nth), v[q], flag);
    }
}
// Thread `tid` of `nth` waits for its share of the lines of this PE's `area` to carry `flag`
// and copies their data to `dst`; false when the wait timed out (the host reports it).
__device__ __forceinline__ bool rshmemi_signal_wait_ll(const void* area, void* dst, size_t_rshmem n, unsigned flag,
                                                       unsigned tid, unsigned nth) {
    const size_t_rshmem nl = n / 8;
    for (size_t_rshmem l0 = tid; l0 < nl; l0 += (size_t_rshmem)nth * RSHMEMI_LL_BATCH) {
        unsigned todo = 0;  // bit q: line l0 + q * nth still to come
#pragma unroll
        for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
            if (l0 + q * nth < nl) todo |= 1u << q;
        rshmem_u64 v[RSHMEMI_LL_BATCH];
        rshmem_u64 t0 = 0;
        unsigned spins = 0;
        for (bool first = true;; first = false) {
            unsigned a[RSHMEMI_LL_BATCH], f1[RSHMEMI_LL_BATCH], b[RSHMEMI_LL_BATCH], f2[RSHMEMI_LL_BATCH];
            // Every missing line loaded before any is looked at.
#pragma unroll
            for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
                if (todo >> q & 1)
                    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(a[q]), "=r"(f1[q]), "=r"(b[q]), "=r"(f2[q])
                                 : "l"((const char*)area + 16 * (l0 + q * nth))
                                 : "memory");
#pragma unroll
            for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
                if ((todo >> q & 1) && f1[q] == flag && f2[q] == flag) {
                    v[q] = (rshmem_u64)a[q] | ((rshmem_u64)b[q] << 32);
                    todo &= ~(1u << q);
                }
            if (!todo) break;
            if (first) {
                // After a timeout on this PE, later waits give up at once.
                if (rshmemi_failed()) return false;
                t0 = rshmemi_now();
            } else if ((++spins & 1023) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout();
                return false;
            }
        }
#pragma unroll
        for (int q = 0; q < RSHMEMI_LL_BATCH; q++)
            if (l0 + q * nth < nl) ((rshmem_u64*)dst)[l0 + q * nth] = v[q];
    }
    return true;
}
// One thread puts the whole message. The line protocol is stores into the peer's heap, so a PE
// on another node is refused: flagged (RSHMEM_ERR_REMOTE_OP), nothing stored.
__device__ __forceinline__ void rshmem_putmem_signal_ll(void* area, const void* src, size_t_rshmem n, unsigned flag, int pe) {
    if (rshmemi_remote(pe)) { rshmemi_flag_remote_op(pe); return; }
    rshmemi_putmem_signal_ll(area, src, n, flag, pe, 0, 1);
}
// The calling warp (all 32 lanes) puts the message, a line per lane at a time (refused alike).
__device__ __forceinline__ void rshmem_putmem_signal_ll_warp(void* area, const void* src, size_t_rshmem n, unsigned flag,
                                                             int pe) {
    if (rshmemi_remote(pe)) { if (rshmemi_lane() == 0) rshmemi_flag_remote_op(pe); return; }
    rshmemi_putmem_signal_ll(area, src, n, flag, pe, rshmemi_lane(), 32);
}
// One thread waits for the message in this PE's `area` and copies it to `dst`; false on a
// timeout.
__device__ __forceinline__ bool rshmem_signal_wait_ll(const void* area, void* dst, size_t_rshmem n, unsigned flag) {
    return rshmemi_signal_wait_ll(area, dst, n, flag, 0, 1);
}
// The calling warp (all 32 lanes) waits for the message and copies it to `dst`; the data is in
// `dst` for every lane when it returns (true), false on a timeout (in every lane).
__device__ __forceinline__ bool rshmem_signal_wait_ll_warp(const void* area, void* dst, size_t_rshmem n, unsigned flag) {
    const bool ok = rshmemi_signal_wait_ll(area, dst, n, flag, rshmemi_lane(), 32);
    __syncwarp();  // every lane's copies visible to the warp
    return __all_sync(0xffffffffu, ok);
}

// ----- typed one-sided operations: one list of types, every form generated -----

#define RSHMEM_FOR_EACH_TYPE(X)                                         \
    X(int8, signed char) X(int16, short) X(int32, int) X(int64, long long) \
    X(uint8, unsigned char) X(uint16, unsigned short) X(uint32, unsigned int) \
    X(uint64, unsigned long long) X(half, rshmem_half) X(bfloat16, rshmem_bfloat16) \
    X(float, float) X(double, double)

// Single-element volatile store/load through an integer of the same size (works for the 16-bit
// storage types too).
template <typename T, int N> struct rshmemi_bits;
template <typename T> struct rshmemi_bits<T, 1> { typedef unsigned char U; };
template <typename T> struct rshmemi_bits<T, 2> { typedef unsigned short U; };
template <typename T> struct rshmemi_bits<T, 4> { typedef unsigned int U; };
template <typename T> struct rshmemi_bits<T, 8> { typedef unsigned long long U; };
template <typename T> __device__ __forceinline__ void rshmemi_vst(T* p, T v) {
    typedef typename rshmemi_bits<T, sizeof(T)>::U U;
    *(volatile U*)p = *(U*)&v;
}
template <typename T> __device__ __forceinline__ T rshmemi_vld(const T* p) {
    typedef typename rshmemi_bits<T, sizeof(T)>::U U;
    U u = *(const volatile U*)p;
    return *(T*)&u;
}

#define RSHMEMI_TYPED(NAME, T)                                                                     \
    __device__ __forceinline__ void rshmem_##NAME##_put(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem(d, s, n * sizeof(T), pe); }                                                     \
    __device__ __forceinline__ void rshmem_##NAME##_put_nbi(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem_nbi(d, s, n * sizeof(T), pe); }                                                 \
    __device__ __forceinline__ void rshmem_##NAME##_put_warp(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem_warp(d, s, n * sizeof(T), pe); }                                                \
    __device__ __forceinline__ void rshmem_##NAME##_put_nbi_warp(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem_nbi_warp(d, s, n * sizeof(T), pe); }                                            \
    __device__ __forceinline__ void rshmem_##NAME##_put_block(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem_block(d, s, n * sizeof(T), pe); }                                               \
    __device__ __forceinline__ void rshmem_##NAME##_put_nbi_block(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_putmem_nbi_block(d, s, n * sizeof(T), pe); }                                           \
    __device__ __forceinline__ void rshmem_##NAME##_get(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem(d, s, n * sizeof(T), pe); }                                                     \
    __device__ __forceinline__ void rshmem_##NAME##_get_nbi(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem_nbi(d, s, n * sizeof(T), pe); }                                                 \
    __device__ __forceinline__ void rshmem_##NAME##_get_warp(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem_warp(d, s, n * sizeof(T), pe); }                                                \
    __device__ __forceinline__ void rshmem_##NAME##_get_nbi_warp(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem_nbi_warp(d, s, n * sizeof(T), pe); }                                            \
    __device__ __forceinline__ void rshmem_##NAME##_get_block(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem_block(d, s, n * sizeof(T), pe); }                                               \
    __device__ __forceinline__ void rshmem_##NAME##_get_nbi_block(T* d, const T* s, size_t_rshmem n, int pe) \
    { rshmem_getmem_nbi_block(d, s, n * sizeof(T), pe); }                                           \
    __device__ __forceinline__ void rshmem_##NAME##_p(T* d, T v, int pe)                            \
    {                                                                                                \
        if (rshmemi_remote(pe)) {                                                                    \
            typedef typename rshmemi_bits<T, sizeof(T)>::U U;                                        \
            rshmemi_proxy_p(d, (rshmem_u64)*(U*)&v, sizeof(T), pe);                                  \
            return;                                                                                  \
        }                                                                                            \
        rshmemi_vst((T*)rshmemi_ptr(d, pe), v);                                                       \
    }                                                                                                \
    __device__ __forceinline__ T rshmem_##NAME##_g(const T* s, int pe)                              \
    {                                                                                                \
        if (rshmemi_remote(pe)) {                                                                    \
            rshmemi_flag_remote_op(pe);                                                              \
            T zero{};                                                                                \
            return zero;                                                                             \
        }                                                                                            \
        return rshmemi_vld((const T*)rshmemi_ptr(s, pe));                                             \
    }                                                                                                \
    __device__ __forceinline__ void rshmem_##NAME##_put_signal(T* d, const T* s, size_t_rshmem n,   \
        rshmem_u64* sig, rshmem_u64 value, int op, int pe)                                          \
    { rshmem_putmem_signal(d, s, n * sizeof(T), sig, value, op, pe); }                              \
    __device__ __forceinline__ void rshmem_##NAME##_put_signal_warp(T* d, const T* s, size_t_rshmem n, \
        rshmem_u64* sig, rshmem_u64 value, int op, int pe)                                          \
    { rshmem_putmem_signal_warp(d, s, n * sizeof(T), sig, value, op, pe); }                         \
    __device__ __forceinline__ void rshmem_##NAME##_put_signal_block(T* d, const T* s, size_t_rshmem n, \
        rshmem_u64* sig, rshmem_u64 value, int op, int pe)                                          \
    { rshmem_putmem_signal_block(d, s, n * sizeof(T), sig, value, op, pe); }

RSHMEM_FOR_EACH_TYPE(RSHMEMI_TYPED)

// ----- atomics (32- and 64-bit, system scope, on a peer's copy) -----
// U is the unsigned type of the same width the hardware operation works on.

#define RSHMEM_FOR_EACH_AMO_TYPE(X) \
    X(int32, int, unsigned int) X(uint32, unsigned int, unsigned int) \
    X(int64, long long, unsigned long long) X(uint64, unsigned long long, unsigned long long)

// A PE on another node: flagged (RSHMEM_ERR_REMOTE_OP), nothing touched, 0 returned.
#define RSHMEMI_LOCAL_ONLY(pe, ret) if (rshmemi_remote(pe)) { rshmemi_flag_remote_op(pe); return ret; }

#define RSHMEMI_AMO(NAME, T, U)                                                                     \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_fetch_add(T* d, T v, int pe)                \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicAdd_system((U*)rshmemi_ptr(d, pe), (U)v); }       \
    __device__ __forceinline__ void rshmem_##NAME##_atomic_add(T* d, T v, int pe)                   \
    { RSHMEMI_LOCAL_ONLY(pe, ) atomicAdd_system((U*)rshmemi_ptr(d, pe), (U)v); }                     \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_swap(T* d, T v, int pe)                     \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicExch_system((U*)rshmemi_ptr(d, pe), (U)v); }      \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_compare_swap(T* d, T cond, T v, int pe)     \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicCAS_system((U*)rshmemi_ptr(d, pe), (U)cond, (U)v); } \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_fetch_and(T* d, T v, int pe)                \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicAnd_system((U*)rshmemi_ptr(d, pe), (U)v); }       \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_fetch_or(T* d, T v, int pe)                 \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicOr_system((U*)rshmemi_ptr(d, pe), (U)v); }        \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_fetch_xor(T* d, T v, int pe)                \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicXor_system((U*)rshmemi_ptr(d, pe), (U)v); }       \
    __device__ __forceinline__ T rshmem_##NAME##_atomic_fetch(const T* d, int pe)                   \
    { RSHMEMI_LOCAL_ONLY(pe, (T)0) return (T)atomicOr_system((U*)rshmemi_ptr(d, pe), (U)0); }        \
    __device__ __forceinline__ void rshmem_##NAME##_atomic_set(T* d, T v, int pe)                   \
    { RSHMEMI_LOCAL_ONLY(pe, ) atomicExch_system((U*)rshmemi_ptr(d, pe), (U)v); }

RSHMEM_FOR_EACH_AMO_TYPE(RSHMEMI_AMO)

// ----- barriers (block scope: every thread of one block per PE calls) -----

// Synchronises the members of `team`: each member adds one to every member's counter for it,
// then waits until its own counters reach the number of barriers it did with each member.
// A team whose slot or members lie outside the job, or that this PE is not a member of (a
// hand-made `rshmem_team`), touches nothing: it flags RSHMEM_ERR_BAD_TEAM, which the host
// reports. (A non-member's arrival would count in the members' counters for it and let a later
// barrier of a team in that slot pass early, without an error.)
// rshmemi_team_ok: the team's slot and members lie inside the job and `me` is a member.
__device__ __forceinline__ bool rshmemi_team_ok(const rshmem_team& team, int me, int n) {
    if (team.slot < 0 || team.slot >= rshmem_dstate.team_slots || team.size < 1 || team.start < 0 ||
        (team.size > 1 && team.stride < 1))
        return false;
    const int d = me - team.start;  // no overflow: both lie in 0..INT_MAX
    if (team.size == 1) return d == 0 && team.start < n;
    const long long last = (long long)team.start + ((long long)team.size - 1) * team.stride;
    return last < n && d >= 0 && d % team.stride == 0 && d / team.stride < team.size;
}
// How a barrier publishes what the block wrote before it (a compile option, measured by the
// benchmarks): 0 (default) the release arrivals alone, which are cumulative over the block's
// writes ordered before them by __syncthreads (message passing needs no more: waits poll the
// monotonic counters with acquire loads); 1 a full sequentially consistent system fence by one
// thread first, which makes the device barrier slower.
#ifndef RSHMEMI_SYNC_FENCE
#define RSHMEMI_SYNC_FENCE 0
#endif
__device__ __forceinline__ void rshmem_team_sync_block(rshmem_team team) {
    __syncthreads();
    const int me = rshmem_dstate.my_pe, n = rshmem_dstate.n_pes;
    if (!rshmemi_team_ok(team, me, n)) {
        if (rshmemi_tid() == 0) atomicOr((unsigned long long*)rshmemi_err_word(), RSHMEM_ERR_BAD_TEAM);
        __syncthreads();
        return;
    }
    rshmem_u64* mine = rshmemi_my_sync();
    const rshmem_u64 row = (rshmem_u64)team.slot * (rshmem_u64)n;
    const rshmem_u64 bar = rshmem_dstate.sync_bar + row, exp_at = rshmem_dstate.sync_exp + row;
#if RSHMEMI_SYNC_FENCE
    if (rshmemi_tid() == 0) asm volatile("fence.sc.sys;" ::: "memory");
    __syncthreads();
#endif
    for (int i = rshmemi_tid(); i < team.size; i += rshmemi_nthreads()) {
        int pe = team.start + i * team.stride;
        if (rshmemi_remote(pe)) {
            // After this block's earlier proxied requests (the ring is carried out in order).
            // A set of the pair's count, not an add: the target's proxy writes a set with a
            // stream memory operation, while an add needs a kernel there, which a grid waiting
            // on the GPU could keep from running. The pair syncs as often as each expects of
            // the other, so this PE's arrivals at `pe` number its expectation of `pe` plus one
            // (the same thread updates that expectation below).
            const rshmem_u64 e = mine[exp_at + pe] + 1;
            rshmemi_proxy_signal_at(rshmem_dstate.heap_size + (bar + me) * 8, e, RSHMEM_SIGNAL_SET, pe);
        } else {
            rshmemi_red_add_release(rshmemi_sync(pe) + bar + me, 1);
        }
    }
    for (int i = rshmemi_tid(); i < team.size; i += rshmemi_nthreads()) {
        int pe = team.start + i * team.stride;
        rshmem_u64* exp = mine + exp_at + pe;
        rshmem_u64 e = *exp + 1;
        *exp = e;
        rshmemi_wait64(mine + bar + pe, RSHMEM_CMP_GE, e, pe);
    }
    __syncthreads();
}
// Barrier: completes this block's earlier puts (quiet), then synchronises the team.
__device__ __forceinline__ void rshmem_team_barrier_block(rshmem_team team) {
    rshmem_quiet();
    rshmem_team_sync_block(team);
}
__device__ __forceinline__ void rshmem_barrier_all_block() { rshmem_team_barrier_block(rshmem_team_world()); }
__device__ __forceinline__ void rshmem_sync_all_block() { rshmem_team_sync_block(rshmem_team_world()); }

#endif // RSHMEM_DEVICE_CUH
