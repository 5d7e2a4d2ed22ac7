/* Training checkpoints: one safetensors file, written atomically, holding everything a
 * resumed run needs to continue the identical trajectory: every draft tensor (frozen replicas
 * included, so the file is self-contained), the AdamW moments, the step, and the run's
 * configuration. Layout:
 *   tensors  "draft.<export name>" (F32), "optim.m" [n], "optim.v" [n] (F32)
 *   metadata format = "dspark-draft-checkpoint", format_version = "1", step, optim_step,
 *            skipped_steps, draft_config (the export config.json text), train_config (JSON) */
#ifndef DSPARK_CHECKPOINT_H
#define DSPARK_CHECKPOINT_H

#include "dspark/draft.h"
#include "dspark/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t step;          /* optimizer steps completed */
  int64_t skipped_steps; /* steps skipped for non-finite values (with the skip option) */
  char *draft_config;    /* malloc'd JSON text */
  char *train_config;    /* malloc'd JSON text */
} ds_checkpoint_info;

ds_status ds_checkpoint_save(const char *path, const ds_draft *d, const ds_adamw *opt, const ds_checkpoint_info *info);
/* Builds the draft from the checkpoint's own config and restores it and the optimizer.
 * Errors name the file and the field or tensor. Free info with ds_checkpoint_info_free. */
ds_status ds_checkpoint_load(const char *path, const ds_backend *backend, ds_draft **d, ds_adamw *opt,
                             ds_checkpoint_info *info);
void ds_checkpoint_info_free(ds_checkpoint_info *info);

#ifdef __cplusplus
}
#endif
#endif
