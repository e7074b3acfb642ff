/* Reference figures from OpenSHMEM (Open MPI's OSHMEM) for BENCHMARKS.md.
 * Build: oshcc -O2 -o /tmp/shmem_bench shmem_bench.c
 * Run:   oshrun -n 2 --allow-run-as-root --oversubscribe /tmp/shmem_bench
 * Figures (PE 0 prints them): 8-byte put + fence + flag ping-pong (one way), 1 MiB put
 * beside a same-run memcpy (samples interleaved), 2-PE barrier_all. Medians of 201 short
 * samples (a preemption spoils few of them). */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAMPLES 201
#define MIB (1 << 20)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(void) {
  shmem_init();
  int me = shmem_my_pe();
  if (shmem_n_pes() != 2) {
    if (me == 0) fprintf(stderr, "run with 2 PEs\n");
    shmem_finalize();
    return 1;
  }
  long *flag = shmem_malloc(sizeof(long));
  long *data = shmem_malloc(sizeof(long));
  long *k_sym = shmem_malloc(sizeof(long));
  char *buf = shmem_align(64, MIB);
  char *src = aligned_alloc(64, MIB), *tmp = aligned_alloc(64, MIB);
  memset(src, 1, MIB);
  memset(tmp, 0, MIB);
  memset(buf, 0, MIB);
  *flag = 0;
  shmem_barrier_all();
  double v[SAMPLES];

  /* 8-byte put + fence + flag ping-pong. */
  long seq = 0;
  long k = 500;
  for (int s = -2; s < SAMPLES; s++) { /* two warm-up samples */
    double t0 = now_us();
    for (long i = 0; i < k; i++) {
      seq++;
      if (me == 0) {
        shmem_long_put(data, &seq, 1, 1);
        shmem_fence();
        shmem_long_atomic_set(flag, seq, 1);
        shmem_long_wait_until(flag, SHMEM_CMP_EQ, seq);
      } else {
        shmem_long_wait_until(flag, SHMEM_CMP_EQ, seq);
        shmem_long_put(data, &seq, 1, 0);
        shmem_fence();
        shmem_long_atomic_set(flag, seq, 0);
      }
    }
    if (s >= 0) v[s] = (now_us() - t0) / k / 2;
  }
  if (me == 0) {
    if (*data != seq) fprintf(stderr, "ping-pong data check failed\n");
    printf("put8+fence+flag one-way latency: %.3f us\n", median(v, SAMPLES));
  }
  shmem_barrier_all();

  /* 1 MiB put beside memcpy, samples interleaved. */
  if (me == 0) {
    double vb[SAMPLES];
    int kk = 3;
    for (int s = -2; s < SAMPLES; s++) {
      double t0 = now_us();
      for (int i = 0; i < kk; i++) {
        memcpy(tmp, src, MIB);
        __asm__ volatile("" ::"r"(tmp) : "memory");
      }
      double t1 = now_us();
      for (int i = 0; i < kk; i++) shmem_putmem(buf, src, MIB, 1);
      shmem_quiet();
      double t2 = now_us();
      if (s >= 0) {
        vb[s] = (t1 - t0) / kk;
        v[s] = (t2 - t1) / kk;
      }
    }
    double b = median(vb, SAMPLES), p = median(v, SAMPLES);
    printf("put 1 MiB: %.2f us (%.2f GB/s); memcpy 1 MiB: %.2f us (%.2f GB/s); ratio %.2f\n",
           p, MIB / (p * 1e3), b, MIB / (b * 1e3), b / p);
  }
  shmem_barrier_all();
  if (me == 1 && buf[MIB - 1] != 1) fprintf(stderr, "put data check failed\n");

  /* barrier_all, 2 PEs. */
  k = 500;
  for (int s = -2; s < SAMPLES; s++) {
    double t0 = now_us();
    for (long i = 0; i < k; i++) shmem_barrier_all();
    if (s >= 0) v[s] = (now_us() - t0) / k;
  }
  if (me == 0) printf("barrier_all (2 PEs): %.3f us\n", median(v, SAMPLES));
  (void)k_sym;
  shmem_barrier_all();
  shmem_free(buf);
  shmem_free(k_sym);
  shmem_free(data);
  shmem_free(flag);
  free(src);
  free(tmp);
  shmem_finalize();
  return 0;
}
