/* safetensors: writer/reader round trip, HF checkpoint directories (single and sharded), and
 * malformed input, each refused with a status and a message naming the file and field.
 *
 * Also a helper mode for the Python interop test (tests/conformance/test_safetensors_py.py):
 *   test_safetensors --roundtrip IN OUT
 * reads IN with ds_st_open and rewrites every tensor and metadata entry to OUT with the writer. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/dtype.h"
#include "dspark/safetensors.h"
#include "dspark/fileio.h"
#include "test_util.h"

static char g_tmp[1024]; /* this run's scratch directory */

/* ---------------------------------------------------------------- helpers */

static int mkdir_p(const char *path) { return ds_mkdir_p(path) == DS_OK ? 0 : -1; }

/* Removes a scratch tree this test created (files and directories only). */
static void rm_rf(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return;
  if (S_ISDIR(sb.st_mode)) {
    DIR *d = opendir(path);
    if (d) {
      char child[1200];
      for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        rm_rf(child);
      }
      closedir(d);
    }
    rmdir(path);
  } else {
    unlink(path);
  }
}

/* g_tmp/sub[/name], creating g_tmp/sub. */
static const char *tmp_path(char *out, size_t cap, const char *sub, const char *name) {
  snprintf(out, cap, "%s/%s", g_tmp, sub);
  if (mkdir_p(out) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", out, strerror(errno));
    exit(2);
  }
  if (name) {
    size_t n = strlen(out);
    snprintf(out + n, cap - n, "/%s", name);
  }
  return out;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* An 8-byte little-endian length, the header as given, then dlen bytes 0, 1, 2, ... */
static unsigned char *make_st(const char *header, size_t dlen, size_t *len) {
  size_t hlen = strlen(header);
  *len = 8 + hlen + dlen;
  unsigned char *buf = malloc(*len ? *len : 1);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
  memcpy(buf + 8, header, hlen);
  for (size_t i = 0; i < dlen; i++) buf[8 + hlen + i] = (unsigned char)i;
  return buf;
}

/* Checks that every NULL-terminated substring occurs in the last error. */
static void expect_msg(const char *file, int line, const char *first, ...) {
  const char *msg = ds_last_error();
  va_list ap;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *))
    if (!strstr(msg, s)) {
      fprintf(stderr, "%s:%d: error message lacks \"%s\": %s\n", file, line, s, msg);
      g_test_failures++;
    }
  va_end(ap);
}

#define EXPECT_FAIL(expr, want, ...)                                                        \
  do {                                                                                      \
    ds_error_clear();                                                                       \
    ds_status got_ = (expr);                                                                \
    if (got_ != (want)) {                                                                   \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (message: %s)\n", __FILE__,       \
              __LINE__, #expr, ds_status_name(got_), ds_status_name(want), ds_last_error()); \
      g_test_failures++;                                                                    \
    } else {                                                                                \
      expect_msg(__FILE__, __LINE__, __VA_ARGS__, (const char *)NULL);                      \
    }                                                                                       \
  } while (0)

/* Parses header + dlen data bytes from memory as "bad.safetensors". */
static ds_status open_header(const char *header, size_t dlen) {
  size_t len;
  unsigned char *buf = make_st(header, dlen, &len);
  ds_safetensors *st = (ds_safetensors *)buf; /* must be reset to NULL on failure */
  ds_status status = ds_st_open_memory(buf, len, "bad.safetensors", &st);
  if (status != DS_OK && st != NULL) {
    fprintf(stderr, "ds_st_open_memory failed but left *out set\n");
    g_test_failures++;
  }
  if (status == DS_OK) ds_st_close(st);
  free(buf);
  return status;
}

static int dir_has_tmp_files(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int found = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".tmp.")) found = 1;
  closedir(d);
  return found;
}

/* ---------------------------------------------------------------- round trip */

typedef struct {
  const char *name;
  ds_dtype dtype;
  int ndim;
  int64_t shape[DS_MAX_DIMS];
  const void *data;
  size_t nbytes;
} ref_tensor;

static const float k_f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
static const float k_scalar[1] = {42.0f};
static const float k_bf16_vals[4] = {1.5f, -2.0f, 0.25f, 3.0f}; /* exact in bf16 and f16 */
static const int64_t k_i64[3] = {-1, INT64_C(1) << 40, 7};
static const int32_t k_i32[4] = {-5, 0, 2147483647, -2147483647 - 1};
static const uint8_t k_u8[5] = {0, 1, 127, 128, 255};

