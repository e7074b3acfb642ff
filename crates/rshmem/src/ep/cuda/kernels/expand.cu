// Most local experts whose per-block counts the token-major index keeps in shared memory
// (`-DEP_INDEX_EXPERTS=0` takes the one-atomic-per-pair path always, for tests).
#ifndef EP_INDEX_EXPERTS
#define EP_INDEX_EXPERTS 4096
#endif

// How ep_expand_row reads its row (see there).
#define EP_ROW_PLAIN 0
#define EP_ROW_PEER 1
#define EP_ROW_OWN 2
// ep_expand_row's element path (out of line: the vector path's registers). A peer's row is
// waited for whole first, its sentinel stored back once every row has it.
__device__ __noinline__ void ep_expand_row_scalar(ep_t* out, const ep_t* src, unsigned mask, int r, long long H, unsigned lane,
                                                  int how, bool back, int pe) {
    if (how == EP_ROW_PEER) {
        for (long long h = lane; h < H; h += 32) ep_take_bits((ep_t*)src + h, pe, false, EP_DISPATCH_WAIT);
        __syncwarp();
    }
    for (unsigned mm = mask; mm; mm &= mm - 1) {
        const int rb = __shfl_sync(0xffffffffu, r, __ffs(mm) - 1);
        if (how == EP_ROW_OWN) ep_copy_row_canon(out + (long long)rb * H, src, H, lane);
        else ep_copy_row(out + (long long)rb * H, src, H * (long long)sizeof(ep_t), lane);
    }
    if (back) {
        __syncwarp();
        for (long long h = lane; h < H; h += 32) ((volatile ep_bits*)src)[h] = (ep_bits)EP_SENTINEL;
    }
}

// ep_pstream: at most EP_PSTREAM_REGS registers per thread (its blocks of 448 threads fit beside
// ep_send's of 128, whose launch bounds give it at most 128, with room to spare) and
// EP_PSTREAM_U vectors per lane in flight: the fastest expert-major dispatch of the thread,
// register and batch splits tried (BENCHMARKS.md).
#ifndef EP_PSTREAM_REGS
#define EP_PSTREAM_REGS 96
#endif
#ifndef EP_PSTREAM_U
#define EP_PSTREAM_U 4
#endif
// Row `src` into rows `out + r_l * H` for the lanes l of `mask` (r: each lane's row), the whole
// warp: read once, chunk by chunk (vectors when `vec`), each chunk stored to every row. `how`:
// EP_ROW_PLAIN, a row in place; EP_ROW_PEER, a row a peer puts into this PE's receive area
// (waited for until no element is the sentinel; with `back` the sentinel is stored back);
// EP_ROW_OWN, this PE's own row read from x, canonical as the peers' rows arrive (ep_canon).
template <int U>
__device__ __forceinline__ void ep_expand_row(ep_t* out, const ep_t* src, unsigned mask, int r, long long H, bool vec,
                                              int nv, unsigned lane, int how = EP_ROW_PLAIN, bool back = false, int pe = 0) {
    if (!mask) return;
    back = back && how == EP_ROW_PEER && !EP_DISPATCH_KEEP;
    if (vec) {
        // The chunk loop runs as many times on every lane (its bound does not depend on the
        // lane): the shuffles below need the whole warp.
        for (int c0 = 0; c0 < nv; c0 += 32 * U) {
            const int v0 = c0 + (int)lane;
            rshmemi_v4 a[U];
            if (how == EP_ROW_PEER) {
                ep_take_chunk<U>(a, (rshmemi_v4*)src, v0, nv, min(c0 + 32 * U, nv) - 1, pe, back, lane);
            } else {
                ep_load<U>(a, (const rshmemi_v4*)src, v0, nv, false);
                if (how == EP_ROW_OWN) {
#pragma unroll
                    for (int q = 0; q < U; q++) a[q] = ep_canon4(a[q]);
                }
            }
            for (unsigned mm = mask; mm; mm &= mm - 1) {
                const int rb = __shfl_sync(0xffffffffu, r, __ffs(mm) - 1);
                ep_store<U>((rshmemi_v4*)(out + (long long)rb * H), a, v0, nv);
            }
        }
    } else {
        ep_expand_row_scalar(out, src, mask, r, H, lane, how, back, pe);
    }
}

