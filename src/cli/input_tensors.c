#include "cli/input_tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"

static void dtypes_text(unsigned dtypes, char *buf, size_t cap) {
  size_t at = 0;
  int n = 0, total = 0;
  for (int d = 0; d < DS_DTYPE_COUNT; d++) total += (dtypes >> d) & 1;
  buf[0] = 0;
  for (int d = 0; d < DS_DTYPE_COUNT && at < cap; d++) {
    if (!((dtypes >> d) & 1)) continue;
    const char *sep = n == 0 ? "" : n == total - 1 ? " or " : ", ";
    at += (size_t)snprintf(buf + at, cap - at, "%s%s", sep, ds_dtype_name((ds_dtype)d));
    n++;
  }
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

ds_status cli_in_get(const ds_safetensors *st, const char *name, int required, unsigned dtypes,
                     const ds_tensor_view **out) {
  *out = ds_st_find(st, name);
  if (!*out)
    return required ? DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name) : DS_OK;
  if (!((dtypes >> (*out)->dtype) & 1)) {
    char want[128];
    dtypes_text(dtypes, want, sizeof want);
    ds_status s = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s", ds_st_path(st), name,
                          ds_dtype_name((*out)->dtype), want);
    *out = NULL;
    return s;
  }
  return DS_OK;
}

ds_status cli_in_shape(const ds_tensor_view *v, int ndim, const int64_t *shape, const char *symbolic) {
  int same = v->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = v->shape[d] == shape[d];
  if (same) return DS_OK;
  char have[160], want[160];
  shape_text(v->shape, v->ndim, have, sizeof have);
  shape_text(shape, ndim, want, sizeof want);
  return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s = %s", v->file, v->name, have, symbolic,
                 want);
}

void cli_in_index(const ds_tensor_view *v, int64_t i, char *buf, size_t cap) {
  int64_t idx[DS_MAX_DIMS];
  for (int d = v->ndim - 1; d >= 0; d--) {
    int64_t n = v->shape[d] > 0 ? v->shape[d] : 1;
    idx[d] = i % n;
    i /= n;
  }
  shape_text(idx, v->ndim > 0 ? v->ndim : 0, buf, cap);
}

ds_status cli_in_ints(const ds_tensor_view *v, int64_t lo, int64_t hi, const char *what, int64_t *dst) {
  const unsigned char *p = v->data;
  for (int64_t i = 0; i < v->numel; i++) {
    int64_t x;
    if (v->dtype == DS_I64) {
      memcpy(&x, p + 8 * i, 8);
    } else if (v->dtype == DS_I32) {
      int32_t y;
      memcpy(&y, p + 4 * i, 4);
      x = y;
    } else {
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected I32 or I64", v->file, v->name,
                     ds_dtype_name(v->dtype));
    }
    if (x < lo || x > hi) {
      char at[160];
      cli_in_index(v, i, at, sizeof at);
      return DS_FAIL(DS_ERR_RANGE, "%s: tensor '%s' holds %lld at %s, outside [%lld, %lld] (%s)", v->file, v->name,
                     (long long)x, at, (long long)lo, (long long)hi, what);
    }
    dst[i] = x;
  }
  return DS_OK;
}

ds_status cli_in_mask(const ds_tensor_view *v, uint8_t *dst) {
  const unsigned char *p = v->data;
  if (v->dtype != DS_U8 && v->dtype != DS_BOOL)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected U8 or BOOL", v->file, v->name,
                   ds_dtype_name(v->dtype));
  for (int64_t i = 0; i < v->numel; i++) {
    if (v->dtype == DS_BOOL && p[i] > 1) {
      char at[160];
      cli_in_index(v, i, at, sizeof at);
      return DS_FAIL(DS_ERR_RANGE, "%s: tensor '%s' holds the byte %u at %s; a BOOL is 0 or 1", v->file, v->name,
                     p[i], at);
    }
    dst[i] = p[i] != 0;
  }
  return DS_OK;
}

ds_status cli_in_floats(const ds_tensor_view *v, float *dst) {
  if (v->dtype != DS_F32 && v->dtype != DS_F16 && v->dtype != DS_BF16)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", v->file, v->name,
                   ds_dtype_name(v->dtype));
  return ds_convert_to_f32(dst, v->data, v->dtype, (size_t)v->numel);
}

int64_t cli_first_nonfinite(const float *x, int64_t n, int allow_neg_inf) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i]) && !(allow_neg_inf && x[i] == -INFINITY)) return i;
  return -1;
}

void cli_in_warn_unknown(const ds_safetensors *st, const char *const *names, int n, const char *command) {
  for (size_t i = 0; i < ds_st_count(st); i++) {
    const char *name = ds_st_tensor(st, i)->name;
    int known = 0;
    for (int k = 0; k < n && !known; k++) known = !strcmp(name, names[k]);
    if (!known)
      fprintf(stderr, "dspark %s: warning: %s: tensor '%s' is not an input of this command and is ignored\n", command,
              ds_st_path(st), name);
  }
}

void *cli_alloc(int64_t count, size_t size, const char *what) {
  if (count < 0 || (size && (uint64_t)count > SIZE_MAX / size)) {
    DS_FAIL(DS_ERR_NOMEM, "cannot allocate %s: %lld elements of %zu bytes do not fit in memory", what,
            (long long)count, size);
    return NULL;
  }
  return ds_malloc((size_t)count * size, what);
}

const float *cli_in_f32(const ds_tensor_view *v, float **own) {
  *own = NULL;
  if ((uintptr_t)v->data % _Alignof(float) == 0) return v->data;
  *own = ds_malloc(v->nbytes ? v->nbytes : 1, v->name);
  if (*own) memcpy(*own, v->data, v->nbytes);
  return *own;
}

void cli_page_in(const void *p, size_t nbytes) {
  const volatile unsigned char *b = p;
  unsigned char acc = 0;
  for (size_t i = 0; i < nbytes; i += 4096) acc ^= b[i];
  if (nbytes) acc ^= b[nbytes - 1];
  (void)acc;
}