static void make_refs(ref_tensor *r, uint16_t *bf16, uint16_t *f16) {
  for (int i = 0; i < 4; i++) {
    bf16[i] = ds_f32_to_bf16(k_bf16_vals[i]);
    f16[i] = ds_f32_to_f16(k_bf16_vals[i]);
  }
  ref_tensor t[8] = {
      {"layers.0.q.weight", DS_F32, 2, {2, 3}, k_f32, sizeof k_f32},
      {"emb.bf16", DS_BF16, 1, {4}, bf16, 8},
      {"norm.f16", DS_F16, 2, {2, 2}, f16, 8},
      {"ids.i64", DS_I64, 1, {3}, k_i64, sizeof k_i64},
      {"ids.i32", DS_I32, 2, {2, 2}, k_i32, sizeof k_i32},
      {"mask.u8", DS_U8, 1, {5}, k_u8, sizeof k_u8},
      {"scalar", DS_F32, 0, {0}, k_scalar, 4},
      {"empty", DS_F32, 2, {0, 3}, NULL, 0},
  };
  memcpy(r, t, sizeof t);
}

static const char k_note[] = "quote \" backslash \\ newline \n tab \t utf8 \xc3\xa9 \xe2\x82\xac";

static void write_refs(const char *path, const ref_tensor *r, size_t n, const char *format) {
  ds_st_writer *w = ds_st_writer_new();
  EXPECT(w != NULL);
  for (size_t i = 0; i < n; i++)
    EXPECT_OK(ds_st_writer_add(w, r[i].name, r[i].dtype, r[i].ndim, r[i].shape, r[i].data));
  EXPECT_OK(ds_st_writer_set_metadata(w, "format", "np"));
  EXPECT_OK(ds_st_writer_set_metadata(w, "format", format)); /* replaces */
  EXPECT_OK(ds_st_writer_set_metadata(w, "note", k_note));
  EXPECT_OK(ds_st_writer_write(w, path));
  ds_st_writer_free(w);
}

