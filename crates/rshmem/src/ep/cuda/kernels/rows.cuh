// ----- vector machinery of the grid kernels -----
// Rows move as 16-byte vectors when the hidden row size is a multiple of 16 bytes and the
// pointers involved are 16-byte aligned (scalar fallback otherwise). A warp takes a chunk of
// 32 * U vectors of a row: every lane first issues its U independent loads (U vectors in flight
// per lane), then stores or accumulates them, so the memory system sees many requests per warp.
#ifndef EP_U
#define EP_U 8   // copies: vectors per lane per chunk
#endif
// ep_send: at most this many vectors per lane per chunk, chunks of equal size, and the stores of
// a chunk to the peers before the one to this PE (EP_SEND_PEERS_FIRST 0: ascending PEs): 6 and
// peers first dispatch a little faster than other chunk sizes or ascending PEs (BENCHMARKS.md).
#ifndef EP_SEND_U
#define EP_SEND_U 6
#endif
#ifndef EP_SEND_PEERS_FIRST
#define EP_SEND_PEERS_FIRST 1
#endif
// EP_SEND_SKIP_SELF 1 (measurements only: this PE's own rows are not written): what the copy of
// a PE's own rows costs ep_send.
#ifndef EP_SEND_SKIP_SELF
#define EP_SEND_SKIP_SELF 0
#endif
#define EP_UR 4  // reductions: vectors per lane per chunk (two rows' loads in flight: 8)
__device__ __forceinline__ rshmemi_v4 ep_ldnc(const rshmemi_v4* p) {
    rshmemi_v4 v;
    asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p));
    return v;
}
// Loads vectors v0 + 32*q (q < U, below nv) of `row` into r.
template <int U>
__device__ __forceinline__ void ep_load(rshmemi_v4 (&r)[U], const rshmemi_v4* row, int v0, int nv, bool nc) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) r[q] = nc ? ep_ldnc(row + v) : row[v];
    }
}
template <int U>
__device__ __forceinline__ void ep_store(rshmemi_v4* row, const rshmemi_v4 (&r)[U], int v0, int nv) {
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) row[v] = r[q];
    }
}
__device__ __forceinline__ bool ep_al16(unsigned long long a) { return (a & 15) == 0; }
// The scalar fallback (rows of a size or alignment the vector path does not take), kept out of
// line so it does not add to the vector path's registers.
__device__ __noinline__ void ep_copy_row(void* d, const void* s, long long bytes, unsigned lane) {
    rshmemi_copy(d, s, (size_t_rshmem)bytes, lane, 32);
}

// ----- the sentinel: rows that announce themselves -----
// The expert-major dispatch's receive area and the split combine's combine area hold the
// sentinel (every 32-bit word all ones) where no row is (see ep_pstream and ep_csplit); their
// senders never store an all-ones element (ep_canon), and an element is written at once, so a
// reader that finds no sentinel in a vector has the sender's whole vector. The split combine's
// summers check 32-bit words (their senders store whole vectors), the dispatch's readers
// elements (a sender off 16-byte alignment stores single elements).
#define EP_SENTINEL 0xffffffffu
// word w with no all-ones element (16-bit types: per half; an all-ones element is a NaN, and
// clearing its sign bit keeps it one).
__device__ __forceinline__ unsigned ep_canon(unsigned w) {
    if (sizeof(ep_t) == 2) {
        if ((w & 0xffffu) == 0xffffu) w &= ~0x8000u;
        if ((w >> 16) == 0xffffu) w &= ~0x80000000u;
    } else if (w == EP_SENTINEL) {
        w = 0x7fffffffu;
    }
    return w;
}
__device__ __forceinline__ rshmemi_v4 ep_canon4(rshmemi_v4 w) {
    w.a = ep_canon(w.a);
    w.b = ep_canon(w.b);
    w.c = ep_canon(w.c);
    w.d = ep_canon(w.d);
    return w;
}
// Mutations for tests only. EP_SPLIT_KEEP: bit 0, ep_csplit's summers leave the peers' rows as
// they found them; bit 1, so do ep_crecv and ep_ccopy. EP_DISPATCH_KEEP 1: ep_pstream leaves
// the received rows as it found them; EP_DISPATCH_WAIT 0: it takes them without waiting for
// them; EP_DISPATCH_REFILL 0: a dispatch that moves no row does not restore the sentinel.
#ifndef EP_SPLIT_KEEP
#define EP_SPLIT_KEEP 0
#endif
#ifndef EP_DISPATCH_KEEP
#define EP_DISPATCH_KEEP 0
#endif
#ifndef EP_DISPATCH_WAIT
#define EP_DISPATCH_WAIT 1
#endif
#ifndef EP_DISPATCH_REFILL
#define EP_DISPATCH_REFILL 1
#endif
template <int S> struct ep_bits_of;
template <> struct ep_bits_of<2> { typedef unsigned short t; };
template <> struct ep_bits_of<4> { typedef unsigned t; };
typedef ep_bits_of<sizeof(ep_t)>::t ep_bits;
// Stores the sentinel into vectors v0 + 32 q (below nv) of `row`.
template <int U>
__device__ __forceinline__ void ep_put_sentinel(rshmemi_v4* row, int v0, int nv) {
    const rshmemi_v4 snt = {EP_SENTINEL, EP_SENTINEL, EP_SENTINEL, EP_SENTINEL};
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) row[v] = snt;
    }
}

