// out[t] = sum over d ascending of the row bases[d] + tok_pos[t * n + d] * H (rows of negative
// positions skipped), in f32, rounded once; work units (token, chunk of the row), two PEs' rows
// loaded before accumulating. `bases`: a row-0 pointer per PE (shared memory, filled and
// synchronised by the caller). The source side of rshmem's combines and of the baseline's. keep:
// as in ep_sum_bases (< 0: rows left as they are).
__device__ __forceinline__ void ep_sum_rows(const int* tok_pos, int T, int n, long long H, const ep_t* const* bases,
                                            ep_t* out, int keep) {
    const unsigned lane = threadIdx.x & 31;
    // The vector path where the row size and every PE's rows are 16-byte aligned.
    bool vec = (H * sizeof(ep_t)) % 16 == 0 && ep_al16((unsigned long long)out);
    for (int d = 0; d < n && vec; d++) vec = ep_al16((unsigned long long)bases[d]);
    const int nv = vec ? (int)(H * (long long)sizeof(ep_t) / 16) : 0;
    const long long chunk = 32 * EP_UR;
    const long long nch = vec ? (nv + chunk - 1) / chunk : 1;
    const long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long u = gw; u < (long long)T * nch; u += nw) {
        const long long t = u / nch, c = u % nch;
        const int* pos = tok_pos + t * n;
        if (vec) {
            const int v0 = (int)(c * chunk) + (int)lane;
            float acc[EP_UR][EP_VEC];
#pragma unroll
            for (int q = 0; q < EP_UR; q++)
#pragma unroll
                for (int e = 0; e < (int)EP_VEC; e++) acc[q][e] = 0.f;
            ep_sum_bases<EP_UR>(acc, pos, n, bases, H, v0, nv, keep);
            ep_round_store<EP_UR>(out + t * H, acc, v0, nv);
        } else {
            for (long long h = lane; h < H; h += 32) {
                float a = 0.f;
                for (int d = 0; d < n; d++)
                    if (pos[d] >= 0) {
                        ep_t* p = (ep_t*)&bases[d][pos[d] * H + h];
                        a += ep_f(*p);
                        if (keep >= 0 && d != keep) *(ep_bits*)p = (ep_bits)EP_SENTINEL;
                    }
                ep_from(a, &out[t * H + h]);
            }
        }
    }
}

// Source side of combine: out[t] = sum over destination PEs (ascending) of the rows they sent
// back for token t, in f32, rounded once; tokens without experts get zeros. Work units are
// (token, chunk of the row), two PEs' rows loaded before accumulating. `own` (not null: after
// ep_csend with tokens == 2) holds this PE's rows for its own tokens (receive-row layout).
extern "C" __global__ void __launch_bounds__(512) ep_crecv(const ep_params* P, ep_t* out, const ep_t* own) {
    rshmemi_grid_dep_wait();
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    EP_STAMP_MAX(ctl, 23);
    if (!ctl[EP_CTL_GO]) return;
    const int n = (int)P->n;
    const long long H = P->hidden, C = P->cap;
    const int T = (int)ctl[EP_CTL_TOKENS];
    const long long parity = (long long)((ctl[EP_CTL_CWAIT] - 1) & 1);
    // Across nodes the rows of another node's PEs are one per (token, node): ep_pack_nodes's
    // combine positions.
    const int* tok_pos = (const int*)(P->cpos ? P->cpos : P->tok_pos);
    const ep_t* comb = (const ep_t*)P->comb + parity * n * C * H;
    __shared__ const ep_t* s_base[EP_MAX_PES];
    for (int d = threadIdx.x; d < n; d += blockDim.x) s_base[d] = (own && d == (int)P->me ? own : comb) + d * C * H;
    __syncthreads();
    EP_STAMP_FIRST(ctl, 14);
    ep_sum_rows(tok_pos, T, n, H, s_base, out, P->sentinel && !(EP_SPLIT_KEEP & 2) ? (int)P->me : -1);
    EP_STAMP_LAST(ctl, 15);
}