static void test_round_trip(void) {
  ref_tensor r[8];
  uint16_t bf16[4], f16[4];
  make_refs(r, bf16, f16);
  char dir[1200], path[1200];
  tmp_path(dir, sizeof dir, "roundtrip", NULL);
  tmp_path(path, sizeof path, "roundtrip", "model.safetensors");
  write_text(path, "old contents, replaced atomically");
  write_refs(path, r, 8, "pt");
  EXPECT(!dir_has_tmp_files(dir));

  ds_safetensors *st = NULL;
  EXPECT_OK(ds_st_open(path, &st));
  if (!st) return;
  EXPECT(ds_st_count(st) == 8);
  EXPECT(strcmp(ds_st_path(st), path) == 0);
  for (size_t i = 0; i < 8 && i < ds_st_count(st); i++) {
    const ds_tensor_view *v = ds_st_tensor(st, i);
    EXPECT(strcmp(v->name, r[i].name) == 0); /* file order = insertion order */
    EXPECT(ds_st_find(st, r[i].name) == v);
    EXPECT(v->dtype == r[i].dtype);
    EXPECT(v->ndim == r[i].ndim);
    int64_t numel = 1;
    for (int d = 0; d < r[i].ndim; d++) {
      EXPECT(v->shape[d] == r[i].shape[d]);
      numel *= r[i].shape[d];
    }
    EXPECT(v->numel == numel);
    EXPECT(v->nbytes == r[i].nbytes);
    EXPECT(r[i].nbytes == 0 || memcmp(v->data, r[i].data, r[i].nbytes) == 0);
    EXPECT(strcmp(v->file, path) == 0);
  }
  EXPECT(ds_st_find(st, "nope") == NULL);
  EXPECT(ds_st_metadata(st, "format") && strcmp(ds_st_metadata(st, "format"), "pt") == 0);
  EXPECT(ds_st_metadata(st, "note") && strcmp(ds_st_metadata(st, "note"), k_note) == 0);
  EXPECT(ds_st_metadata(st, "missing") == NULL);
  EXPECT(ds_st_metadata_count(st) == 2);
  EXPECT(ds_st_metadata_key(st, 0) && strcmp(ds_st_metadata_key(st, 0), "format") == 0);
  EXPECT(ds_st_metadata_key(st, 2) == NULL);
  ds_st_close(st);

  /* The data section starts 8-byte aligned (header padded with spaces). */
  FILE *f = fopen(path, "rb");
  unsigned char pre[8] = {0};
  EXPECT(f && fread(pre, 1, 8, f) == 8);
  if (f) fclose(f);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | pre[i];
  EXPECT(hlen % 8 == 0);

  /* The same file as a checkpoint directory, read as fp32. */
  ds_checkpoint *ck = NULL;
  EXPECT_OK(ds_ckpt_open(dir, &ck));
  if (!ck) return;
  EXPECT(ds_ckpt_count(ck) == 8);
  EXPECT(ds_ckpt_tensor(ck, 0) && strcmp(ds_ckpt_tensor(ck, 0)->name, "layers.0.q.weight") == 0);
  EXPECT(ds_ckpt_tensor(ck, 8) == NULL);
  float out[6];
  EXPECT_OK(ds_ckpt_read_f32(ck, "layers.0.q.weight", 2, (const int64_t[]){2, 3}, out));
  for (int i = 0; i < 6; i++) EXPECT(out[i] == k_f32[i]);
  EXPECT_OK(ds_ckpt_read_f32(ck, "layers.0.q.weight", 2, (const int64_t[]){-1, 3}, out));
  EXPECT_OK(ds_ckpt_read_f32(ck, "emb.bf16", 1, (const int64_t[]){4}, out));
  for (int i = 0; i < 4; i++) EXPECT(out[i] == k_bf16_vals[i]);
  EXPECT_OK(ds_ckpt_read_f32(ck, "norm.f16", 2, (const int64_t[]){2, 2}, out));
  for (int i = 0; i < 4; i++) EXPECT(out[i] == k_bf16_vals[i]);
  EXPECT_OK(ds_ckpt_read_f32(ck, "scalar", 0, NULL, out));
  EXPECT(out[0] == 42.0f);
  EXPECT_OK(ds_ckpt_read_f32(ck, "empty", 2, (const int64_t[]){0, 3}, out));

  EXPECT_FAIL(ds_ckpt_read_f32(ck, "layers.0.q.weight", 2, (const int64_t[]){3, 2}, out), DS_ERR_FORMAT,
              "model.safetensors", "'layers.0.q.weight'", "[2, 3]", "[3, 2]");
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "layers.0.q.weight", 1, (const int64_t[]){6}, out), DS_ERR_FORMAT,
              "'layers.0.q.weight'", "[2, 3]", "[6]");
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "layers.9.q.weight", 2, (const int64_t[]){2, 3}, out), DS_ERR_NOT_FOUND,
              dir, "'layers.9.q.weight'");
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "ids.i64", 1, (const int64_t[]){3}, out), DS_ERR_UNSUPPORTED,
              "'ids.i64'", "I64");
  ds_ckpt_close(ck);
}

static void test_non_finite_weights(void) {
  char dir[1200], path[1200];
  tmp_path(dir, sizeof dir, "nonfinite", NULL);
  tmp_path(path, sizeof path, "nonfinite", "model.safetensors");
  float bad[3] = {1.0f, NAN, 2.0f};
  ds_st_writer *w = ds_st_writer_new();
  EXPECT_OK(ds_st_writer_add(w, "w", DS_F32, 1, (const int64_t[]){3}, bad));
  EXPECT_OK(ds_st_writer_write(w, path));
  ds_st_writer_free(w);
  ds_checkpoint *ck = NULL;
  EXPECT_OK(ds_ckpt_open(dir, &ck));
  float out[3];
  if (ck) EXPECT_FAIL(ds_ckpt_read_f32(ck, "w", 1, (const int64_t[]){3}, out), DS_ERR_NUMERIC, "'w'", "element 1");
  ds_ckpt_close(ck);
}

