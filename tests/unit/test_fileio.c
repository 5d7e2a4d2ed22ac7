/* The file primitives' refusals carry the reason (issue 7 item 24): a symlink loop, a file or
 * a dangling link where a directory is wanted, a directory where a file is wanted. Before,
 * ds_mkdir_p accepted a self-looping symlink as an existing directory (mkdir said EEXIST) and
 * the next open failed far away, without the reason. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "test_util.h"

static char g_dir[512];

static char *at(const char *name) {
  static char buf[4][600];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
  return buf[k];
}

#define EXPECT_FAIL_WITH(expr, word)                                                      \
  do {                                                                                    \
    ds_status st_ = (expr);                                                               \
    EXPECT(st_ != DS_OK);                                                                 \
    if (st_ != DS_OK && !strstr(ds_last_error(), word))                                   \
      fprintf(stderr, "%s:%d: message lacks '%s': %s\n", __FILE__, __LINE__, word, ds_last_error()); \
    EXPECT(st_ == DS_OK || strstr(ds_last_error(), word) != NULL);                        \
  } while (0)

static void test_mkdir_reasons(void) {
  EXPECT(symlink("loop", at("loop")) == 0);
  EXPECT_FAIL_WITH(ds_mkdir_p(at("loop")), strerror(ELOOP));
  EXPECT_FAIL_WITH(ds_mkdir_p(at("loop/run")), strerror(ELOOP));
  FILE *f = fopen(at("file"), "w");
  EXPECT(f != NULL);
  if (f) fclose(f);
  EXPECT_FAIL_WITH(ds_mkdir_p(at("file")), strerror(ENOTDIR));
  EXPECT_FAIL_WITH(ds_mkdir_p(at("file/run")), strerror(ENOTDIR));
  EXPECT(symlink("nowhere", at("dangling")) == 0);
  EXPECT_FAIL_WITH(ds_mkdir_p(at("dangling")), strerror(ENOENT));
  EXPECT_OK(ds_mkdir_p(at("a/b/c")));
  EXPECT_OK(ds_mkdir_p(at("a/b/c"))); /* existing: fine */
  EXPECT(symlink("a", at("link-to-dir")) == 0);
  EXPECT_OK(ds_mkdir_p(at("link-to-dir/b")));
}

static void test_read_reasons(void) {
  char *text = NULL;
  size_t len;
  EXPECT_FAIL_WITH(ds_read_file(at("loop"), &text, &len), strerror(ELOOP));
  EXPECT_FAIL_WITH(ds_read_file(at("a"), &text, &len), "a directory");
  EXPECT_FAIL_WITH(ds_read_file(at("missing"), &text, &len), strerror(ENOENT));
  ds_mapping m;
  EXPECT_FAIL_WITH(ds_map_file(at("a"), &m), "a directory");
  EXPECT_FAIL_WITH(ds_map_file(at("loop"), &m), strerror(ELOOP));
  EXPECT_FAIL_WITH(ds_write_file_atomic(at("loop/x.json"), "{}", 2), strerror(ELOOP));
  EXPECT(text == NULL);
}

/* ds_output_check: an output that is an input, lies inside an input directory, or (a directory
 * output) holds an input is refused naming the option and the input, whatever the spelling. */
