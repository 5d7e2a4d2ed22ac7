/* libFuzzer target: arbitrary bytes through ds_gguf_open_memory. Every key-value and tensor a
 * successful parse exposes is touched end to end (every string's bytes, the first and last byte
 * of each tensor, and the dequantization of small tensors of the converted types), so ASan
 * catches any view that escapes the buffer; the typed getters run on every key. */
#include <stdint.h>
#include <string.h>

#include "dspark/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_gguf *g = NULL;
  if (ds_gguf_open_memory(data, size, "fuzz.gguf", &g) != DS_OK) return 0;
  volatile unsigned sink = 0;
  for (size_t i = 0; i < ds_gguf_kv_count(g); i++) {
    const ds_gguf_kv *kv = ds_gguf_kv_at(g, i);
    DS_CHECK(kv && ds_gguf_find_kv(g, kv->key) == kv);
    if (kv->elem_type == DS_GGUF_STRING)
      for (uint64_t j = 0; j < kv->count; j++)
        for (uint64_t b = 0; b < kv->strs[j].len; b++) sink += (unsigned char)kv->strs[j].p[b];
    else if (kv->count)
      /* a comparison, not a cast: a double out of unsigned's range would be undefined */
      sink += (unsigned)ds_gguf_array_i64(kv, kv->count - 1) + (ds_gguf_array_f64(kv, 0) > 0);
    int64_t iv;
    double fv;
    int bv;
    ds_gguf_str sv;
    (void)ds_gguf_get_int(g, kv->key, 1, &iv);
    (void)ds_gguf_get_float(g, kv->key, 1, &fv);
    (void)ds_gguf_get_bool(g, kv->key, 1, &bv);
    (void)ds_gguf_get_str(g, kv->key, 1, &sv);
  }
  float small[4096];
  for (size_t i = 0; i < ds_gguf_tensor_count(g); i++) {
    const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
    DS_CHECK(t && ds_gguf_find_tensor(g, t->name) == t);
    if (t->nbytes) {
      const unsigned char *p = t->data;
      sink += p[0] + p[t->nbytes - 1];
    }
    if (t->numel <= 4096 && ds_ggml_type_dequantizable(t->type)) (void)ds_gguf_dequantize(g, t, small);
  }
  (void)sink;
  ds_gguf_close(g);
  return 0;
}