static void test_writer_errors(void) {
  float x[2] = {1, 2};
  ds_st_writer *w = ds_st_writer_new();
  EXPECT_OK(ds_st_writer_add(w, "a", DS_F32, 1, (const int64_t[]){2}, x));
  EXPECT_FAIL(ds_st_writer_add(w, "a", DS_F32, 1, (const int64_t[]){2}, x), DS_ERR_ARG, "'a'", "twice");
  EXPECT_FAIL(ds_st_writer_add(w, "b", DS_F32, 2, (const int64_t[]){2, -1}, x), DS_ERR_ARG, "'b'", "shape[1]");
  EXPECT_FAIL(ds_st_writer_add(w, "c", DS_F32, 1, (const int64_t[]){2}, NULL), DS_ERR_ARG, "'c'", "NULL");
  EXPECT_FAIL(ds_st_writer_add(w, "__metadata__", DS_F32, 1, (const int64_t[]){2}, x), DS_ERR_ARG,
              "__metadata__");
  EXPECT_FAIL(ds_st_writer_add(w, "d", DS_F32, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, x),
              DS_ERR_ARG, "'d'", "ndim");
  EXPECT_FAIL(ds_st_writer_add(w, "e", DS_F32, 3, (const int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40, 1 << 20}, x),
              DS_ERR_ARG, "'e'", "overflow");
  /* A destination in a missing directory fails and leaves nothing behind. */
  char dir[1200], path[1300];
  tmp_path(dir, sizeof dir, "writer", NULL);
  snprintf(path, sizeof path, "%s/no/such/dir/out.safetensors", dir);
  EXPECT_FAIL(ds_st_writer_write(w, path), DS_ERR_IO, "out.safetensors");
  EXPECT(!ds_file_exists(path));
  ds_st_writer_free(w);

  /* An empty file (no tensors, no metadata) is valid, like Python's save_file({}). */
  w = ds_st_writer_new();
  tmp_path(path, sizeof path, "writer", "empty.safetensors");
  EXPECT_OK(ds_st_writer_write(w, path));
  ds_st_writer_free(w);
  ds_safetensors *st = NULL;
  EXPECT_OK(ds_st_open(path, &st));
  EXPECT(ds_st_count(st) == 0);
  ds_st_close(st);
}

/* An image (ds_st_writer_image) holds the very bytes the writer writes, with reserved tensors
 * filled in place; ds_ckpt_open_memory reads it as a checkpoint and owns it. */
static void test_image_checkpoint(void) {
  const float a[3] = {1.5f, -2.0f, 0.25f}, b[2] = {4.0f, -8.5f};
  const int64_t sa[1] = {3}, sb[2] = {1, 2};
  ds_st_writer *full = ds_st_writer_new(), *lay = ds_st_writer_new();
  EXPECT_OK(ds_st_writer_add(full, "a", DS_F32, 1, sa, a));
  EXPECT_OK(ds_st_writer_add(full, "b", DS_F32, 2, sb, b));
  EXPECT_OK(ds_st_writer_add(lay, "a", DS_F32, 1, sa, a));
  EXPECT_OK(ds_st_writer_reserve(lay, "b", DS_F32, 2, sb));
  char path[1300];
  tmp_path(path, sizeof path, "image", "full.safetensors");
  EXPECT_OK(ds_st_writer_write(full, path));
  EXPECT_FAIL(ds_st_writer_write(lay, path), DS_ERR_ARG, "'b'", "reserved");
  unsigned char *img = NULL;
  size_t size = 0, off[2] = {0, 0};
  EXPECT_OK(ds_st_writer_image(lay, "mem", &img, &size, off));
  char *file = NULL;
  size_t flen = 0;
  EXPECT_OK(ds_read_file(path, &file, &flen));
  EXPECT(img && file && size == flen && off[1] == off[0] + sizeof a && off[1] + sizeof b == size);
  if (img && file && size == flen && off[1] + sizeof b == size) {
    memcpy(img + off[1], b, sizeof b); /* the reserved tensor filled in place */
    EXPECT(memcmp(img, file, size) == 0);
  }
  free(file);
  ds_checkpoint *ck = NULL;
  EXPECT_OK(ds_ckpt_open_memory(img, size, "mem.gguf", &ck));
  float got[3] = {0, 0, 0};
  EXPECT_OK(ds_ckpt_read_f32(ck, "b", 2, sb, got));
  EXPECT(got[0] == b[0] && got[1] == b[1] && ds_ckpt_count(ck) == 2);
  EXPECT_OK(ds_ckpt_read_f32(ck, "b", 2, sb, got)); /* read again: the image is kept */
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "c", 1, sa, got), DS_ERR_NOT_FOUND, "mem.gguf", "'c'");
  /* read once: a tensor is given back after its read, and a second read is refused by name */
  ds_ckpt_read_once(ck);
  EXPECT_OK(ds_ckpt_read_f32(ck, "a", 1, sa, got));
  EXPECT(got[0] == a[0] && got[1] == a[1] && got[2] == a[2]);
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "a", 1, sa, got), DS_ERR_ARG, "mem.gguf", "'a'", "once");
  EXPECT_OK(ds_ckpt_read_f32(ck, "b", 2, sb, got));
  ds_ckpt_close(ck);
  /* a bad image is refused naming its label, and freed */
  EXPECT_OK(ds_st_writer_image(full, "mem", &img, &size, NULL));
  if (img) img[8] = '[';
  ck = (ds_checkpoint *)path;
  EXPECT_FAIL(ds_ckpt_open_memory(img, size, "bad image", &ck), DS_ERR_FORMAT, "bad image");
  EXPECT(ck == NULL);
  ds_st_writer_free(full);
  ds_st_writer_free(lay);
}

