/* A model source (include/dspark/model_source.h): a model directory's files read when asked
 * for, or a GGUF file's model (gguf_internal.h) converted in memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "dspark/target.h"
#include "model/gguf_internal.h"

/* The files, and how an optional one is found absent: probe = 1 with ds_path_probe (a dangling
 * link is an error), 0 with ds_file_exists, as each file's reader has always looked for it. */
static const struct {
  const char *name;
  int probe;
} k_files[DS_MODEL_FILE_COUNT] = {
    {"config.json", 1}, {"generation_config.json", 1}, {"tokenizer.json", 1},
    {"tokenizer_config.json", 0}, {"chat_template.jinja", 0},
};

struct ds_model_source {
  char *path;
  ds_gguf_model *gguf;              /* NULL: a model directory */
  char *label[DS_MODEL_FILE_COUNT];
  char *text[DS_MODEL_FILE_COUNT];  /* a directory's files read so far (a GGUF's are gguf's) */
  size_t len[DS_MODEL_FILE_COUNT];
  int read[DS_MODEL_FILE_COUNT];    /* 1 once looked for (text NULL: absent) */
};

const char *ds_model_file_name(ds_model_file f) {
  return (unsigned)f < DS_MODEL_FILE_COUNT ? k_files[f].name : "?";
}

void ds_model_source_close(ds_model_source *s) {
  if (!s) return;
  for (int i = 0; i < DS_MODEL_FILE_COUNT; i++) {
    free(s->label[i]);
    free(s->text[i]);
  }
  ds_gguf_model_close(s->gguf);
  free(s->path);
  free(s);
}

/* What path is: *gguf = 1 for a regular file starting with the GGUF magic; a directory, or a
 * path that is not there (its files are then reported missing by name, as before), is a model
 * directory; any other file is refused. */
