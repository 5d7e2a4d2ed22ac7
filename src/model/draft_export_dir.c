/* Where `dspark export` may write: a directory that is absent, empty or a previous export
 * (include/dspark/draft.h, ds_draft_export_dir_check). A target model directory, or anything
 * else holding other files, is never overwritten without the caller's explicit permission. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json_util.h"
#include "dspark/draft.h"
#include "dspark/fileio.h"
#include "dspark/safetensors.h"

/* "config.json", "model.safetensors", or one of their atomic-write temp files. */
static int is_export_file(const char *name) {
  static const char *files[] = {"config.json", "model.safetensors"};
  for (size_t i = 0; i < 2; i++) {
    size_t n = strlen(files[i]);
    if (strncmp(name, files[i], n) != 0) continue;
    if (!name[n]) return 1;
    if (strncmp(name + n, ".tmp.", 5) != 0 || !name[n + 5]) continue;
    const char *p = name + n + 5;
    while (*p >= '0' && *p <= '9') p++;
    if (!*p) return 1;
  }
  return 0;
}

/* 1 when DIR/config.json names the DSpark draft architecture. */
static int config_is_draft(const char *path) {
  char *text = NULL;
  size_t len = 0;
  if (ds_read_file(path, &text, &len) != DS_OK) return 0;
  ds_status st;
  cJSON *root = ds_json_parse(text, len, path, &st);
  free(text);
  const cJSON *a = root ? cJSON_GetObjectItemCaseSensitive(root, "architectures") : NULL;
  int ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1 && cJSON_IsString(cJSON_GetArrayItem(a, 0)) &&
           !strcmp(cJSON_GetArrayItem(a, 0)->valuestring, "Qwen3DSparkModel");
  cJSON_Delete(root);
  return ok;
}

static int weights_are_export(const char *path) {
  ds_safetensors *st;
  if (ds_st_open(path, &st) != DS_OK) return 0;
  const char *v = ds_st_metadata(st, DS_EXPORT_MARKER_KEY);
  int ok = v && !strcmp(v, "1");
  ds_st_close(st);
  return ok;
}

ds_status ds_draft_export_dir_check(const char *out_dir, int overwrite, int *foreign) {
  if (foreign) *foreign = 0;
  DIR *d = opendir(out_dir);
  if (!d) {
    if (errno == ENOENT) return DS_OK; /* created by the export */
    return DS_FAIL(DS_ERR_IO, "%s: cannot use as the export directory: %s", out_dir, strerror(errno));
  }
  char other[256] = "";
  int n_other = 0, has_config = 0, has_weights = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (!is_export_file(e->d_name)) {
      if (!n_other++) snprintf(other, sizeof other, "%s", e->d_name);
    } else if (!strcmp(e->d_name, "config.json")) {
      has_config = 1;
    } else if (!strcmp(e->d_name, "model.safetensors")) {
      has_weights = 1;
    }
  }
  closedir(d);
  if (foreign) *foreign = n_other;
  char *cfg = ds_path_join(out_dir, "config.json"), *weights = ds_path_join(out_dir, "model.safetensors");
  if (!cfg || !weights) {
    free(cfg);
    free(weights);
    return DS_ERR_NOMEM;
  }
  char why[512] = "";
  if (n_other)
    snprintf(why, sizeof why, "it holds %d file%s that an export does not write ('%s'%s)", n_other,
             n_other > 1 ? "s" : "", other, n_other > 1 ? ", ..." : "");
  else if (has_config && !config_is_draft(cfg))
    snprintf(why, sizeof why, "its config.json is not a DSpark draft's (architectures is not [\"Qwen3DSparkModel\"])");
  else if (!has_config && has_weights && !weights_are_export(weights))
    snprintf(why, sizeof why, "its model.safetensors was not written by dspark export (no '%s' metadata)",
             DS_EXPORT_MARKER_KEY);
  free(cfg);
  free(weights);
  if (!why[0] || overwrite) return DS_OK;
  return DS_FAIL(DS_ERR_ARG,
                 "%s: refusing to export into this directory: %s, so it is neither empty nor a previous export; "
                 "choose another --out, or pass --overwrite to replace its config.json and model.safetensors "
                 "(other files stay)", out_dir, why);
}