/* An image of 2 MiB or more starts on a 2 MiB boundary with huge pages advised (a GGUF's 16-bit
 * matrices are decoded from it); its bytes, a reserved tensor filled in place and the read-once
 * give-back (4 KiB pages of a huge one) behave as in a small image. */
static void test_image_huge_pages(void) {
  const size_t mib2 = (size_t)2 << 20;
  const int64_t sbig[1] = {(int64_t)(3 * mib2 / sizeof(float)) + 1001}, ssmall[1] = {3};
  const float small[3] = {0.5f, -1.0f, 2.0f};
  ds_st_writer *w = ds_st_writer_new();
  EXPECT_OK(ds_st_writer_reserve(w, "big", DS_F32, 1, sbig));
  EXPECT_OK(ds_st_writer_add(w, "small", DS_F32, 1, ssmall, small));
  unsigned char *img = NULL;
  size_t size = 0, off[2] = {0, 0};
  EXPECT_OK(ds_st_writer_image(w, "mem", &img, &size, off));
  ds_st_writer_free(w);
  EXPECT(img != NULL && (uintptr_t)img % mib2 == 0);
  if (!img) return;
  float *big = (float *)(img + off[0]);
  for (int64_t i = 0; i < sbig[0]; i++) big[i] = (float)(i % 1000) - 500.0f;
  long kb = huge_kb_at(img);
  if (kb >= 0 && thp_advised_at_fault()) {
    if (kb < 2048) fprintf(stderr, "a 6 MiB image holds %ld kB of huge pages\n", kb);
    EXPECT(kb >= 2048);
  }
  ds_checkpoint *ck = NULL;
  EXPECT_OK(ds_ckpt_open_memory(img, size, "big image", &ck)); /* owns the image from here */
  if (!ck) return;
  ds_ckpt_read_once(ck);
  float got[3] = {0, 0, 0};
  EXPECT_OK(ds_ckpt_read_f32(ck, "small", 1, ssmall, got)); /* its pages given back: not big's */
  EXPECT(got[0] == small[0] && got[1] == small[1] && got[2] == small[2]);
  float *all = malloc((size_t)sbig[0] * sizeof(float));
  EXPECT(all != NULL);
  if (all) {
    EXPECT_OK(ds_ckpt_read_f32(ck, "big", 1, sbig, all));
    int64_t bad = -1;
    for (int64_t i = 0; i < sbig[0] && bad < 0; i++)
      if (all[i] != (float)(i % 1000) - 500.0f) bad = i;
    EXPECT(bad < 0);
  }
  free(all);
  ds_ckpt_close(ck);
}

/* ---------------------------------------------------------------- sharded checkpoints */

static void write_shard(const char *sub, const char *file, const char *const *names, size_t n) {
  char path[1200];
  tmp_path(path, sizeof path, sub, file);
  ds_st_writer *w = ds_st_writer_new();
  for (size_t i = 0; i < n; i++)
    EXPECT_OK(ds_st_writer_add(w, names[i], DS_F32, 2, (const int64_t[]){2, 3}, k_f32));
  EXPECT_OK(ds_st_writer_write(w, path));
  ds_st_writer_free(w);
}

static void write_index(const char *sub, const char *weight_map) {
  char path[1200], text[2048];
  tmp_path(path, sizeof path, sub, "model.safetensors.index.json");
  snprintf(text, sizeof text, "{\"metadata\": {\"total_size\": 72}, \"weight_map\": {%s}}", weight_map);
  write_text(path, text);
}

static const char k_s1[] = "model-00001-of-00002.safetensors";
static const char k_s2[] = "model-00002-of-00002.safetensors";

static void sharded_dir(const char *sub) {
  write_shard(sub, k_s1, (const char *const[]){"a", "b"}, 2);
  write_shard(sub, k_s2, (const char *const[]){"c"}, 1);
}

