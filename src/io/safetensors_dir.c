/* HF checkpoint directories: model.safetensors, or model.safetensors.index.json and its
 * shards, validated as one set of tensors (include/dspark/safetensors.h). */
#define _DEFAULT_SOURCE /* madvise */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/json_util.h"
#include "dspark/dtype.h"
#include "dspark/safetensors.h"
#include "io/safetensors_internal.h"

/* ---------------------------------------------------------------- checkpoint directory */

static const char k_single_name[] = "model.safetensors";
static const char k_index_name[] = "model.safetensors.index.json";

struct ds_checkpoint {
  char *dir;
  ds_safetensors **shards;
  size_t n_shards;
  const ds_tensor_view **views;   /* listing order: file order, or weight_map order */
  const ds_tensor_view **by_name; /* sorted by name */
  size_t n;
  unsigned char *image; /* ds_ckpt_open_memory: the image its one shard parses (owned) */
  size_t image_size;
  int read_once;          /* ds_ckpt_read_once: an image's tensors given back once read */
  unsigned char *released; /* [n], by by_name slot: given back (an image's, read_once) */
};

void ds_ckpt_close(ds_checkpoint *ck) {
  if (!ck) return;
  for (size_t i = 0; i < ck->n_shards; i++) ds_st_close(ck->shards[i]);
  free(ck->shards);
  free(ck->views);
  free(ck->by_name);
  free(ck->dir);
  free(ck->released);
  ds_st_image_free(ck->image, ck->image_size); /* after the shard that points into it */
  free(ck);
}

/* A shard name must stay inside the checkpoint directory: relative, no ".." component. */
static int shard_name_ok(const char *s) {
  if (!s[0] || s[0] == '/') return 0;
  for (const char *c = s; *c;) {
    size_t len = strcspn(c, "/");
    if (len == 2 && c[0] == '.' && c[1] == '.') return 0;
    c += len;
    if (*c == '/') c++;
  }
  return 1;
}

static ds_status ckpt_add_shard(ds_checkpoint *ck, ds_safetensors *st) {
  ds_safetensors **s = realloc(ck->shards, (ck->n_shards + 1) * sizeof *s);
  if (!s) {
    ds_st_close(st);
    return DS_FAIL(DS_ERR_NOMEM, "%s: cannot grow the shard table", ck->dir);
  }
  ck->shards = s;
  ck->shards[ck->n_shards++] = st;
  return DS_OK;
}

