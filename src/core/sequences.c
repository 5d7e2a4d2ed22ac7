#include "dspark/sequences.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void ds_dataset_free(ds_dataset *ds) {
  free(ds->ids);
  free(ds->loss_mask);
  free(ds->lengths);
  memset(ds, 0, sizeof *ds);
}

uint64_t ds_dataset_hash(const ds_dataset *ds) {
  XXH64_state_t *h = XXH64_createState();
  if (!h) return 0;
  XXH64_reset(h, 0);
  size_t n = (size_t)ds->n_seqs, S = (size_t)ds->seq_len;
  XXH64_update(h, ds->lengths, n * sizeof *ds->lengths);
  XXH64_update(h, ds->ids, n * S * sizeof *ds->ids);
  XXH64_update(h, ds->loss_mask, n * S);
  uint64_t v = XXH64_digest(h);
  XXH64_freeState(h);
  return v;
}
