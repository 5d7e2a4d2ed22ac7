/* The growable id list (ds_ids, include/dspark/tokenizer.h) that the encoder, the BPE merge
 * loop and the chat renderer append to. */
#include <stdlib.h>

#include "dspark/tokenizer.h"

void ds_ids_free(ds_ids *v) {
  if (!v) return;
  free(v->ids);
  v->ids = NULL;
  v->len = v->cap = 0;
}

ds_status ds_ids_push(ds_ids *v, int32_t id) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 256;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return DS_FAIL(DS_ERR_NOMEM, "cannot grow an id list to %zu ids", cap);
    v->ids = p;
    v->cap = cap;
  }
  v->ids[v->len++] = id;
  return DS_OK;
}