static ds_status ckpt_open_index(ds_checkpoint *ck, const char *index_path) {
  char *text = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(index_path, &text, &len));
  ds_status status = DS_OK;
  cJSON *root = ds_json_parse(text, len, index_path, &status);
  const char **shard_names = NULL; /* parallel to ck->shards, borrowed from root */
  char *shard_path = NULL;
  if (!root) goto done;
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
    status = DS_FAIL(DS_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
    goto done;
  }
  size_t n = 0;
  for (const cJSON *c = wm->child; c; c = c->next) n++;
  ck->views = ds_calloc(n, sizeof *ck->views, "checkpoint tensor table");
  ck->by_name = ds_calloc(n, sizeof *ck->by_name, "checkpoint name index");
  shard_names = ds_calloc(n, sizeof *shard_names, "checkpoint shard names");
  if (!ck->views || !ck->by_name || !shard_names) { status = DS_ERR_NOMEM; goto done; }

  for (const cJSON *c = wm->child; c; c = c->next) {
    if (!cJSON_IsString(c)) {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: weight_map['%s'] must be a shard file name", index_path, c->string);
      goto done;
    }
    const char *shard = c->valuestring;
    if (!shard_name_ok(shard)) {
      status = DS_FAIL(DS_ERR_FORMAT,
                       "%s: weight_map['%s'] = '%s' is not a file name inside the checkpoint directory",
                       index_path, c->string, shard);
      goto done;
    }
    /* Shards are few (tens), tensors many: a linear scan over open shards is enough. */
    size_t si = 0;
    while (si < ck->n_shards && strcmp(shard_names[si], shard) != 0) si++;
    if (si == ck->n_shards) {
      shard_path = ds_path_join(ck->dir, shard);
      if (!shard_path) { status = DS_ERR_NOMEM; goto done; }
      int there = 0;
      if ((status = ds_path_probe(shard_path, &there)) != DS_OK) {
        ds_error_wrap(status, "%s: weight_map['%s'] names shard '%s'", index_path, c->string, shard);
        goto done;
      }
      if (!there) {
        status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: weight_map['%s'] names shard '%s', but %s does not exist",
                         index_path, c->string, shard, shard_path);
        goto done;
      }
      ds_safetensors *st;
      if ((status = ds_st_open(shard_path, &st)) != DS_OK) {
        ds_error_wrap(status, "%s: shard '%s'", index_path, shard);
        goto done;
      }
      if ((status = ckpt_add_shard(ck, st)) != DS_OK) goto done;
      shard_names[si] = shard;
      free(shard_path);
      shard_path = NULL;
    }
    const ds_tensor_view *v = ds_st_find(ck->shards[si], c->string);
    if (!v) {
      status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: weight_map lists tensor '%s' in shard '%s', but %s does not contain it",
                       index_path, c->string, shard, ds_st_path(ck->shards[si]));
      goto done;
    }
    ck->views[ck->n] = v;
    ck->by_name[ck->n] = v;
    ck->n++;
  }
  qsort(ck->by_name, ck->n, sizeof *ck->by_name, st_cmp_view_name);
  for (size_t i = 1; i < ck->n; i++)
    if (strcmp(ck->by_name[i - 1]->name, ck->by_name[i]->name) == 0) {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: weight_map lists tensor '%s' more than once", index_path,
                       ck->by_name[i]->name);
      goto done;
    }

done:
  free(shard_path);
  free(shard_names);
  cJSON_Delete(root);
  free(text);
  return status;
}

/* One shard's tensors as the checkpoint's, in file order and by name. */
static ds_status ckpt_take_single(ds_checkpoint *ck, ds_safetensors *st) {
  DS_TRY(ckpt_add_shard(ck, st));
  ck->n = ds_st_count(st);
  ck->views = ds_calloc(ck->n, sizeof *ck->views, "checkpoint tensor table");
  ck->by_name = ds_calloc(ck->n, sizeof *ck->by_name, "checkpoint name index");
  if (!ck->views || !ck->by_name) return DS_ERR_NOMEM;
  for (size_t i = 0; i < ck->n; i++) ck->views[i] = ck->by_name[i] = ds_st_tensor(st, i);
  qsort(ck->by_name, ck->n, sizeof *ck->by_name, st_cmp_view_name);
  return DS_OK;
}

ds_status ds_ckpt_open_memory(unsigned char *image, size_t size, const char *label, ds_checkpoint **out) {
  if (!out) {
    ds_st_image_free(image, size);
    return DS_FAIL(DS_ERR_ARG, "ds_ckpt_open_memory: out is NULL");
  }
  *out = NULL;
  if (!label) label = "<memory>";
  ds_checkpoint *ck = ds_calloc(1, sizeof *ck, "checkpoint");
  if (!ck) {
    ds_st_image_free(image, size);
    return DS_ERR_NOMEM;
  }
  ck->image = image;
  ck->image_size = size;
  ck->dir = st_dup_str(label, "label");
  ds_safetensors *st = NULL;
  ds_status status = ck->dir ? ds_st_open_memory(image, size, label, &st) : DS_ERR_NOMEM;
  if (status == DS_OK) status = ckpt_take_single(ck, st);
  if (status == DS_OK && !(ck->released = ds_calloc(ck->n ? ck->n : 1, 1, "checkpoint release flags")))
    status = DS_ERR_NOMEM;
  if (status != DS_OK) {
    ds_ckpt_close(ck);
    return status;
  }
  *out = ck;
  return DS_OK;
}

