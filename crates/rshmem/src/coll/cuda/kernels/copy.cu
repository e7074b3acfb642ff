// ----- copies: every Copy step of one phase in one launch -----
// Untyped kernels only (see common.cuh).
#ifndef RSHMEMI_COLL_TYPED_ONLY

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
            const void* s = d.pe >= 0 ? rshmemi_ptr((const void*)d.src, (int)d.pe) : (const void*)d.src;
            rshmemi_copy((void*)d.dst, s, d.bytes, threadIdx.x, blockDim.x);
        }
        rshmem_team_sync_block(team);
        return;
    }
    if (rshmemi_coll_gave_up() || rshmemi_coll_skip(ck, team)) return;
    unsigned i = blockIdx.x % n, part = blockIdx.x / n, parts = gridDim.x / n;
    const rshmemi_copy_desc& d = c.d[i];
    const void* s = d.pe >= 0 ? rshmemi_ptr((const void*)d.src, (int)d.pe) : (const void*)d.src;
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
//
// On a team spanning nodes (rows != 0) the rows of members on other nodes are not mapped: each
// such member put its row into this PE's `rows` (row of world PE p at p * row_stride) before
// its ready arrival, which the launch before this one waited for (rshmemi_coll_net_a2avd). The
// matrix is then the same on every member, so is the verdict. This kernel copies only from the
// members of this PE's node; for each receiver of another node block 0 writes this PE's put
// into `plan` (world PE p: plan[3p] where it lands in p's dst, plan[3p + 1] where it starts
// in src, plan[3p + 2] elements; 0 elements after a bad verdict), which the next launch posts.
extern "C" __global__ void rshmemi_coll_a2av_dev(char* dst, const char* src, const rshmem_u64* counts,
                                                 rshmem_u64* recv_counts, rshmem_u64* err, rshmem_u64 elem,
                                                 rshmem_u64 src_cap, rshmem_u64 dst_cap, rshmem_team team,
                                                 const rshmem_u64* rows, rshmem_u64 row_stride, rshmem_u64* plan) {
    extern __shared__ rshmem_u64 m[];
    __shared__ int bad;
    const int n = team.size, me = team.my_index;
    if (rshmemi_coll_gave_up() || *(volatile rshmem_u64*)(err + RSHMEMI_ERR_SKIP + team.slot)) return;
    if (threadIdx.x == 0) bad = 0;
    for (int t = threadIdx.x; t < n * n; t += blockDim.x) {
        int j = t / n, k = t % n;
        const int pe = rshmemi_member(team, j);
        if (rows && rshmemi_remote(pe))
            m[t] = rshmemi_vld(rows + (rshmem_u64)pe * row_stride + k);
        else
            m[t] = rshmemi_vld((const rshmem_u64*)rshmemi_ptr(counts + k, pe));
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
    if (blockIdx.x == 0) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) recv_counts[j] = m[j * n + me];
        if (rows) {
            for (int k = threadIdx.x; k < n; k += blockDim.x) {
                const int pe = rshmemi_member(team, k);
                if (!rshmemi_remote(pe)) continue;
                rshmem_u64 at = 0, from = 0;
                for (int i = 0; i < me; i++) at += m[i * n + k];
                for (int i = 0; i < k; i++) from += m[me * n + i];
                plan[3 * (rshmem_u64)pe] = at;
                plan[3 * (rshmem_u64)pe + 1] = from;
                plan[3 * (rshmem_u64)pe + 2] = bad ? 0 : m[me * n + k];
            }
        }
    }
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
    // A sender of another node puts its share itself.
    if (rows && rshmemi_remote(rshmemi_member(team, j))) return;
    rshmem_u64 disp = 0, at = 0;
    for (int k = 0; k < me; k++) disp += m[j * n + k];
    for (unsigned i = 0; i < j; i++) at += m[i * n + me];
    rshmem_u64 bytes = m[j * n + me] * elem;
    const char* s = (const char*)rshmemi_ptr(src + disp * elem, rshmemi_member(team, j));
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
    rshmem_u64 c = rshmemi_vld((const rshmem_u64*)rshmemi_ptr(meta + me, pe));
    rshmem_u64 d = rshmemi_vld((const rshmem_u64*)rshmemi_ptr(meta + stride + me, pe));
    rshmem_u64 at = recv.displ[jj];
    if (c != recv.count[jj] || c > src_cap || d > src_cap - c || c > dst_cap || at > dst_cap - c) {
        if (part == 0 && threadIdx.x == 0) atomicOr(err, RSHMEMI_ERR_A2AV);
        return;
    }
    const char* s = (const char*)rshmemi_ptr(src + d * elem, pe);
    rshmemi_copy(dst + at * elem, s, c * elem, part * blockDim.x + threadIdx.x, parts * blockDim.x);
}
#endif
