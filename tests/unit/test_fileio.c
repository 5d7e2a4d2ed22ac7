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

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_fileio.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (ds_mkdir_p(g_dir) != DS_OK) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, ds_last_error());
    return 2;
  }
  TEST_RUN(test_mkdir_reasons);
  TEST_RUN(test_read_reasons);
  return TEST_RESULT();
}