__device__ __forceinline__ rshmemi_v4 ep_ldvol(const rshmemi_v4* p) {
    rshmemi_v4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bool ep_has_sentinel(const rshmemi_v4& v) {
    return v.a == EP_SENTINEL || v.b == EP_SENTINEL || v.c == EP_SENTINEL || v.d == EP_SENTINEL;
}
// Whether an element of v is the sentinel (16-bit types: a half all ones): for rows whose
// senders may store single elements (the dispatch's).
__device__ __forceinline__ bool ep_word_has_snt(unsigned w) {
    return sizeof(ep_t) == 2 ? ((w & 0xffffu) == 0xffffu || (w >> 16) == 0xffffu) : w == EP_SENTINEL;
}
__device__ __forceinline__ bool ep_has_snt_elem(const rshmemi_v4& v) {
    return ep_word_has_snt(v.a) || ep_word_has_snt(v.b) || ep_word_has_snt(v.c) || ep_word_has_snt(v.d);
}
// The split combine's summers' wait: vectors v0 + 32 q (below nv) of a peer's row, loaded until
// none holds the sentinel, then, with `back`, the sentinel stored back. A timeout flags the PE
// (`pe`) and gives up (the step is reported failed; after a failure on this PE later waits give
// up at once).
template <int U>
__device__ __forceinline__ void ep_take_row(rshmemi_v4 (&r)[U], rshmemi_v4* row, int v0, int nv, int pe, bool back) {
    unsigned miss = 0;
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) {
            r[q] = ep_ldvol(row + v);
            if (ep_has_sentinel(r[q])) miss |= 1u << q;
        }
    }
    if (miss && !rshmemi_failed()) {
        const rshmem_u64 t0 = rshmemi_now();
        unsigned spins = 0;
        while (miss) {
#pragma unroll
            for (int q = 0; q < U; q++)
                if (miss & (1u << q)) {
                    r[q] = ep_ldvol(row + v0 + 32 * q);
                    if (!ep_has_sentinel(r[q])) miss &= ~(1u << q);
                }
            if (miss && (++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout(pe);
                break;
            }
        }
    }
    if (back) ep_put_sentinel<U>(row, v0, nv);
}
// One thread waits, a load about every 0.1 us, until vector v of `row` has no sentinel element
// (a timeout flags the PE `pe`).
__device__ __forceinline__ void ep_sleep_until_vec(const rshmemi_v4* row, int v, int pe) {
    const rshmem_u64 t0 = rshmemi_now();
    while (ep_has_snt_elem(ep_ldvol(row + v))) {
        __nanosleep(100);
        if (rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
            rshmemi_flag_timeout(pe);
            break;
        }
    }
}
// The dispatch readers' slow path (kept out of line: the fast path's registers): lane 0 waits
// for vector `last` (the chunk's last, about the last to arrive), then every lane until none of
// its vectors v0 + 32 q (q < U, below nv) has a sentinel element: a few polling loads instead of
// whole chunks polled (readers polling whole chunks take the memory system from the rows
// themselves, and the dispatch gets much slower).
__device__ __noinline__ void ep_wait_chunk(const rshmemi_v4* row, int v0, int nv, int U, int last, int pe, unsigned lane) {
    if (lane == 0 && !rshmemi_failed() && ep_has_snt_elem(ep_ldvol(row + last))) ep_sleep_until_vec(row, last, pe);
    __syncwarp();
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv && !rshmemi_failed()) ep_sleep_until_vec(row, v, pe);
    }
    __syncwarp();
}
// A dispatch reader's take of a chunk of a peer's row (the whole warp): the vectors v0 + 32 q
// (below nv) loaded once; where any lane found a sentinel element, the warp waits
// (ep_wait_chunk, `last`: the chunk's last vector) and loads them again; with `back` the
// sentinel is stored back.
template <int U>
__device__ __forceinline__ void ep_take_chunk(rshmemi_v4 (&r)[U], rshmemi_v4* row, int v0, int nv, int last, int pe,
                                              bool back, unsigned lane) {
    bool miss = false;
#pragma unroll
    for (int q = 0; q < U; q++) {
        const int v = v0 + 32 * q;
        if (v < nv) {
            r[q] = ep_ldvol(row + v);
            miss |= ep_has_snt_elem(r[q]);
        }
    }
    if (EP_DISPATCH_WAIT && __any_sync(0xffffffffu, miss)) {
        ep_wait_chunk(row, v0, nv, U, last, pe, lane);
#pragma unroll
        for (int q = 0; q < U; q++) {
            const int v = v0 + 32 * q;
            if (v < nv) r[q] = ep_ldvol(row + v);
        }
    }
    if (back) ep_put_sentinel<U>(row, v0, nv);
}
// One element of a peer's row (the scalar path), as ep_take_row: its bits.
__device__ __forceinline__ ep_bits ep_take_bits(ep_t* p, int pe, bool back, bool wait = true) {
    const ep_bits snt = (ep_bits)EP_SENTINEL;
    volatile ep_bits* q = (volatile ep_bits*)p;
    ep_bits b = *q;
    if (wait && b == snt && !rshmemi_failed()) {
        const rshmem_u64 t0 = rshmemi_now();
        unsigned spins = 0;
        while ((b = *q) == snt)
            if ((++spins & 255) == 0 && rshmemi_now() - t0 > rshmem_dstate.timeout_ns) {
                rshmemi_flag_timeout(pe);
                break;
            }
    }
    if (back) *q = snt;
    return b;
}
__device__ __forceinline__ float ep_take_elem(ep_t* p, int pe) {
    ep_t v;
    *(ep_bits*)&v = ep_take_bits(p, pe, !(EP_SPLIT_KEEP & 1));
    return ep_f(v);
}
// An element's bits with no all-ones element (ep_canon, for one element).
__device__ __forceinline__ ep_bits ep_canon_bits(ep_bits b) {
    return b == (ep_bits)EP_SENTINEL ? (ep_bits)(b & (ep_bits)~(1u << (8 * sizeof(ep_t) - 1))) : b;
}

// Row records in (expert-major buffers: ep_params.prog, n * grid words per PE, word source *
// grid + block, zeroed by the receiver's ep_layout before its ready signal): once the row
// records of ep_layout's block b's tokens are written, ep_send tells each destination with one
// release, 1 << 63 | hi << 32 | lo: the block's positions there are lo..hi-1. The rows
// themselves announce their arrival (the sentinel): nothing is published or fenced per row.
__device__ __forceinline__ rshmem_u64 ep_records_in_word(long long hi, long long lo) {
    return (1ull << 63) | ((rshmem_u64)hi << 32) | (rshmem_u64)lo;
}
__device__ __forceinline__ void ep_red_max_release(rshmem_u64* p, rshmem_u64 v) {
    asm volatile("red.release.sys.global.max.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
// The scalar fallback of a row to a peer's receive area with no all-ones element (ep_canon).
__device__ __noinline__ void ep_copy_row_canon(ep_t* d, const ep_t* s, long long H, unsigned lane) {
    for (long long h = lane; h < H; h += 32) ((ep_bits*)d)[h] = ep_canon_bits(((const ep_bits*)s)[h]);
}

