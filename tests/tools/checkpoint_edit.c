/* Rewrites a safetensors file (a training checkpoint) with edits, for the tests that check
 * what resume and export do with altered files:
 *   checkpoint_edit IN OUT [--keep-checksums | --drop-checksums] [meta:KEY=VALUE ...] [f32:TENSOR:INDEX=VALUE ...]
 *                   [i64:TENSOR:INDEX=VALUE ...]
 * meta: sets a metadata field; f32: sets one element of an F32 tensor; i64: of an I64 tensor (a
 * reduced vocabulary's d2t). The checksums
 * (ds_st_writer_add_checksums) are recomputed, as a careful forger would, unless
 * --keep-checksums copies the old ones (an edit by hand); --drop-checksums writes none (with
 * meta:format_version=1, a checkpoint as the first format wrote it). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/safetensors.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: checkpoint_edit IN OUT [--keep-checksums] [meta:KEY=VALUE ...] [f32:NAME:INDEX=VALUE ...] "
            "[i64:NAME:INDEX=VALUE ...]\n");
    return 2;
  }
  int keep = 0, drop = 0;
  for (int i = 3; i < argc; i++) keep |= !strcmp(argv[i], "--keep-checksums"), drop |= !strcmp(argv[i], "--drop-checksums");
  ds_safetensors *st;
  if (ds_st_open(argv[1], &st) != DS_OK) {
    fprintf(stderr, "checkpoint_edit: %s\n", ds_last_error());
    return 1;
  }
  ds_st_writer *w = ds_st_writer_new();
  size_t n = ds_st_count(st);
  void **copies = calloc(n ? n : 1, sizeof *copies);
  for (size_t i = 0; i < n; i++) {
    const ds_tensor_view *v = ds_st_tensor(st, i);
    copies[i] = malloc(v->nbytes ? v->nbytes : 1);
    memcpy(copies[i], v->data, v->nbytes);
    for (int a = 3; a < argc; a++) {
      size_t len = strlen(v->name);
      int f32 = !strncmp(argv[a], "f32:", 4), i64 = !strncmp(argv[a], "i64:", 4);
      if (!(f32 || i64) || strncmp(argv[a] + 4, v->name, len) || argv[a][4 + len] != ':') continue;
      long long at = atoll(argv[a] + 5 + len);
      const char *eq = strchr(argv[a] + 5 + len, '=');
      if (!eq || at < 0 || at >= v->numel) continue;
      if (f32 && v->dtype == DS_F32) ((float *)copies[i])[at] = strtof(eq + 1, NULL);
      if (i64 && v->dtype == DS_I64) {
        long long x = strtoll(eq + 1, NULL, 10);
        memcpy((char *)copies[i] + 8 * at, &x, 8);
      }
    }
    ds_st_writer_add(w, v->name, v->dtype, v->ndim, v->shape, copies[i]);
  }
  for (size_t i = 0; i < ds_st_metadata_count(st); i++) {
    const char *k = ds_st_metadata_key(st, i);
    if (!keep && (!strcmp(k, "checksums") || !strcmp(k, "metadata_xxh64"))) continue;
    ds_st_writer_set_metadata(w, k, ds_st_metadata(st, k));
  }
  for (int a = 3; a < argc; a++) {
    if (strncmp(argv[a], "meta:", 5)) continue;
    char *kv = strdup(argv[a] + 5), *eq = strchr(kv, '=');
    if (eq) {
      *eq = 0;
      ds_st_writer_set_metadata(w, kv, eq + 1);
    }
    free(kv);
  }
  ds_status s = keep || drop ? DS_OK : ds_st_writer_add_checksums(w);
  if (s == DS_OK) s = ds_st_writer_write(w, argv[2]);
  if (s != DS_OK) fprintf(stderr, "checkpoint_edit: %s\n", ds_last_error());
  ds_st_writer_free(w);
  ds_st_close(st);
  for (size_t i = 0; i < n; i++) free(copies[i]);
  free(copies);
  return s == DS_OK ? 0 : 1;
}
