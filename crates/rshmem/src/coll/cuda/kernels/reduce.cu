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
                rshmemi_v4 x = ((const rshmemi_v4*)rshmemi_ptr(src, rshmemi_member(team, 0)))[v];
                const T* e = (const T*)&x;
#pragma unroll
                for (int k = 0; k < V; k++) acc[k] = rshmemi_cvt<T, A>::in(e[k]);
            }
            for (int i = 1; i < team.size; i++) {
                rshmemi_v4 x = ((const rshmemi_v4*)rshmemi_ptr(src, rshmemi_member(team, i)))[v];
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
        A acc = rshmemi_cvt<T, A>::in(((const T*)rshmemi_ptr(src, rshmemi_member(team, 0)))[j]);
        for (int i = 1; i < team.size; i++)
            acc = rshmemi_apply<A, OP>(acc, rshmemi_cvt<T, A>::in(((const T*)rshmemi_ptr(src, rshmemi_member(team, i)))[j]));
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