static void test_sharded(void) {
  char dir[1200];
  tmp_path(dir, sizeof dir, "sharded", NULL);
  sharded_dir("sharded");
  write_index("sharded", "\"c\": \"model-00002-of-00002.safetensors\", "
                         "\"a\": \"model-00001-of-00002.safetensors\", "
                         "\"b\": \"model-00001-of-00002.safetensors\"");
  ds_checkpoint *ck = NULL;
  EXPECT_OK(ds_ckpt_open(dir, &ck));
  if (!ck) return;
  EXPECT(ds_ckpt_count(ck) == 3);
  EXPECT(ds_ckpt_tensor(ck, 0) && strcmp(ds_ckpt_tensor(ck, 0)->name, "c") == 0); /* index order */
  const ds_tensor_view *c = ds_ckpt_find(ck, "c"), *a = ds_ckpt_find(ck, "a");
  EXPECT(c && strstr(c->file, k_s2));
  EXPECT(a && strstr(a->file, k_s1));
  EXPECT(ds_ckpt_find(ck, "d") == NULL);
  float out[6];
  EXPECT_OK(ds_ckpt_read_f32(ck, "b", 2, (const int64_t[]){2, 3}, out));
  for (int i = 0; i < 6; i++) EXPECT(out[i] == k_f32[i]);
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "c", 2, (const int64_t[]){2, 4}, out), DS_ERR_FORMAT, k_s2, "'c'",
              "[2, 3]", "[2, 4]");
  EXPECT_FAIL(ds_ckpt_read_f32(ck, "d", 2, (const int64_t[]){2, 3}, out), DS_ERR_NOT_FOUND, "'d'");
  ds_ckpt_close(ck);
}