ds_status ds_ckpt_open(const char *dir, ds_checkpoint **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_ckpt_open: out is NULL");
  *out = NULL;
  if (!dir) return DS_FAIL(DS_ERR_ARG, "ds_ckpt_open: dir is NULL");
  ds_checkpoint *ck = ds_calloc(1, sizeof *ck, "checkpoint");
  if (!ck) return DS_ERR_NOMEM;
  ds_status status = DS_OK;
  char *single = NULL, *index = NULL;
  ck->dir = st_dup_str(dir, "path");
  single = ds_path_join(dir, k_single_name);
  index = ds_path_join(dir, k_index_name);
  if (!ck->dir || !single || !index) { status = DS_ERR_NOMEM; goto done; }

  /* Same preference as transformers: the single file wins over an index. A name that is there
   * but unreachable (a symlink loop, a dangling link, no permission) is reported as such, not
   * as missing, and does not fall through to the index. */
  int single_there = 0, index_there = 0;
  if ((status = ds_path_probe(single, &single_there)) != DS_OK) goto done;
  if (!single_there && (status = ds_path_probe(index, &index_there)) != DS_OK) goto done;
  if (single_there) {
    ds_safetensors *st;
    if ((status = ds_st_open(single, &st)) != DS_OK) goto done;
    status = ckpt_take_single(ck, st);
  } else if (index_there) {
    status = ckpt_open_index(ck, index);
  } else {
    status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: neither %s nor %s found (not a Hugging Face checkpoint directory?)",
                     dir, k_single_name, k_index_name);
  }

done:
  free(single);
  free(index);
  if (status != DS_OK) {
    ds_ckpt_close(ck);
    return status;
  }
  *out = ck;
  return DS_OK;
}

void ds_ckpt_read_once(ds_checkpoint *ck) {
  if (ck && ck->image) ck->read_once = 1;
}

/* The by_name slot of a tensor (binary search), n when absent. */
static size_t slot_of(const ds_checkpoint *ck, const ds_tensor_view *v) {
  size_t lo = 0, hi = ck->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(ck->by_name[mid]->name, v->name);
    if (c == 0) return mid;
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return ck->n;
}

/* An image's tensor, read under read_once: its whole pages given back (the edges it shares with
 * its neighbours stay). The flags are the checkpoint's bookkeeping, not its tensors: a const
 * checkpoint is still the same set of tensors. */
static void release_tensor(const ds_checkpoint *ck, const ds_tensor_view *v) {
  size_t slot = slot_of(ck, v);
  if (!ck->read_once || slot == ck->n) return;
  ck->released[slot] = 1;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)v->data, b = a + v->nbytes;
  a = (a + page - 1) / page * page;
  b = b / page * page;
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

const ds_tensor_view *ds_ckpt_find(const ds_checkpoint *ck, const char *name) {
  if (!ck || !name) return NULL;
  return st_find_in_sorted(ck->by_name, ck->n, name);
}

size_t ds_ckpt_count(const ds_checkpoint *ck) { return ck ? ck->n : 0; }

const ds_tensor_view *ds_ckpt_tensor(const ds_checkpoint *ck, size_t i) {
  return ck && i < ck->n ? ck->views[i] : NULL;
}

/* The tensor `name`, with ndim / shape as asked (a shape entry < 0 matches anything) and a
 * float dtype; fn names the caller in an argument error. */
