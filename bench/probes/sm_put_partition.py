# Probe (2026-11-27, twenty-second session; BENCHMARKS.md): run on the GPU machine with
# `python3 bench/probes/sm_put_partition.py` (cupy; writes $OUT/smput.json or ./smput.json).
# Probe: how many SMs does a kernel need to fill the link with remote stores (plain 16-byte stores
# against TMA bulk stores from shared memory), both GPUs at once, and what happens to a local
# HBM-heavy kernel running on the other SMs at the same time. 2 GPUs, one process, cupy.
import cupy as cp, numpy as np, time, json, sys, os

SRC = r'''
extern "C" __global__ void gate(volatile int* f) { while (*f == 0) { __nanosleep(200); } }

// plain stores: dst[i] = src[i] (rd) or a constant, 4 vectors per thread in flight
extern "C" __global__ void st_put(uint4* dst, const uint4* src, long long n, int rd) {
    extern __shared__ char pad[];
    long long st = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 4 * st) {
        uint4 v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            long long j = i + q * st;
            if (rd && j < n) v[q] = src[j]; else v[q] = make_uint4((unsigned)j, 1, 2, 3);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) { long long j = i + q * st; if (j < n) dst[j] = v[q]; }
    }
    (void)pad;
}

// TMA bulk stores of `chunk`-byte pieces from a ring of S shared-memory stages
extern "C" __global__ void tma_put(char* dst, const char* src, long long bytes, int chunk, int S, int rd) {
    extern __shared__ __align__(128) char sm[];
    long long nch = bytes / chunk;
    int k = 0;
    for (long long c = blockIdx.x; c < nch; c += gridDim.x, k++) {
        int s = k % S;
        char* buf = sm + (long long)s * chunk;
        if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(3) : "memory");
        __syncthreads();
        if (rd) {
            const uint4* g = (const uint4*)(src + c * chunk);
            for (int v = threadIdx.x; v < chunk / 16; v += blockDim.x) ((uint4*)buf)[v] = g[v];
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned sa = (unsigned)__cvta_generic_to_shared(buf);
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(dst + c * chunk), "r"(sa), "r"(chunk) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    }
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// local HBM work: gather-expand like the dispatch's expansion: out[r] = in[idx[r]] (rows of rv vectors)
extern "C" __global__ void expand(uint4* out, const uint4* in, const int* idx, long long rows, int rv) {
    extern __shared__ char pad[];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (long long r = blockIdx.x * (long long)wpb + w; r < rows; r += (long long)gridDim.x * wpb) {
        const uint4* s = in + (long long)idx[r] * rv;
        uint4* d = out + r * rv;
        for (int v = lane; v < rv; v += 32 * 4) {
            uint4 a[4];
#pragma unroll
            for (int q = 0; q < 4; q++) if (v + 32 * q < rv) a[q] = s[v + 32 * q];
#pragma unroll
            for (int q = 0; q < 4; q++) if (v + 32 * q < rv) d[v + 32 * q] = a[q];
        }
    }
    (void)pad;
}
'''

H = 7168
RV = H * 2 // 16          # 16-byte vectors per row
T = 4096
ROWB = H * 2
SEND = T * ROWB           # 58.7 MB each way
EROWS = 32768             # expanded rows (470 MB)
NSM = 132