static void test_sharded_errors(void) {
  char dir[1200];
  ds_checkpoint *ck = NULL;

  tmp_path(dir, sizeof dir, "shard_missing", NULL);
  sharded_dir("shard_missing");
  write_index("shard_missing", "\"a\": \"model-00001-of-00002.safetensors\", \"x\": \"model-00003.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_NOT_FOUND, "index.json", "'x'", "model-00003.safetensors",
              "does not exist");
  EXPECT(ck == NULL);

  tmp_path(dir, sizeof dir, "shard_lacks", NULL);
  sharded_dir("shard_lacks");
  write_index("shard_lacks", "\"a\": \"model-00001-of-00002.safetensors\", \"z\": \"model-00002-of-00002.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_NOT_FOUND, "index.json", "'z'", k_s2, "does not contain");

  tmp_path(dir, sizeof dir, "shard_escape", NULL);
  sharded_dir("shard_escape");
  write_index("shard_escape", "\"a\": \"../shard_lacks/model-00001-of-00002.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "index.json", "'a'", "../shard_lacks");
  write_index("shard_escape", "\"a\": \"sub/../../x.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "'a'", "sub/../../x");
  write_index("shard_escape", "\"a\": \"/etc/passwd\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "'a'", "/etc/passwd");
  write_index("shard_escape", "\"a\": 3");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "weight_map['a']");
  write_index("shard_escape", "\"a\": \"model-00001-of-00002.safetensors\", "
                              "\"a\": \"model-00001-of-00002.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "'a'", "more than once");

  char path[1200];
  tmp_path(path, sizeof path, "shard_escape", "model.safetensors.index.json");
  write_text(path, "{\"weight_map\": {\"a\": ");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "model.safetensors.index.json", "JSON");
  write_text(path, "{\"metadata\": {}}");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "model.safetensors.index.json", "weight_map");

  /* A corrupt shard: the error names the index, the shard file and the problem. */
  tmp_path(dir, sizeof dir, "shard_corrupt", NULL);
  sharded_dir("shard_corrupt");
  tmp_path(path, sizeof path, "shard_corrupt", k_s2);
  write_text(path, "abc");
  write_index("shard_corrupt", "\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"");
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_FORMAT, "index.json", k_s2, "shorter than");

  tmp_path(dir, sizeof dir, "empty_dir", NULL);
  EXPECT_FAIL(ds_ckpt_open(dir, &ck), DS_ERR_NOT_FOUND, dir, "model.safetensors");
  EXPECT(ck == NULL);
}

/* ---------------------------------------------------------------- malformed files */

static void test_bad_prefix(void) {
  unsigned char buf[32] = {0};
  ds_safetensors *st = NULL;
  EXPECT_FAIL(ds_st_open_memory(buf, 5, "bad.safetensors", &st), DS_ERR_FORMAT, "bad.safetensors",
              "5 bytes", "shorter than");
  EXPECT_FAIL(ds_st_open_memory(buf, 0, "bad.safetensors", &st), DS_ERR_FORMAT, "bad.safetensors");
  /* header length 1000, file 32 bytes */
  buf[0] = 0xe8, buf[1] = 0x03;
  EXPECT_FAIL(ds_st_open_memory(buf, sizeof buf, "bad.safetensors", &st), DS_ERR_FORMAT,
              "bad.safetensors", "header length 1000", "24 bytes");
  /* absurd header length (2^40): refused before anything is allocated or read */
  memset(buf, 0, 8);
  buf[5] = 1;
  EXPECT_FAIL(ds_st_open_memory(buf, sizeof buf, "bad.safetensors", &st), DS_ERR_FORMAT,
              "bad.safetensors", "1099511627776", "exceeds");
  memset(buf, 0xff, 8);
  EXPECT_FAIL(ds_st_open_memory(buf, sizeof buf, "bad.safetensors", &st), DS_ERR_FORMAT, "exceeds");
  EXPECT(st == NULL);

  /* The same through real files. */
  char path[1200];
  tmp_path(path, sizeof path, "bad", "short.safetensors");
  write_bytes(path, "\x01\x02\x03", 3);
  EXPECT_FAIL(ds_st_open(path, &st), DS_ERR_FORMAT, path, "shorter than");
  tmp_path(path, sizeof path, "bad", "zero.safetensors");
  write_bytes(path, "", 0);
  EXPECT_FAIL(ds_st_open(path, &st), DS_ERR_FORMAT, path, "0 bytes");
  tmp_path(path, sizeof path, "bad", "does-not-exist.safetensors");
  EXPECT_FAIL(ds_st_open(path, &st), DS_ERR_IO, path);
}

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}"

static void test_bad_header(void) {
  const ds_status F = DS_ERR_FORMAT;
  /* Valid edge cases first: the parser is not simply rejecting everything. */
  EXPECT_OK(open_header("{}", 0));
  EXPECT_OK(open_header("{}      ", 0));
  EXPECT_OK(open_header(" \n{\"__metadata__\":null}", 0));
  EXPECT_OK(open_header("{" T_A "}", 16));
  EXPECT_OK(open_header("{\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}," T_A "}", 16));
  EXPECT_OK(open_header("{\"__metadata__\":{\"k\":\"v\"}," T_A ",\"extra\":{\"dtype\":\"I8\",\"shape\":[],"
                        "\"data_offsets\":[16,17]}}",
                        17));

  EXPECT_FAIL(open_header("{\"a\": {\"dtype\": \"F32\", ", 0), F, "bad.safetensors", "not valid JSON");
  EXPECT_FAIL(open_header("[1, 2]", 0), F, "bad.safetensors", "does not start with '{'");
  EXPECT_FAIL(open_header("{} x", 0), F, "bad.safetensors", "trailing garbage");
  EXPECT_FAIL(open_header("{\"a\":\"\xff\"}", 0), F, "bad.safetensors", "UTF-8");
  EXPECT_FAIL(open_header("{\"w\": [1, 2]}", 0), F, "bad.safetensors", "'w'", "must be an object");
  EXPECT_FAIL(open_header("{\"w\": {\"shape\":[4],\"data_offsets\":[0,16]}}", 16), F, "'w'", "dtype");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16), F,
              "bad.safetensors", "'w'", "unknown dtype 'F33'");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4),
              DS_ERR_UNSUPPORTED, "'w'", "F8_E4M3");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 16), F, "'w'",
              "shape");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,16]}}", 16), F,
              "bad.safetensors", "'w'", "shape[1] = -3", "negative");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,16]}}", 16), F,
              "'w'", "shape[0]");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", 16), F,
              "'w'", "shape[0]");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}", 16), F,
              "'w'", "shape[0]");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                          "\"data_offsets\":[0,16]}}",
                          16),
              F, "bad.safetensors", "'w'", "overflows");
  /* 2^62 elements fit in 64 bits, but not times 4 bytes */
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[2147483648,2147483648],"
                          "\"data_offsets\":[0,16]}}",
                          16),
              F, "'w'", "overflows");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,4],\"data_offsets\":[0,16]}}", 16),
              DS_ERR_UNSUPPORTED, "'w'", "dimensions");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", 16), F, "'w'",
              "data_offsets");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,32]}}", 16), F,
              "'w'", "data_offsets");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}", 16), F,
              "'w'", "data_offsets");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,0]}}", 16), F,
              "bad.safetensors", "'w'", "begin > end");
  EXPECT_FAIL(open_header("{\"w\": {\"dtype\":\"F32\",\"shape\":[1000],\"data_offsets\":[0,4000]}}", 16), F,
              "bad.safetensors", "'w'", "[0, 4000]", "16 bytes");
  EXPECT_FAIL(open_header("{\"layers.0.q.weight\": {\"dtype\":\"F32\",\"shape\":[4,8],"
                          "\"data_offsets\":[0,96]}}",
                          96),
              F,
              "bad.safetensors: tensor 'layers.0.q.weight': data_offsets [0, 96] hold 96 bytes but F32 x "
              "[4, 8] needs 128");
  /* overlap, gap, trailing bytes, data not starting at 0 */
  EXPECT_FAIL(open_header("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24), F,
              "bad.safetensors", "'b'", "overlap", "'a'");
  EXPECT_FAIL(open_header("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[20,36]}}", 36), F,
              "bad.safetensors", "'b'", "gap");
  EXPECT_FAIL(open_header("{\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]}}", 20), F, "'b'",
              "gap");
  EXPECT_FAIL(open_header("{" T_A "}", 20), F, "bad.safetensors", "trailing bytes");
  EXPECT_FAIL(open_header("{" T_A "," T_A "}", 16), F, "bad.safetensors", "'a'", "more than once");
  EXPECT_FAIL(open_header("{\"__metadata__\":{\"k\":1}}", 0), F, "bad.safetensors", "'k'");
  EXPECT_FAIL(open_header("{\"__metadata__\":[]}", 0), F, "bad.safetensors", "__metadata__");
  EXPECT_FAIL(open_header("{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", 0), F, "'k'", "more than once");
}

