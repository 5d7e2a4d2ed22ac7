/* Reading a draft back from a training checkpoint (the trainer core's format, dspark/trainer.h,
 * with the draft objective's tensors "draft.<export name>" and metadata "draft_config", see
 * dspark/draft_trainer.h): what `dspark export` and `dspark draft-forward RUN_DIR` use.
 * Format 2 is verified (every tensor's and the metadata's checksum); format 1 (older runs,
 * no checksums) is still read. Either way every weight must be finite. */
#ifndef DSPARK_CHECKPOINT_H
#define DSPARK_CHECKPOINT_H

#include "dspark/draft.h"
#include "dspark/student.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t step;          /* optimizer steps completed */
  int64_t skipped_steps; /* steps skipped for non-finite values (with the skip option) */
  int format_version;    /* 1 or 2 */
  char *draft_config;    /* malloc'd: the exported config.json text (target config + draft keys) */
  char *train_config;    /* malloc'd JSON text */
} ds_checkpoint_info;

/* Builds the draft from the checkpoint's own config and tensors. Errors name the file and the
 * field or tensor. Free info with ds_checkpoint_info_free. */
ds_status ds_checkpoint_load_draft(const char *path, const ds_backend *backend, ds_draft **d, ds_checkpoint_info *info);
void ds_checkpoint_info_free(ds_checkpoint_info *info);
/* A student from a pretrain / distill checkpoint (format "dspark-student-checkpoint",
 * dspark/lm_trainer.h): verified as the draft's, built from its recorded config, every weight
 * finite. info->draft_config is NULL for it. */
ds_status ds_checkpoint_load_student(const char *path, const ds_backend *backend, ds_student **s,
                                     ds_checkpoint_info *info);
/* The "format" metadata of a checkpoint file (malloc'd), to tell a draft's from a student's. */
ds_status ds_checkpoint_format(const char *path, char **format);

/* A draft from a run directory (its checkpoint) or an export directory (config.json +
 * model.safetensors, ours or any writer of the layout). */
ds_status ds_draft_open(const char *dir, const ds_backend *backend, ds_draft **d);

#ifdef __cplusplus
}
#endif
#endif