def main():
    out = {}
    devs = [0, 1]
    mods, k = {}, {}
    bufs = {}
    flagmem = cp.cuda.alloc_pinned_memory(64)
    flag = np.frombuffer(flagmem, np.int32, 16)
    for d in devs:
        with cp.cuda.Device(d):
            try:
                cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
            except Exception as e:
                print("peer", d, e)
            k[d] = {n: cp.RawKernel(SRC, n, options=("-arch=sm_90", "-std=c++17")) for n in ("gate", "st_put", "tma_put", "expand")}
            for n in ("st_put", "tma_put", "expand"):
                k[d][n].max_dynamic_shared_size_bytes = 200 * 1024
            b = {}
            b["x"] = cp.random.randint(0, 1 << 30, SEND // 4, dtype=cp.int32)
            b["recv"] = cp.zeros(SEND // 4 * 2, dtype=cp.int32)    # [2][T] rows
            b["ein"] = cp.random.randint(0, 1 << 30, 2 * T * ROWB // 4, dtype=cp.int32)
            b["eout"] = cp.zeros(EROWS * ROWB // 4, dtype=cp.int32)
            b["idx"] = cp.random.randint(0, 2 * T, EROWS, dtype=cp.int32)
            b["sA"] = cp.cuda.Stream(non_blocking=True)
            b["sB"] = cp.cuda.Stream(non_blocking=True)
            bufs[d] = b
    for d in devs:
        with cp.cuda.Device(d):
            cp.cuda.Device(d).synchronize()

    def run(put, pg, pthreads, psmem, expand_on, eg, ethreads, esmem, reps=5):
        """put: None, 'st', 'tma', 'tma0' (no reads), 'st0'; returns per-device us (median)."""
        times = []
        for rep in range(reps + 1):
            flag[0] = 0
            evs = {}
            for d in devs:
                b = bufs[d]
                with cp.cuda.Device(d):
                    e0, eB, e1 = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
                    with b["sA"]:
                        k[d]["gate"]((1,), (32,), (np.uint64(flagmem.ptr),))
                    e0.record(b["sA"])
                    b["sB"].wait_event(e0)
                    peer_recv = bufs[1 - d]["recv"]
                    dst = peer_recv.data.ptr + d * SEND
                    if put in ("st", "st0"):
                        with b["sA"]:
                            k[d]["st_put"]((pg,), (pthreads,), (np.uint64(dst), b["x"], np.int64(SEND // 16), np.int32(put == "st")),
                                           shared_mem=psmem)
                    elif put in ("tma", "tma0"):
                        chunk = 16384
                        with b["sA"]:
                            k[d]["tma_put"]((pg,), (pthreads,), (np.uint64(dst), b["x"], np.int64(SEND), np.int32(chunk), np.int32(4),
                                            np.int32(put == "tma")), shared_mem=max(psmem, 4 * chunk))
                    if expand_on:
                        with b["sB"]:
                            k[d]["expand"]((eg,), (ethreads,), (b["eout"], b["ein"], b["idx"], np.int64(EROWS), np.int32(RV)),
                                           shared_mem=esmem)
                    eB.record(b["sB"])
                    b["sA"].wait_event(eB)
                    e1.record(b["sA"])
                    evs[d] = (e0, e1)
            time.sleep(0.003)
            flag[0] = 1
            for d in devs:
                with cp.cuda.Device(d):
                    cp.cuda.Device(d).synchronize()
            if rep:
                times.append([cp.cuda.get_elapsed_time(*evs[d]) * 1000 for d in devs])
        t = np.median(np.array(times), axis=0)
        return [round(float(v), 1) for v in t]

    res = []
    def rec(label, **kw):
        t = run(**kw)
        gbs = None
        if kw.get("put"):
            gbs = round(SEND / (max(t) * 1e-6) / 1e9, 1)
        res.append({"label": label, "us": t, "put_GBps_if_alone": gbs})
        print(label, t, gbs, flush=True)

    big = 150 * 1024
    rec("expand alone 132x512", put=None, pg=0, pthreads=0, psmem=0, expand_on=True, eg=132, ethreads=512, esmem=big)
    rec("expand alone 264x512", put=None, pg=0, pthreads=0, psmem=0, expand_on=True, eg=264, ethreads=512, esmem=0)
    for g in (8, 16, 32, 64, 132):
        rec(f"st put {g}x512 (1/SM)", put="st", pg=g, pthreads=512, psmem=big, expand_on=False, eg=0, ethreads=0, esmem=0)
    rec("st put 264x512", put="st", pg=264, pthreads=512, psmem=0, expand_on=False, eg=0, ethreads=0, esmem=0)
    for g in (8, 16, 32, 64, 132):
        rec(f"tma put {g}x256 (1/SM)", put="tma", pg=g, pthreads=256, psmem=big, expand_on=False, eg=0, ethreads=0, esmem=0)
    for g in (8, 16, 32):
        rec(f"tma put no-read {g}x256", put="tma0", pg=g, pthreads=256, psmem=big, expand_on=False, eg=0, ethreads=0, esmem=0)
        rec(f"st put no-read {g}x512", put="st0", pg=g, pthreads=512, psmem=big, expand_on=False, eg=0, ethreads=0, esmem=0)
    for g in (16, 32, 48, 66):
        rec(f"tma put {g} + expand {NSM-g}", put="tma", pg=g, pthreads=256, psmem=big, expand_on=True, eg=NSM - g, ethreads=512, esmem=big)
        rec(f"st put {g} + expand {NSM-g}", put="st", pg=g, pthreads=512, psmem=big, expand_on=True, eg=NSM - g, ethreads=512, esmem=big)
    rec("st put 132 + expand 132 (shared SMs)", put="st", pg=132, pthreads=512, psmem=0, expand_on=True, eg=132, ethreads=512, esmem=0)
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "."), "smput.json"), "w") as f:
        json.dump(res, f, indent=1)

main()