static void test_truncated_file(void) {
  char path[1200];
  tmp_path(path, sizeof path, "bad", "truncated.safetensors");
  ds_st_writer *w = ds_st_writer_new();
  EXPECT_OK(ds_st_writer_add(w, "a", DS_F32, 2, (const int64_t[]){2, 3}, k_f32));
  EXPECT_OK(ds_st_writer_add(w, "b", DS_F32, 2, (const int64_t[]){2, 3}, k_f32));
  EXPECT_OK(ds_st_writer_write(w, path));
  ds_st_writer_free(w);
  struct stat sb;
  EXPECT(stat(path, &sb) == 0);
  EXPECT(truncate(path, sb.st_size - 5) == 0);
  ds_safetensors *st = NULL;
  EXPECT_FAIL(ds_st_open(path, &st), DS_ERR_FORMAT, path, "'b'", "truncated");
  EXPECT(st == NULL);
  /* cut inside the header */
  EXPECT(truncate(path, 20) == 0);
  EXPECT_FAIL(ds_st_open(path, &st), DS_ERR_FORMAT, path, "header length");
}

/* ---------------------------------------------------------------- --roundtrip helper */

static int roundtrip(const char *in, const char *out) {
  ds_safetensors *st = NULL;
  ds_st_writer *w = NULL;
  ds_status status = ds_st_open(in, &st);
  if (status == DS_OK) w = ds_st_writer_new();
  if (status == DS_OK && !w) status = DS_ERR_NOMEM;
  for (size_t i = 0; status == DS_OK && i < ds_st_count(st); i++) {
    const ds_tensor_view *v = ds_st_tensor(st, i);
    status = ds_st_writer_add(w, v->name, v->dtype, v->ndim, v->shape, v->data);
  }
  for (size_t i = 0; status == DS_OK && i < ds_st_metadata_count(st); i++) {
    const char *k = ds_st_metadata_key(st, i);
    status = ds_st_writer_set_metadata(w, k, ds_st_metadata(st, k));
  }
  if (status == DS_OK) status = ds_st_writer_write(w, out);
  ds_st_writer_free(w);
  ds_st_close(st);
  if (status != DS_OK) {
    fprintf(stderr, "test_safetensors --roundtrip: %s\n", ds_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--roundtrip") == 0) return roundtrip(argv[2], argv[3]);
  if (argc != 1) {
    fprintf(stderr, "usage: test_safetensors [--roundtrip IN OUT]\n");
    return 2;
  }
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_tmp, sizeof g_tmp, "%s/test_safetensors.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (mkdir_p(g_tmp) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", g_tmp, strerror(errno));
    return 2;
  }
  TEST_RUN(test_round_trip);
  TEST_RUN(test_non_finite_weights);
  TEST_RUN(test_writer_errors);
  TEST_RUN(test_image_checkpoint);
  TEST_RUN(test_image_huge_pages);
  TEST_RUN(test_sharded);
  TEST_RUN(test_sharded_errors);
  TEST_RUN(test_bad_prefix);
  TEST_RUN(test_bad_header);
  TEST_RUN(test_truncated_file);
  if (!g_test_failures) rm_rf(g_tmp); /* keep the files of a failing run for inspection */
  return TEST_RESULT();
}
