/* Reads a GGUF file the way the engine does and writes what it read, for the tests that compare
 * it with the gguf Python package:
 *   gguf_dump FILE.gguf OUT.safetensors OUT.json
 * OUT.safetensors: every tensor the engine converts, dequantized to F32, shape in PyTorch's order
 * (the GGUF dimensions reversed). OUT.json: {"version", "alignment", "kv": {key: {"type",
 * "elem_type", "value"}}, "tensors": {name: {"type", "ne", "offset", "error"?}}}. Exit 1 and the
 * engine's message when the file is refused. The header's pages are released (ds_gguf_release_header)
 * before anything is read: what the handle gives must stay valid. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "dspark/gguf.h"
#include "dspark/safetensors.h"

static cJSON *value_json(const ds_gguf_kv *kv, uint64_t i) {
  switch (kv->elem_type) {
    case DS_GGUF_STRING: {
      const ds_gguf_str *s = &kv->strs[i];
      char *c = malloc((size_t)s->len + 1);
      memcpy(c, s->p, (size_t)s->len);
      c[s->len] = 0;
      cJSON *j = cJSON_CreateString(c);
      free(c);
      return j;
    }
    case DS_GGUF_BOOL: return cJSON_CreateBool(((const unsigned char *)kv->data)[i]);
    case DS_GGUF_F32: case DS_GGUF_F64: return cJSON_CreateNumber(ds_gguf_array_f64(kv, i));
    default: { /* integers as strings: a u64 / i64 does not fit a double */
      char b[32];
      if (kv->elem_type == DS_GGUF_U64) {
        uint64_t v;
        memcpy(&v, (const unsigned char *)kv->data + 8 * i, 8);
        snprintf(b, sizeof b, "%llu", (unsigned long long)v);
      } else {
        snprintf(b, sizeof b, "%lld", (long long)ds_gguf_array_i64(kv, i));
      }
      return cJSON_CreateString(b);
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: gguf_dump FILE.gguf OUT.safetensors OUT.json\n");
    return 2;
  }
  ds_gguf *g;
  if (ds_gguf_open(argv[1], &g) != DS_OK) {
    fprintf(stderr, "gguf_dump: %s\n", ds_last_error());
    return 1;
  }
  /* as the target's loader does once it has read the metadata: everything below reads the header
   * again through the handle, from pages faulted back in */
  ds_gguf_release_header(g);
  cJSON *root = cJSON_CreateObject(), *kvs = cJSON_AddObjectToObject(root, "kv"),
        *tens = cJSON_AddObjectToObject(root, "tensors");
  cJSON_AddNumberToObject(root, "version", ds_gguf_version(g));
  cJSON_AddNumberToObject(root, "alignment", ds_gguf_alignment(g));
  for (size_t i = 0; i < ds_gguf_kv_count(g); i++) {
    const ds_gguf_kv *kv = ds_gguf_kv_at(g, i);
    cJSON *e = cJSON_AddObjectToObject(kvs, kv->key);
    cJSON_AddStringToObject(e, "type", ds_gguf_vtype_name(kv->type));
    cJSON_AddStringToObject(e, "elem_type", ds_gguf_vtype_name(kv->elem_type));
    if (kv->type == DS_GGUF_ARRAY) {
      cJSON *a = cJSON_AddArrayToObject(e, "value");
      for (uint64_t j = 0; j < kv->count; j++) cJSON_AddItemToArray(a, value_json(kv, j));
    } else {
      cJSON_AddItemToObject(e, "value", value_json(kv, 0));
    }
  }
  size_t n = ds_gguf_tensor_count(g);
  float **bufs = calloc(n ? n : 1, sizeof *bufs);
  ds_st_writer *w = ds_st_writer_new();
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
    cJSON *e = cJSON_AddObjectToObject(tens, t->name);
    cJSON_AddStringToObject(e, "type", ds_ggml_type_name(t->type));
    cJSON *ne = cJSON_AddArrayToObject(e, "ne");
    for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(ne, cJSON_CreateNumber((double)t->ne[d]));
    cJSON_AddNumberToObject(e, "offset", (double)t->offset);
    bufs[i] = malloc((size_t)t->numel * sizeof(float));
    if (ds_gguf_dequantize(g, t, bufs[i]) != DS_OK) {
      cJSON_AddStringToObject(e, "error", ds_last_error());
      continue;
    }
    int64_t shape[4];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->ne[t->ndim - 1 - d];
    if (ds_st_writer_add(w, t->name, DS_F32, t->ndim, shape, bufs[i]) != DS_OK) rc = 1;
  }
  if (rc == 0 && ds_st_writer_write(w, argv[2]) != DS_OK) rc = 1;
  char *text = cJSON_PrintUnformatted(root);
  if (rc == 0 && ds_write_file_atomic(argv[3], text, strlen(text)) != DS_OK) rc = 1;
  if (rc) fprintf(stderr, "gguf_dump: %s\n", ds_last_error());
  free(text);
  cJSON_Delete(root);
  ds_st_writer_free(w);
  for (size_t i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  ds_gguf_close(g);
  return rc;
}
