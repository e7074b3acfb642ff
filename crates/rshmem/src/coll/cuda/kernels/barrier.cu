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
        volatile rshmem_u64* d = (volatile rshmem_u64*)rshmemi_ptr(ck.slots + (rshmem_u64)my_pe * RSHMEMI_SIG_WORDS,
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

// The first barrier of a collective that does not run fused (an untyped kernel: see common.cuh).
#ifndef RSHMEMI_COLL_TYPED_ONLY
extern "C" __global__ void rshmemi_coll_sync_sig(rshmem_team team, rshmemi_check ck) { rshmemi_sig_sync(team, ck); }
#endif

