/* The training data order: a seeded permutation of the training sequences per epoch, so that
 * batch sequence j of step s is a pure function of (seed, s, j) and a resumed run sees the
 * same data. See draft_trainer_internal.h. */
#include "dspark/rng.h"
#include "train/draft_trainer_internal.h"

int64_t ds_trainer_order(const ds_train_options *o, int64_t n_train, int64_t *perm, int64_t *perm_epoch,
                         int64_t step, int64_t j) {
  int64_t i = step * o->batch_seqs + j, epoch = i / n_train;
  if (epoch != *perm_epoch) {
    ds_rng rng;
    ds_rng_seed(&rng, ds_seed_mix(o->seed ^ 0x5eed5eedull, (uint64_t)epoch));
    for (int64_t k = 0; k < n_train; k++) perm[k] = k;
    for (int64_t k = n_train - 1; k > 0; k--) {
      int64_t r = (int64_t)(ds_rng_next_u64(&rng) % (uint64_t)(k + 1)), tmp = perm[k];
      perm[k] = perm[r];
      perm[r] = tmp;
    }
    *perm_epoch = epoch;
  }
  return perm[i % n_train];
}
