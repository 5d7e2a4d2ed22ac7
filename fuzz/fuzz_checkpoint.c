/* libFuzzer target: a run directory's checkpoint.safetensors as `dspark export RUN`, `draft-forward
 * RUN` and `speculate --draft RUN` read it (src/train/checkpoint.c: the trainer's metadata, the
 * recorded draft or student configuration and its agreement with the run's train_config, every
 * tensor's shape and finiteness), from arbitrary bytes written to a file of this process's own
 * under TMPDIR (or /tmp). Format 2 checkpoints carry checksums that mutations rarely keep; format 1
 * ones (older runs, still read) carry none, so the seeds include both and mutations of the latter
 * reach every check. A draft or a student that loads must export to the HF layout and load back
 * from it (a second directory) with the same configuration. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_file[256], g_out[256 + 8]; /* g_out: g_file ".export" */

/* the checkpoint, the export directory and its files, removed when the fuzzer exits */
static void remove_files(void) {
  static const char *const names[] = {"config.json", "model.safetensors"};
  for (int k = 0; k < 2; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_out, names[k]);
    unlink(path);
  }
  rmdir(g_out);
  unlink(g_file);
}

static void round_trip_draft(const ds_draft *d, const ds_checkpoint_info *info) {
  DS_CHECK(ds_draft_export_hf(d, info->draft_config, g_out) == DS_OK);
  ds_draft *back = NULL;
  DS_CHECK(ds_draft_load_hf(g_out, ds_backend_cpu(), &back) == DS_OK);
  const ds_draft_config *a = ds_draft_get_config(d), *b = ds_draft_get_config(back);
  DS_CHECK(a->markov_type == b->markov_type && a->markov_rank == b->markov_rank && a->block_size == b->block_size &&
           a->num_layers == b->num_layers && a->draft_vocab_size == b->draft_vocab_size);
  ds_draft_free(back);
}

static void round_trip_student(const ds_student *s) {
  DS_CHECK(ds_student_export_hf(s, g_out) == DS_OK);
  ds_student *back = NULL;
  DS_CHECK(ds_student_load_hf(g_out, ds_backend_cpu(), &back) == DS_OK);
  const ds_model_config *a = ds_student_config(s), *b = ds_student_config(back);
  DS_CHECK(ds_student_num_params(s) == ds_student_num_params(back) && a->hidden_size == b->hidden_size &&
           a->num_hidden_layers == b->num_hidden_layers && a->vocab_size == b->vocab_size);
  ds_student_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_file[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_file, sizeof g_file, "%s/fuzz_checkpoint.%ld.safetensors", tmp && tmp[0] ? tmp : "/tmp",
             (long)getpid());
    snprintf(g_out, sizeof g_out, "%s.export", g_file);
    DS_CHECK(ds_mkdir_p(g_out) == DS_OK);
    atexit(remove_files);
  }
  FILE *f = fopen(g_file, "wb");
  DS_CHECK(f != NULL);
  DS_CHECK(fwrite(data, 1, size, f) == size || size == 0);
  fclose(f);
  char *format = NULL;
  if (ds_checkpoint_format(g_file, &format) == DS_OK) free(format);
  ds_checkpoint_info info = {0};
  ds_draft *d = NULL;
  if (ds_checkpoint_load_draft(g_file, ds_backend_cpu(), &d, &info) == DS_OK) round_trip_draft(d, &info);
  ds_draft_free(d);
  ds_checkpoint_info_free(&info);
  memset(&info, 0, sizeof info);
  ds_student *s = NULL;
  if (ds_checkpoint_load_student(g_file, ds_backend_cpu(), &s, &info) == DS_OK) round_trip_student(s);
  ds_student_free(s);
  ds_checkpoint_info_free(&info);
  return 0;
}
