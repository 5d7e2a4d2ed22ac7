/* Content hashes of the cache: files, the target's weights (a checkpoint), strings (xxh64, seed 0). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "dspark/safetensors.h"

uint64_t ds_cache_hash_string(const char *s) { return XXH64(s, strlen(s), 0); }

/* Reads through a small buffer (not a mapping), so hashing a large shard does not grow the
 * process's resident memory. */
ds_status ds_cache_hash_file(const char *path, uint64_t *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  enum { CHUNK = 1 << 20 };
  unsigned char *buf = ds_malloc(CHUNK, "hash buffer");
  XXH64_state_t *h = XXH64_createState();
  ds_status st = buf && h ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: cannot allocate the hash state", path);
  if (st == DS_OK) XXH64_reset(h, 0);
  while (st == DS_OK) {
    ssize_t r = read(fd, buf, CHUNK);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) st = DS_FAIL(DS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (r <= 0) break;
    XXH64_update(h, buf, (size_t)r);
  }
  if (st == DS_OK) *out = XXH64_digest(h);
  XXH64_freeState(h);
  free(buf);
  close(fd);
  return st;
}

static int by_name(const void *a, const void *b) {
  const ds_tensor_view *x = *(const ds_tensor_view *const *)a, *y = *(const ds_tensor_view *const *)b;
  return strcmp(x->name, y->name);
}

static void put_i64(XXH64_state_t *h, int64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
  XXH64_update(h, b, 8);
}

ds_status ds_cache_hash_checkpoint(const ds_checkpoint *ck, uint64_t *out) {
  size_t n = ds_ckpt_count(ck);
  const ds_tensor_view **v = ds_malloc((n ? n : 1) * sizeof *v, "tensor list");
  XXH64_state_t *h = XXH64_createState();
  if (!v || !h) {
    free(v);
    XXH64_freeState(h);
    return DS_FAIL(DS_ERR_NOMEM, "cannot allocate the weight hash");
  }
  for (size_t i = 0; i < n; i++) v[i] = ds_ckpt_tensor(ck, i);
  qsort(v, n, sizeof *v, by_name);
  XXH64_reset(h, 0);
  for (size_t i = 0; i < n; i++) {
    const char *dt = ds_dtype_name(v[i]->dtype);
    XXH64_update(h, v[i]->name, strlen(v[i]->name) + 1);
    XXH64_update(h, dt, strlen(dt) + 1);
    put_i64(h, v[i]->ndim);
    for (int d = 0; d < v[i]->ndim; d++) put_i64(h, v[i]->shape[d]);
    if (v[i]->nbytes) XXH64_update(h, v[i]->data, v[i]->nbytes);
  }
  *out = XXH64_digest(h);
  XXH64_freeState(h);
  free(v);
  return DS_OK;
}