// Received row g (source g / C, position g % C) into expert-major rows `out`, one per local slot
// (the whole warp): lane j takes slot j (its row placed by an atomic on the expert's fill
// counter) and fills the handle (row_src[r] = g * kmax + slot, tok_rows[g * kmax + slot] = r
// or -1), then the warp reads the row once, chunk by chunk, and stores each chunk to every
// local slot's row. A peer's row comes from the receive area as it arrives (EP_ROW_PEER, PE
// `pe`), this PE's own from `x` (not null; its row record holds the token).
__device__ __forceinline__ void ep_permute_row(const ep_params* P, ep_t* out, long long g, bool vec, int nv, unsigned lane,
                                               const ep_t* x, int pe) {
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const long long H = P->hidden, K = P->kmax, RMW = 1 + 2 * K, El = P->el, lo = P->me * El;
    const unsigned* off = (const unsigned*)P->expert_off;
    unsigned* fill = (unsigned*)P->fill;
    const unsigned* m = (const unsigned*)P->recv_meta + g * RMW;
    const ep_t* src = x ? x + (long long)m[0] * H : (const ep_t*)P->recv_x + g * H;
    // A peer's row goes back to the sentinel when the last group of 32 slots with a local
    // expert has read it (slot j0 of that group: jl); a row with none is corrupt.
    long long jl = 0;
    if (K > 32 || !x) {
        jl = -1;
        for (long long j0 = 0; j0 < K; j0 += 32) {
            const long long id = j0 + lane < K ? (long long)(int)m[1 + j0 + lane] : -1;
            if (__ballot_sync(0xffffffffu, id >= lo && id < lo + El)) jl = j0;
        }
        if (jl < 0) {
            if (lane == 0) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
            return;
        }
    }
    for (long long j0 = 0; j0 < K; j0 += 32) {
        const long long j = j0 + lane;
        int r = -1;
        if (j < K) {
            const long long id = (long long)(int)m[1 + j];
            if (id >= lo && id < lo + El) {
                const long long e = id - lo;
                const unsigned rr = off[e] + atomicAdd(&fill[e], 1u);
                if (rr < off[e + 1]) {
                    r = (int)rr;
                    ((unsigned*)P->row_src)[r] = (unsigned)(g * K + j);
                } else {
                    atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
                }
            }
            ((int*)P->tok_rows)[g * K + j] = r;
        }
        ep_expand_row<EP_PSTREAM_U>(out, src, __ballot_sync(0xffffffffu, r >= 0), r, H, vec, nv, lane, x ? EP_ROW_OWN : EP_ROW_PEER,
                      j0 == jl, pe);
    }
}

// Elements [0, elems) of p (element-aligned) to the sentinel, grid-stride (i0, st).
__device__ __forceinline__ void ep_fill_sentinel(ep_t* p, long long elems, long long i0, long long st) {
    const long long head = min(elems, (long long)(((16 - ((unsigned long long)p & 15)) & 15) / sizeof(ep_t)));
    const long long nvec = (elems - head) * (long long)sizeof(ep_t) / 16, tail = head + nvec * (16 / (long long)sizeof(ep_t));
    const rshmemi_v4 snt = {EP_SENTINEL, EP_SENTINEL, EP_SENTINEL, EP_SENTINEL};
    for (long long i = i0; i < head; i += st) ((ep_bits*)p)[i] = (ep_bits)EP_SENTINEL;
    for (long long i = i0; i < nvec; i += st) ((rshmemi_v4*)(p + head))[i] = snt;
    for (long long i = tail + i0; i < elems; i += st) ((ep_bits*)p)[i] = (ep_bits)EP_SENTINEL;
}

