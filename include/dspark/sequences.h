/* Packed training sequences: what the data loader (dspark/dataset.h) and the cache reader
 * (dspark/cache.h) produce and the trainers and capture consume. */
#ifndef DSPARK_SEQUENCES_H
#define DSPARK_SEQUENCES_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t n_seqs;
  int64_t seq_len;     /* S */
  int32_t *ids;        /* (n_seqs, S); padding is 0 */
  uint8_t *loss_mask;  /* (n_seqs, S); 0 on padding */
  int64_t *lengths;    /* (n_seqs) real tokens of each sequence */
  uint64_t source_hash;/* the data's xxh64 (ds_data_hash: one file's bytes, decompressed) */
  int64_t bad_lines;   /* lines the loader skipped (--skip-bad-lines); 0 otherwise */
} ds_dataset;

void ds_dataset_free(ds_dataset *ds);
/* xxh64 of the packed sequences themselves (lengths, then ids, then masks of every sequence):
 * whatever produced them (file, format, tokenizer, template, seq_len), equal hashes mean a run
 * sees the same sequences. */
uint64_t ds_dataset_hash(const ds_dataset *ds);

#ifdef __cplusplus
}
#endif
#endif