static void test_output_check(void) {
  EXPECT_OK(ds_mkdir_p(at("model/sub")));
  FILE *f = fopen(at("model/config.json"), "w");
  EXPECT(f != NULL);
  if (f) fclose(f);
  f = fopen(at("data.jsonl"), "w");
  EXPECT(f != NULL);
  if (f) fclose(f);
  EXPECT(symlink("model", at("model-link")) == 0);
  EXPECT(link(at("data.jsonl"), at("data-hard.jsonl")) == 0);
  char *model = strdup(at("model")), *data = strdup(at("data.jsonl")), *missing = strdup(at("no-such-file"));
  const ds_input_path in[] = {{"--target", model}, {"--data", data}, {"--absent", NULL}, {"--missing", missing}};
  size_t n = sizeof in / sizeof in[0];
  EXPECT_FAIL_WITH(ds_output_check("--out", at("model/config.json"), DS_OUTPUT_FILE, in, n), "--target");
  EXPECT(ds_last_error() && strstr(ds_last_error(), "--out"));
  EXPECT_FAIL_WITH(ds_output_check("--out", at("model/sub/../new.json"), DS_OUTPUT_FILE, in, n), "inside");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("model-link/x/y.json"), DS_OUTPUT_FILE, in, n), "inside");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("./data.jsonl"), DS_OUTPUT_FILE, in, n), "--data");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("data-hard.jsonl"), DS_OUTPUT_FILE, in, n), "--data");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("model"), DS_OUTPUT_DIR, in, n), "--target");
  EXPECT_FAIL_WITH(ds_output_check("--out", g_dir, DS_OUTPUT_DIR, in, n), "holds");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("model"), DS_OUTPUT_FILE, in, n), "is a directory");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("data.jsonl"), DS_OUTPUT_DIR, in, n), "not a directory");
  EXPECT_FAIL_WITH(ds_output_check("--out", at("loop/x.json"), DS_OUTPUT_FILE, in, n), "--out");
  EXPECT_OK(ds_output_check("--out", at("run/new/out.json"), DS_OUTPUT_FILE, in, n)); /* beside the inputs */
  EXPECT_OK(ds_output_check("--out", at("run2"), DS_OUTPUT_DIR, in, n));
  EXPECT_OK(ds_output_check("--out", at("modelx/out.json"), DS_OUTPUT_FILE, in, n)); /* a prefix is not a parent */
  free(model);
  free(data);
  free(missing);
}

/* This process's resident pages backed by files (/proc/self/statm: resident, shared). */
static long file_pages(void) {
  long size = 0, resident = 0, shared = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return -1;
  int n = fscanf(f, "%ld %ld %ld", &size, &resident, &shared);
  fclose(f);
  return n == 3 ? shared : -1;
}

/* ds_release_mapped_pages drops a ds_map_file mapping's pages (the data reads the same after)
 * and leaves memory that is not such a mapping alone (madvise would zero heap pages). */
static void test_release_mapped_pages(void) {
  enum { N = 8 << 20 };
  unsigned char *buf = malloc(N);
  for (size_t i = 0; i < N; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
  EXPECT_OK(ds_write_file_atomic(at("map.bin"), buf, N));
  ds_mapping m;
  EXPECT_OK(ds_map_file(at("map.bin"), &m));
  unsigned sum = 0;
  for (size_t i = 0; i < N; i += 4096) sum += m.data[i]; /* every page resident */
  long before = file_pages();
  ds_release_mapped_pages(m.data + 1, N - 1); /* the first, partial page stays */
  long after = file_pages();
  long page = sysconf(_SC_PAGESIZE);
  fprintf(stderr, "  file pages resident %ld -> %ld (sum %u)\n", before, after, sum);
  EXPECT(before >= 0 && before - after >= (long)(N / page) * 9 / 10); /* other shared pages come and go */
  EXPECT(memcmp(m.data, buf, N) == 0); /* faulted back in from the file */
  unsigned char *heap = malloc(N);
  memcpy(heap, buf, N);
  ds_release_mapped_pages(heap, N); /* not a mapping: untouched */
  EXPECT(memcmp(heap, buf, N) == 0);
  ds_unmap_file(&m);
  ds_release_mapped_pages(buf, N); /* after the unmap the range is no mapping's */
  EXPECT(buf[12345] == (unsigned char)(12345u * 2654435761u >> 13));
  free(heap);
  free(buf);
}

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_fileio.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (ds_mkdir_p(g_dir) != DS_OK) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, ds_last_error());
    return 2;
  }
  TEST_RUN(test_mkdir_reasons);
  TEST_RUN(test_read_reasons);
  TEST_RUN(test_output_check);
  TEST_RUN(test_release_mapped_pages);
  return TEST_RESULT();
}