// Dispatch, step 4, expert-major buffers (grid, started on ep_dwait's gate while ep_send still
// runs on every PE; at most EP_PSTREAM_REGS registers per thread, so its blocks of 448 threads
// fit beside ep_send's of 128, as the host launches them for these buffers): each received row
// moves to its experts' rows (ep_permute_row) as it arrives; the warps take rows by tickets
// (below). A pair (source, source block) starts once its sender's "records in" word is (its
// positions lo..hi-1); then each of its rows is taken as it comes: the receive area holds the
// sentinel where no row is, the sender puts rows with no all-ones element (ep_canon), and a
// vector none of whose elements is the sentinel is the sender's (an element is written at
// once). This PE's own rows come from x (ep_send does not copy them). Every row read goes back
// to the sentinel; so do the peers' rows of a step that moves none (after ep_dwait's end: all of
// them are in), unless a wait timed out (rows may still come; Buffer::check refills the area
// then). A wait that times out stops the warp; the last block to finish checks that every
// expert got its rows and stops the step on a timeout (ep_abort_if_failed), so combine moves
// nothing.
extern "C" __global__ void __maxnreg__(EP_PSTREAM_REGS) ep_pstream(const ep_params* P, ep_t* out, const ep_t* x) {
    __shared__ int s_go, s_last, s_rows;
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    const int n = (int)P->n, me = (int)P->me;
    const long long H = P->hidden, C = P->cap, G = P->grid;
    const unsigned lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        rshmemi_wait64((const rshmem_u64*)ctl + EP_CTL_PGATE, RSHMEM_CMP_EQ, 1, me);
        s_go = !ep_timed_out() && ctl[EP_CTL_GO] != 0;
    }
    __syncthreads();
    EP_STAMP_MAX(ctl, 19);
    if (s_go) {
        EP_STAMP_FIRST(ctl, 9);
        const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
        const rshmem_u64* prog = (const rshmem_u64*)P->prog;
        const bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)out | P->recv_x | (unsigned long long)x);
        const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
        // Rows by tickets (one counter, a warp takes the next ticket when done with a row):
        // ticket t is row t / I of pair t % I (I pairs (source, source block)), so every
        // pair's k-th row comes before any pair's (k+1)-th: this PE's own rows (there from the
        // start) and the peers' (coming in over the whole send) interleave, every warp works
        // while rows come in and none idles at the end.
        // A pair has at most ceil(T_s / G) rows (T_s: source s's tokens, from its record, which
        // ep_dwait read before the gate).
        if (threadIdx.x == 0) {
            const long long RW = EP_REC_FIXED + P->el;
            long long tmax = 0;
            for (int s = 0; s < n; s++) tmax = max(tmax, (long long)((volatile const rshmem_u64*)P->rec)[s * RW + 2]);
            s_rows = (int)min((tmax + G - 1) / G, (P->max_tokens + G - 1) / G);
        }
        __syncthreads();
        const long long I = n * G, NT = I * s_rows;
        bool stop = false;
        while (!stop) {
            unsigned long long t = 0;
            if (lane == 0) t = atomicAdd(&ctl[EP_CTL_RTICKET], 1ull);
            t = __shfl_sync(0xffffffffu, t, 0);
            if ((long long)t >= NT) break;
            const long long item = (long long)t % I, k = (long long)t / I;
            const int s = (int)(item / G);
            // The pair's row records are in: its positions lo..hi-1.
            rshmem_u64 v = 0;
            if (lane == 0) v = rshmemi_wait64(prog + item, RSHMEM_CMP_GE, 1ull << 63, ep_pe(P, s));
            v = __shfl_sync(0xffffffffu, v, 0);
            // Every lane after lane 0's acquire of the word.
            __syncwarp();
            const long long lo = (long long)(v & 0xffffffffu), hi = (long long)((v >> 32) & 0x7fffffffu);
            if (!(v >> 63)) break;  // a timeout (or a failure before it)
            if (hi > min((long long)recv_cnt[s], C) || (s == me && !x)) {
                // Beyond what the sender's record announced.
                if (lane == 0 && k == 0) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
                continue;
            }
            if (lo + k >= hi) continue;
            ep_permute_row(P, out, (long long)s * C + lo + k, vec, nv, lane, s == me ? x : nullptr, ep_pe(P, s));
            stop = ep_timed_out();
        }
    } else if (EP_DISPATCH_REFILL) {
        rshmemi_grid_dep_wait();
        if (!ep_timed_out() && !ep_aborted(ctl)) {
            const long long RW = EP_REC_FIXED + P->el;
            const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x, st = (long long)gridDim.x * blockDim.x;
            for (int s = 0; s < n; s++) {
                if (s == me) continue;
                const long long k = min((long long)((volatile const rshmem_u64*)P->rec)[s * RW + 1], C);
                ep_fill_sentinel((ep_t*)P->recv_x + (long long)s * C * H, k * H, i0, st);
            }
        }
    }
    // The last block: every expert has its rows (unless a wait gave up), and the step stops on
    // a timeout.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(&ctl[EP_CTL_PTICKET], 1ull) == gridDim.x - 1;
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        if (s_go && !ep_timed_out()) {
            const unsigned* off = (const unsigned*)P->expert_off;
            const unsigned* fill = (const unsigned*)P->fill;
            for (int e = threadIdx.x; e < (int)P->el; e += blockDim.x)
                if (((volatile const unsigned*)fill)[e] != off[e + 1] - off[e]) atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            ep_abort_if_failed(ctl);
            EP_STAMP(ctl, 10);
        }
    }
    // The stream's order for what follows (ep_dwait, and through it ep_send, ended).
    rshmemi_grid_dep_wait();
}

