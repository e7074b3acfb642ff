/* OpenSHMEM baseline of `rshmem perf --suites fabric`: the same figures as rshmem's fabric
 * suite, measured the same way, for Open MPI's OSHMEM (spml ucx).
 *   put_latency 8 US   8-byte put + fence + flag set, ping-pong, one way (p then wait_until)
 *   put N US           back-to-back blocking puts of N bytes, then quiet; time per put
 *   get N US           back-to-back blocking gets of N bytes; time per get
 * Build: bash bench/openshmem-build.sh OUT_DIR
 * Run:   oshrun -n 2 OUT_DIR/bin/rshmem-oshmem-fabric-bench LATENCY_ITERS SIZE...
 * (PE 0 prints; data checked after each timed loop, a mismatch exits with status 1). */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
  shmem_init();
  int me = shmem_my_pe();
  if (shmem_n_pes() != 2 || argc < 2) {
    if (me == 0) fprintf(stderr, "usage: oshrun -n 2 %s LATENCY_ITERS SIZE...\n", argv[0]);
    shmem_finalize();
    return 2;
  }
  long lat_iters = atol(argv[1]);
  size_t max = 8;
  for (int i = 2; i < argc; i++) {
    size_t n = strtoull(argv[i], NULL, 10);
    if (n > max) max = n;
  }
  long *flag = shmem_malloc(sizeof(long));
  long *data = shmem_malloc(sizeof(long));
  unsigned char *buf = shmem_align(4096, max);
  unsigned char *src = malloc(max), *back = malloc(max);
  if (!flag || !data || !buf || !src || !back) {
    fprintf(stderr, "PE %d: out of memory for %zu bytes\n", me, max);
    shmem_global_exit(1);
  }
  for (size_t i = 0; i < max; i++) src[i] = (unsigned char)(i * 7 + 3);
  *flag = 0;
  *data = 0;
  shmem_barrier_all();
  int other = 1 - me;
  double t0 = now_us();
  for (long i = 1; i <= lat_iters; i++) {
    if (me == 0) {
      shmem_long_p(data, i, other);
      shmem_fence();
      shmem_long_atomic_set(flag, i, other);
      shmem_long_wait_until(flag, SHMEM_CMP_GE, i);
    } else {
      shmem_long_wait_until(flag, SHMEM_CMP_GE, i);
      shmem_long_p(data, i, other);
      shmem_fence();
      shmem_long_atomic_set(flag, i, other);
    }
  }
  double lat = (now_us() - t0) / (2.0 * lat_iters);
  if (*data != lat_iters) {
    fprintf(stderr, "PE %d: latency data check failed\n", me);
    shmem_global_exit(1);
  }
  if (me == 0) printf("put_latency 8 %.3f\n", lat);
  shmem_barrier_all();
  if (me == 0) {
    for (int a = 2; a < argc; a++) {
      size_t n = strtoull(argv[a], NULL, 10);
      long iters = (long)((64ull << 20) / (n ? n : 1));
      if (iters < 3) iters = 3;
      if (iters > 200) iters = 200;
      shmem_putmem(buf, src, n, 1);
      shmem_quiet();
      t0 = now_us();
      for (long i = 0; i < iters; i++) shmem_putmem(buf, src, n, 1);
      shmem_quiet();
      printf("put %zu %.3f\n", n, (now_us() - t0) / iters);
      memset(back, 0, n);
      t0 = now_us();
      for (long i = 0; i < iters; i++) shmem_getmem(back, buf, n, 1);
      double g = (now_us() - t0) / iters;
      if (memcmp(back, src, n) != 0) {
        fprintf(stderr, "the %zu bytes read back differ from those put\n", n);
        shmem_global_exit(1);
      }
      printf("get %zu %.3f\n", n, g);
      fflush(stdout);
    }
  }
  shmem_barrier_all();
  shmem_free(buf);
  shmem_free(data);
  shmem_free(flag);
  free(src);
  free(back);
  shmem_finalize();
  return 0;
}