static ds_status classify(const char *path, int *gguf) {
  *gguf = 0;
  struct stat sb;
  if (stat(path, &sb) != 0 || S_ISDIR(sb.st_mode)) return DS_OK;
  if (!S_ISREG(sb.st_mode))
    return DS_FAIL(DS_ERR_ARG, "%s: not a model: neither a model directory nor a GGUF file", path);
  unsigned char magic[4] = {0};
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DS_FAIL(DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  ssize_t got = read(fd, magic, sizeof magic);
  close(fd);
  if (got == 4 && !memcmp(magic, "GGUF", 4)) {
    *gguf = 1;
    return DS_OK;
  }
  return DS_FAIL(DS_ERR_ARG, "%s: not a model: a file that is not a GGUF file (it does not start with the magic "
                 "'GGUF'); give a model directory (config.json, tokenizer.json, the safetensors) or a .gguf file",
                 path);
}

int ds_model_path_is_gguf(const char *path) {
  int gguf = 0;
  struct stat sb;
  if (!path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
  ds_status st = classify(path, &gguf);
  if (st != DS_OK) ds_error_clear();
  return gguf;
}

ds_status ds_model_source_open(const char *path, ds_model_source **out) {
  *out = NULL;
  if (!path) return DS_FAIL(DS_ERR_ARG, "ds_model_source_open: path is NULL");
  int gguf;
  DS_TRY(classify(path, &gguf));
  ds_model_source *s = calloc(1, sizeof *s);
  ds_status st = s && (s->path = strdup(path)) ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s", path);
  for (int i = 0; st == DS_OK && i < DS_MODEL_FILE_COUNT; i++) {
    size_t n = strlen(path) + strlen(k_files[i].name) + 8;
    if (!(s->label[i] = malloc(n))) st = DS_FAIL(DS_ERR_NOMEM, "%s", path);
    else if (gguf) snprintf(s->label[i], n, "%s (%s)", path, k_files[i].name);
    else snprintf(s->label[i], n, "%s/%s", path, k_files[i].name);
  }
  /* in memory, the files `dspark convert --dtype f32` writes, whatever --weights: the texts and the
   * hashes caches and runs record name the model, not how a target holds its weights (a target
   * under --weights bf16 builds its image of the weights in bf16: ds_model_source_weights_except) */
  if (st == DS_OK && gguf) st = ds_gguf_model_open(path, DS_F32, &s->gguf);
  if (st != DS_OK) {
    ds_model_source_close(s);
    return st;
  }
  *out = s;
  return DS_OK;
}

const char *ds_model_source_path(const ds_model_source *s) { return s->path; }
const ds_gguf_model *ds_model_source_gguf(const ds_model_source *s) { return s->gguf; }

static ds_weights_mode g_weights = DS_WEIGHTS_DEQUANTIZED; /* set once by the program, as the compute mode */

void ds_set_target_weights(ds_weights_mode mode) { g_weights = mode; }
ds_weights_mode ds_target_weights(void) { return g_weights; }

const char *ds_weights_mode_name(ds_weights_mode mode) {
  return mode == DS_WEIGHTS_AS_STORED ? "as-stored" : mode == DS_WEIGHTS_BF16 ? "bf16"
         : mode == DS_WEIGHTS_F32     ? "f32" : "dequantized";
}

int ds_weights_mode_parse(const char *s, ds_weights_mode *out) {
  for (int m = DS_WEIGHTS_AS_STORED; m <= DS_WEIGHTS_F32; m++)
    if (!strcmp(s, ds_weights_mode_name((ds_weights_mode)m))) {
      *out = (ds_weights_mode)m;
      return 1;
    }
  if (!strcmp(s, "fp32")) {
    *out = DS_WEIGHTS_F32;
    return 1;
  }
  return 0;
}
int ds_model_source_is_gguf(const ds_model_source *s) { return s->gguf != NULL; }

const char *ds_model_source_label(const ds_model_source *s, ds_model_file f) {
  return (unsigned)f < DS_MODEL_FILE_COUNT ? s->label[f] : "?";
}

/* A directory's file, read once. */
static ds_status read_dir_file(ds_model_source *s, ds_model_file f, int required) {
  const char *p = s->label[f];
  int there = 1;
  if (!required && k_files[f].probe) DS_TRY(ds_path_probe(p, &there));
  else if (!required) there = ds_file_exists(p);
  if (there) DS_TRY(ds_read_file(p, &s->text[f], &s->len[f])); /* a required one missing: its reader's error */
  s->read[f] = 1;
  return DS_OK;
}

ds_status ds_model_source_text(ds_model_source *s, ds_model_file f, int required, const char **text, size_t *len) {
  *text = NULL;
  if (len) *len = 0;
  if ((unsigned)f >= DS_MODEL_FILE_COUNT) return DS_FAIL(DS_ERR_ARG, "ds_model_source_text: file %d", (int)f);
  const char *t;
  size_t n = 0;
  if (s->gguf) {
    t = ds_gguf_model_text(s->gguf, f, &n);
  } else {
    /* a required file found absent before is read again: its reader names why */
    if (!s->read[f] || (required && !s->text[f])) DS_TRY(read_dir_file(s, f, required));
    t = s->text[f];
    n = s->len[f];
  }
  if (!t && required)
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: %s is not there", s->path, ds_model_file_name(f));
  *text = t;
  if (len) *len = n;
  return DS_OK;
}

ds_status ds_model_source_hash(ds_model_source *s, ds_model_file f, uint64_t *out) {
  const char *t;
  size_t n;
  DS_TRY(ds_model_source_text(s, f, 1, &t, &n));
  *out = XXH64(t, n, 0);
  return DS_OK;
}

ds_status ds_model_source_config(ds_model_source *s, ds_model_config *out) {
  const char *cfg, *gen;
  size_t cfg_len, gen_len;
  DS_TRY(ds_model_source_text(s, DS_MODEL_CONFIG, 1, &cfg, &cfg_len));
  DS_TRY(ds_model_source_text(s, DS_MODEL_GENERATION_CONFIG, 0, &gen, &gen_len));
  return ds_config_parse_model(cfg, cfg_len, s->label[DS_MODEL_CONFIG], gen, gen_len,
                               s->label[DS_MODEL_GENERATION_CONFIG], out);
}

/* config.json alone (no stop set): what the checks before loading read. */
static ds_status config_only(ds_model_source *s, ds_model_config *out) {
  const char *cfg;
  size_t len;
  DS_TRY(ds_model_source_text(s, DS_MODEL_CONFIG, 1, &cfg, &len));
  return ds_config_parse(cfg, len, s->label[DS_MODEL_CONFIG], out);
}

ds_status ds_model_source_check_positions(ds_model_source *s, int64_t positions, const char *option) {
  ds_model_config c;
  DS_TRY(config_only(s, &c));
  return ds_config_check_positions(&c, s->label[DS_MODEL_CONFIG], positions, option);
}

ds_status ds_model_source_tokenizer(ds_model_source *s, ds_tokenizer **out) {
  *out = NULL;
  const char *t;
  size_t n;
  DS_TRY(ds_model_source_text(s, DS_MODEL_TOKENIZER, 1, &t, &n));
  return ds_tokenizer_load_memory(t, n, s->label[DS_MODEL_TOKENIZER], out);
}

ds_status ds_model_source_checked_tokenizer(ds_model_source *s, ds_tokenizer **out) {
  *out = NULL;
  ds_model_config c;
  DS_TRY(config_only(s, &c));
  DS_TRY(ds_model_source_tokenizer(s, out));
  ds_status st = ds_target_check_tokenizer(&c, *out, s->label[DS_MODEL_CONFIG], s->label[DS_MODEL_TOKENIZER]);
  if (st != DS_OK) {
    ds_tokenizer_free(*out);
    *out = NULL;
  }
  return st;
}

ds_status ds_model_source_chat_template(ds_model_source *s, const char *override_path, ds_chat_template **out) {
  *out = NULL;
  ds_chat_template_source src = {.config_label = s->label[DS_MODEL_TOKENIZER_CONFIG],
                                 .jinja_label = s->label[DS_MODEL_CHAT_TEMPLATE]};
  DS_TRY(ds_model_source_text(s, DS_MODEL_TOKENIZER_CONFIG, 0, &src.config, &src.config_len));
  /* the model's Jinja file is not read when --chat-template replaces it */
  if (!override_path) DS_TRY(ds_model_source_text(s, DS_MODEL_CHAT_TEMPLATE, 0, &src.jinja, &src.jinja_len));
  return ds_chat_template_load_texts(&src, override_path, out);
}

static ds_status weights_in(ds_model_source *s, ds_dtype dtype, const char *const *skip, int n_skip, int keep16,
                            ds_checkpoint **out) {
  *out = NULL;
  if (!s->gguf) return ds_ckpt_open(s->path, out);
  unsigned char *image;
  size_t size;
  DS_TRY(ds_gguf_model_weights(s->gguf, dtype, skip, n_skip, keep16, &image, &size));
  return ds_ckpt_open_memory(image, size, s->path, out);
}

ds_status ds_model_source_weights(ds_model_source *s, ds_checkpoint **out) {
  return weights_in(s, DS_F32, NULL, 0, 0, out);
}

ds_status ds_model_source_weights_except(ds_model_source *s, const char *const *skip, int n_skip, int keep16,
                                         ds_checkpoint **out) {
  return weights_in(s, ds_target_weights() == DS_WEIGHTS_BF16 ? DS_BF16 : DS_F32, skip, n_skip, keep16, out);
}

ds_status ds_model_source_weights_hash(ds_model_source *s, uint64_t *out) {
  ds_checkpoint *ck;
  DS_TRY(ds_model_source_weights(s, &ck));
  ds_status st = ds_cache_hash_checkpoint(ck, out);
  ds_ckpt_close(ck);
  return st;
}