static ds_status find_float_tensor(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                                   const char *fn, const ds_tensor_view **out) {
  *out = NULL;
  if (!ck || !name || ndim < 0 || ndim > DS_MAX_DIMS || (ndim > 0 && !shape))
    return DS_FAIL(DS_ERR_ARG, "%s: invalid arguments for tensor '%s'", fn, name ? name : "(null)");
  const ds_tensor_view *v = ds_ckpt_find(ck, name);
  if (!v)
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' not found in the checkpoint (%zu tensors)",
                   ck->dir, name, ck->n);
  int match = v->ndim == ndim;
  for (int d = 0; match && d < ndim; d++)
    if (shape[d] >= 0 && shape[d] != v->shape[d]) match = 0;
  if (!match) {
    char have[256], want[256];
    st_format_shape(have, sizeof have, v->ndim, v->shape);
    st_format_shape(want, sizeof want, ndim, shape);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s but %s was expected (-1 = any)",
                   v->file, name, have, want);
  }
  if (ck->read_once && ck->released[slot_of(ck, v)])
    return DS_FAIL(DS_ERR_ARG, "%s: tensor '%s' was already read once and given back (ds_ckpt_read_once)", ck->dir,
                   name);
  if (v->dtype != DS_F32 && v->dtype != DS_F16 && v->dtype != DS_BF16 && v->dtype != DS_F64)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; only F32/F16/BF16/F64 convert to F32",
                   v->file, name, ds_dtype_name(v->dtype));
  *out = v;
  return DS_OK;
}

static ds_status nonfinite_weight(const ds_tensor_view *v, size_t at, float value) {
  return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s': element %zu is %g (non-finite weight)", v->file, v->name, at,
                 (double)value);
}

ds_status ds_ckpt_read_f32(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                           float *dst) {
  const ds_tensor_view *v;
  DS_TRY(find_float_tensor(ck, name, ndim, shape, "ds_ckpt_read_f32", &v));
  if (!dst) return DS_FAIL(DS_ERR_ARG, "ds_ckpt_read_f32: no destination for tensor '%s'", name);
  /* Convert in cache-sized chunks and check each chunk while it is hot: non-finite weights
   * mean a corrupt checkpoint, and must not be trained on silently. */
  const size_t chunk = 16384, esize = ds_dtype_size(v->dtype), numel = (size_t)v->numel;
  const unsigned char *src = v->data;
  for (size_t off = 0; off < numel; off += chunk) {
    size_t m = numel - off < chunk ? numel - off : chunk;
    ds_status status = ds_convert_to_f32(dst + off, src + off * esize, v->dtype, m);
    if (status != DS_OK) return ds_error_wrap(status, "%s: tensor '%s'", v->file, name);
    for (size_t i = 0; i < m; i++)
      if (!isfinite(dst[off + i])) return nonfinite_weight(v, off + i, dst[off + i]);
  }
  release_tensor(ck, v);
  return DS_OK;
}

ds_status ds_ckpt_view_checked(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                               const ds_tensor_view **out) {
  const ds_tensor_view *v;
  DS_TRY(find_float_tensor(ck, name, ndim, shape, "ds_ckpt_view_checked", &v));
  const unsigned char *src = v->data;
  size_t numel = (size_t)v->numel;
  if (v->dtype == DS_BF16 || v->dtype == DS_F16) {
    /* A 16-bit value is non-finite when its exponent bits are all ones: one branch-free pass
     * (it vectorizes), then the search for the first one only when there is one. */
    uint16_t mask = v->dtype == DS_BF16 ? 0x7f80u : 0x7c00u;
    unsigned any = 0;
    for (size_t i = 0; i < numel; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      any |= (h & mask) == mask;
    }
    for (size_t i = 0; any && i < numel; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      if ((h & mask) == mask)
        return nonfinite_weight(v, i, v->dtype == DS_BF16 ? ds_bf16_to_f32(h) : ds_f16_to_f32(h));
    }
  } else {
    float buf[1024];
    size_t esize = ds_dtype_size(v->dtype);
    for (size_t off = 0; off < numel; off += 1024) {
      size_t m = numel - off < 1024 ? numel - off : 1024;
      DS_TRY(ds_convert_to_f32(buf, src + off * esize, v->dtype, m));
      for (size_t i = 0; i < m; i++)
        if (!isfinite(buf[i])) return nonfinite_weight(v, off + i, buf[i]);
    }
  }
  *out = v;
  return DS_OK;
}
