// A stand-in expert computation: y[r] = x[r] * factor[local expert of row r], for the rows of
// the last dispatch (count read on the device, so it can be captured in a graph). With
// `gather` (token-major layout), x is the receive area and row r reads receive row
// row_src[r] / kmax.
extern "C" __global__ void __launch_bounds__(512) ep_scale_experts(const ep_params* P, const ep_t* x, ep_t* y, const float* factor,
                                                                   int gather) {
    const unsigned long long* ctl = (const unsigned long long*)P->ctl;
    if (!ctl[EP_CTL_GO]) return;
    const long long H = P->hidden, El = P->el;
    const unsigned* off = (const unsigned*)P->expert_off;
    const long long rows = (long long)off[El];
    const unsigned lane = threadIdx.x & 31;
    long long wpb = blockDim.x / 32, gw = blockIdx.x * wpb + (threadIdx.x >> 5), nw = gridDim.x * wpb;
    for (long long r = gw; r < rows; r += nw) {
        long long lo = 0, hi = El;  // expert e with off[e] <= r < off[e+1]
        while (hi - lo > 1) { long long mid = (lo + hi) / 2; if ((long long)off[mid] <= r) lo = mid; else hi = mid; }
        float f = factor[lo];
        const long long src = gather ? (long long)(((const unsigned*)P->row_src)[r] / (unsigned)P->kmax) : r;
        for (long long h = lane; h < H; h += 32) ep_from(ep_f(x[src * H + h]) * f, &y[r * H + h]);
    }
}