// Token-major buffers, dispatch step 4 (grid, after ep_dwait): the expert-major index only,
// row_src[r] = received row * kmax + slot, tok_rows[received row * kmax + slot] = r (or -1), a
// thread per (receive row, slot) pair.
extern "C" __global__ void __launch_bounds__(512) ep_permute(const ep_params* P) {
    rshmemi_grid_dep_wait();
    unsigned long long* ctl = (unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    EP_STAMP_FIRST(ctl, 9);
    const int n = (int)P->n, me = (int)P->me;
    const long long C = P->cap, K = P->kmax, RMW = 1 + 2 * K, El = P->el;
    const unsigned* recv_cnt = (const unsigned*)P->recv_cnt;
    const unsigned* off = (const unsigned*)P->expert_off;
    unsigned* fill = (unsigned*)P->fill;
    unsigned* row_src = (unsigned*)P->row_src;
    int* tok_rows = (int*)P->tok_rows;
    const long long lo = (long long)me * El;
    // Token-major buffers: the index only, a thread per (receive row, slot) pair. A block
    // counts its pairs per local expert in shared memory (dynamic: 2 * El unsigned) and
    // reserves each expert's rows with one global atomic; one atomic per pair on the El
    // contended fill counters would make the index several times slower. More than
    // EP_INDEX_EXPERTS local experts: one atomic per pair.
    extern __shared__ unsigned s_idx[];
    const bool shared_path = El <= EP_INDEX_EXPERTS;
    const unsigned total = (unsigned)(n * C * K), Ku = (unsigned)K, Cu = (unsigned)C;
    const unsigned tid = threadIdx.x, nth = blockDim.x;
    for (unsigned base = blockIdx.x * nth; base < total; base += gridDim.x * nth) {
        const unsigned q = base + tid;
        if (shared_path) {
            for (int x = tid; x < El; x += nth) s_idx[x] = 0;
            __syncthreads();
        }
        long long e = -1;
        if (q < total) {
            const unsigned g = q / Ku, j = q - g * Ku, src = g / Cu;
            if (g - src * Cu < recv_cnt[src]) {
                const long long id = (long long)(int)((const unsigned*)P->recv_meta)[(long long)g * RMW + 1 + j];
                if (id >= lo && id < lo + El) e = id - lo;
                else tok_rows[q] = -1;
            }
        }
        unsigned rank = 0;
        if (shared_path) {
            if (e >= 0) rank = atomicAdd(&s_idx[e], 1u);
            __syncthreads();
            for (int x = tid; x < El; x += nth) {
                const unsigned c = s_idx[x];
                if (c) s_idx[El + x] = atomicAdd(&fill[x], c);
            }
            __syncthreads();
            if (e >= 0) rank += s_idx[El + e];
            __syncthreads();  // s_idx is zeroed for the next pairs
        } else if (e >= 0) {
            rank = atomicAdd(&fill[e], 1u);
        }
        if (e >= 0) {
            const unsigned rr = off[e] + rank;
            int r = -1;
            if (rr < off[e + 1]) {
                r = (int)rr;
                row_src[r] = q;
            } else {
                atomicOr_system(&ctl[EP_CTL_ERR], EP_ERR_CORRUPT);
            }
            tok_rows[q] = r;
        }
    }
    EP_STAMP_LAST(ctl, 10);
}

