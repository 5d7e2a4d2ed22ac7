/* libFuzzer target: arbitrary bytes through ds_st_open_memory. Every tensor a successful
 * parse exposes is touched end to end (first and last byte, fp32 conversion of small float
 * tensors), so ASan catches any view that escapes the buffer. Names, lookups and metadata are
 * exercised too. */
#include <stdint.h>
#include <string.h>

#include "dspark/dtype.h"
#include "dspark/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_safetensors *st = NULL;
  if (ds_st_open_memory(data, size, "fuzz.safetensors", &st) != DS_OK) return 0;
  volatile unsigned sink = 0;
  float small[64];
  for (size_t i = 0; i < ds_st_count(st); i++) {
    const ds_tensor_view *v = ds_st_tensor(st, i);
    DS_CHECK(v && v->name && ds_st_find(st, v->name) == v);
    DS_CHECK(v->nbytes == (size_t)v->numel * ds_dtype_size(v->dtype));
    sink += (unsigned)strlen(v->name);
    if (v->nbytes) {
      const unsigned char *p = v->data;
      sink += p[0] + p[v->nbytes - 1];
    }
    if ((v->dtype == DS_F32 || v->dtype == DS_F16 || v->dtype == DS_BF16 || v->dtype == DS_F64) &&
        v->numel <= 64)
      (void)ds_convert_to_f32(small, v->data, v->dtype, (size_t)v->numel);
  }
  for (size_t i = 0; i < ds_st_metadata_count(st); i++) {
    const char *k = ds_st_metadata_key(st, i);
    const char *val = ds_st_metadata(st, k);
    DS_CHECK(val != NULL);
    sink += (unsigned)strlen(val);
  }
  (void)sink;
  ds_st_close(st);
  return 0;
}
