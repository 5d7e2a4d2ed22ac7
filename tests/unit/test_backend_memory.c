/* The seam's memory entries (issue 14) on the host backends (cpu, reference, and the profiled
 * wrapper, which passes them through): a round trip host -> backend -> backend -> host, zeroing,
 * nbytes 0, and every entry of each table set; prepare_weight makes the cpu kernels' packed
 * copy of a quantized weight through the cpu and profiled tables, none through the reference.
 * Without CUDA, ds_backend_cuda refuses with a reason; with it, it gives a full table or (no
 * device) a reason. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/ggml_quant.h"
#include "dspark/profile.h"
#include "test_util.h"

/* Every function pointer of the table is set (the struct is all pointers from `linear` on). */
static int table_complete(const ds_backend *b) {
  const char *p = (const char *)b + offsetof(ds_backend, linear);
  size_t n = (sizeof(ds_backend) - offsetof(ds_backend, linear)) / sizeof(void (*)(void));
  for (size_t i = 0; i < n; i++) {
    void (*fn)(void);
    memcpy(&fn, p + i * sizeof fn, sizeof fn);
    if (!fn) return 0;
  }
  return 1;
}

static void check_round_trip(const ds_backend *b) {
  enum { N = 1000 };
  float host[N], back[N];
  for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f - 7.0f;
  float *d1 = b->alloc(sizeof host, "test buffer 1"), *d2 = b->alloc(sizeof host, "test buffer 2");
  EXPECT(d1 && d2);
  if (!d1 || !d2) return;
  EXPECT(((uintptr_t)d1 & 63) == 0 || strcmp(b->name, "cuda") == 0);
  b->copy_to_device(d1, host, sizeof host);
  b->copy(d2, d1, sizeof host);
  /* copy_rows: rows 0..9 of a 100-column view, columns 3..42, into a 40-column block of d3 */
  float *d3 = b->alloc(400 * sizeof(float), "test buffer 3"), strided[400];
  EXPECT(d3 != NULL);
  if (d3) {
    b->copy_rows(d3, 40, d1 + 3, 100, 10, 40);
    b->copy_to_host(strided, d3, sizeof strided);
    int same = 1;
    for (int r = 0; r < 10; r++)
      for (int c = 0; c < 40; c++) same &= strided[r * 40 + c] == host[r * 100 + 3 + c];
    EXPECT(same);
    b->copy_rows(d3, 40, d1, 100, 0, 40); /* nothing to copy */
    b->free(d3);
  }
  EXPECT(b->device_memory == (strcmp(b->name, "cuda") == 0));
  b->memset_zero(d1, sizeof host);
  b->synchronize();
  b->copy_to_host(back, d2, sizeof host);
  EXPECT(memcmp(back, host, sizeof host) == 0);
  b->copy_to_host(back, d1, sizeof host);
  int zero = 1;
  for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
  EXPECT(zero);
  /* nbytes 0 everywhere, NULL free. */
  void *empty = b->alloc(0, "empty buffer");
  EXPECT(empty != NULL);
  b->copy_to_device(empty, host, 0);
  b->copy_to_host(back, empty, 0);
  b->copy(empty, d1, 0);
  b->memset_zero(empty, 0);
  b->free(empty);
  b->free(NULL);
  b->free(d1);
  b->free(d2);
}

static void test_host_backends(void) {
  ds_profile prof;
  memset(&prof, 0, sizeof prof);
  const ds_backend *tables[] = {ds_backend_cpu(), ds_backend_reference(), ds_backend_profiled(ds_backend_cpu(), &prof)};
  for (int t = 0; t < 3; t++) {
    EXPECT(table_complete(tables[t]));
    check_round_trip(tables[t]);
  }
}

/* A Q8_0 weight [16, 64] announced to each host table: the cpu kernels read it from an 8-row
 * packed copy except on the portable path, so the copy exists after prepare_weight through the
 * cpu table and through the profiled wrapper around it (a profiled target is prepared at load
 * as a plain one), and the reference, which reads weights as stored, makes none. */
static void test_prepare_weight(void) {
  enum { ROWS = 16, IN = 64 };
  size_t rb = ds_quant_row_bytes(DS_Q8_0, IN);
  ds_profile prof;
  memset(&prof, 0, sizeof prof);
  const ds_backend *tables[] = {ds_backend_cpu(), ds_backend_profiled(ds_backend_cpu(), &prof), ds_backend_reference()};
  const int packs = strcmp(ds_weight_quant_kernel_name(), "portable") != 0;
  for (int t = 0; t < 3; t++) {
    unsigned char *q = calloc(ROWS, rb); /* a new address each time: the copies are keyed by it */
    EXPECT(q != NULL);
    if (!q) return;
    for (int r = 0; r < ROWS; r++)
      for (int b = 0; b < IN / 32; b++) {
        unsigned char *blk = q + r * rb + b * 34;
        blk[0] = 0x00, blk[1] = 0x3c; /* scale 1.0 in fp16 */
        for (int i = 0; i < 32; i++) blk[2 + i] = (unsigned char)(r * 7 + i - 40);
      }
    ds_release_packed_weights();
    EXPECT(ds_packed_weight_bytes() == 0);
    tables[t]->prepare_weight((ds_weight){q, DS_Q8_0}, ROWS, IN);
    EXPECT((ds_packed_weight_bytes() > 0) == (packs && t < 2));
    ds_release_packed_weights();
    free(q);
  }
}

static void test_cuda_entry(void) {
  ds_error_clear();
  const ds_backend *cuda = ds_backend_cuda();
#ifdef DSPARK_USE_CUDA
  if (!cuda) {
    EXPECT(strstr(ds_last_error(), "CUDA") != NULL); /* no device here: the reason names it */
    return;
  }
  EXPECT(table_complete(cuda));
  check_round_trip(cuda);
#else
  EXPECT(cuda == NULL);
  EXPECT(strstr(ds_last_error(), "DSPARK_CUDA") != NULL);
  EXPECT(ds_cuda_set_bf16_gemm(1) == 0 && ds_cuda_set_bf16_gemm(0) == 0);
#endif
}

int main(void) {
  TEST_RUN(test_host_backends);
  TEST_RUN(test_prepare_weight);
  TEST_RUN(test_cuda_entry);
  return TEST_RESULT();
}
