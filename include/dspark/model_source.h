/* A model source: where a model's files come from, one seam for every command that takes a
 * model (generate, speculate, regenerate, capture, profile, calibrate, forward, tokenize, info,
 * train --target, distill --teacher / --student, ...). The path is either
 *   a Hugging Face model directory: config.json, generation_config.json, tokenizer.json,
 *     tokenizer_config.json, chat_template.jinja and the safetensors, read as before; or
 *   a GGUF file (a regular file that starts with the magic "GGUF"): read memory-mapped and
 *     converted at load, in memory, exactly as `dspark convert --dtype f32` converts it
 *     (include/dspark/gguf_model.h): the same texts, byte for byte, so the content hashes caches
 *     and runs record agree between a .gguf and its converted directory, and the weights
 *     dequantized to fp32 under their Hugging Face names. Nothing is written to disk.
 * Anything else (a regular file that is no GGUF, a missing path) is refused naming the path;
 * a GGUF that is not a model the engine reproduces (another architecture, tokenizer model,
 * pre-tokenizer, rope scaling) is refused at open naming the key, as convert refuses it. */
#ifndef DSPARK_MODEL_SOURCE_H
#define DSPARK_MODEL_SOURCE_H

#include "dspark/chat_template.h"
#include "dspark/common.h"
#include "dspark/hfconfig.h"
#include "dspark/safetensors.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model's files, by their name in a model directory; enums only grow at the end. */
typedef enum {
  DS_MODEL_CONFIG = 0,            /* config.json (required) */
  DS_MODEL_GENERATION_CONFIG = 1, /* generation_config.json (optional) */
  DS_MODEL_TOKENIZER = 2,         /* tokenizer.json */
  DS_MODEL_TOKENIZER_CONFIG = 3,  /* tokenizer_config.json (optional) */
  DS_MODEL_CHAT_TEMPLATE = 4,     /* chat_template.jinja (optional; never in a GGUF file, whose
                                   * template is tokenizer_config.json's chat_template) */
  DS_MODEL_FILE_COUNT
} ds_model_file;

/* "config.json", ... */
const char *ds_model_file_name(ds_model_file f);

typedef struct ds_model_source ds_model_source;

/* How a frozen target's weights are held (`--weights`, docs/compute.md "Quantized frozen weights"):
 *   DS_WEIGHTS_DEQUANTIZED  the library's default, what every command did before: a GGUF
 *                         dequantized to fp32, a directory's BF16 / F16 matrices used in place;
 *   DS_WEIGHTS_F32        every matrix converted to fp32 at load (a directory's 16-bit ones too);
 *   DS_WEIGHTS_AS_STORED  a GGUF's matrices in Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K used in place, in
 *                         their quantized type (memory-mapped; llama's permuted q / k rows copied
 *                         in order), the rest as F32; a directory's BF16 / F16 matrices in place;
 *   DS_WEIGHTS_BF16       a GGUF dequantized to BF16 (used in place in its image); a directory's
 *                         BF16 / F16 matrices in place.
 * Process-wide, set once by the program before loading (as ds_set_matmul_compute); read when a
 * target loads (ds_target_load_source), never by what names the model: a source's texts,
 * ds_model_source_weights and the weights' hash are the same under every mode (the files
 * `dspark convert --dtype f32` writes), so caches and runs made under one mode are recognized
 * under another. ds_target_weights_held says what a loaded target holds. */
typedef enum {
  DS_WEIGHTS_DEQUANTIZED = 0, DS_WEIGHTS_AS_STORED = 1, DS_WEIGHTS_BF16 = 2, DS_WEIGHTS_F32 = 3
} ds_weights_mode;
void ds_set_target_weights(ds_weights_mode mode);
ds_weights_mode ds_target_weights(void);
const char *ds_weights_mode_name(ds_weights_mode mode); /* "dequantized", "as-stored", "bf16", "f32" */
int ds_weights_mode_parse(const char *s, ds_weights_mode *out); /* as-stored | bf16 | f32 (fp32); 1 on success */

/* 1 when path is a regular file that starts with the GGUF magic (for commands that also take
 * other files, such as tokenize's tokenizer.json). */
int ds_model_path_is_gguf(const char *path);

/* Opens path (a model directory or a GGUF file). A directory is not read until a file is asked
 * for; a GGUF file's texts are built at open (its weights only when asked for). */
ds_status ds_model_source_open(const char *path, ds_model_source **out);
void ds_model_source_close(ds_model_source *s);
/* The path as given (recorded in run.json, cache manifests and reports). */
const char *ds_model_source_path(const ds_model_source *s);
int ds_model_source_is_gguf(const ds_model_source *s);
/* The name of a file in messages: "DIR/config.json", or "FILE.gguf (config.json)". */
const char *ds_model_source_label(const ds_model_source *s, ds_model_file f);

/* A file's text (owned by the source, NUL-terminated, valid until it closes): *text NULL when
 * the file is absent and required is 0; absent and required: DS_ERR_NOT_FOUND naming it. A
 * directory's file that is there but unreadable is an error either way. */
ds_status ds_model_source_text(ds_model_source *s, ds_model_file f, int required, const char **text, size_t *len);
/* xxh64 of a file's bytes (as caches and runs record config.json and tokenizer.json). */
ds_status ds_model_source_hash(ds_model_source *s, ds_model_file f, uint64_t *out);

/* config.json with generation_config.json's stop set (ds_config_load_dir's rules). */
ds_status ds_model_source_config(ds_model_source *s, ds_model_config *out);
/* The position limit (ds_config_check_positions) from config.json alone: no weights read. */
ds_status ds_model_source_check_positions(ds_model_source *s, int64_t positions, const char *option);
/* tokenizer.json as a tokenizer (labelled with its file). */
ds_status ds_model_source_tokenizer(ds_model_source *s, ds_tokenizer **out);
/* The tokenizer checked against config.json (ds_target_check_tokenizer), both named in errors. */
ds_status ds_model_source_checked_tokenizer(ds_model_source *s, ds_tokenizer **out);
/* The chat template (ds_chat_template_load's rules: override_path, else chat_template.jinja,
 * else tokenizer_config.json's chat_template); *out NULL when there is none. */
ds_status ds_model_source_chat_template(ds_model_source *s, const char *override_path, ds_chat_template **out);

/* The weights as a checkpoint the caller owns (ds_ckpt_close): a directory's safetensors,
 * mapped (ds_ckpt_open); a GGUF file's tensors dequantized to fp32 into one image in memory,
 * built on each call, whatever ds_target_weights() (a student reads its initial weights here). */
ds_status ds_model_source_weights(ds_model_source *s, ds_checkpoint **out);
/* The weights' hash as caches record it (ds_cache_hash_checkpoint), for a model that is checked
 * and not loaded (a GGUF's tensors are converted for it, then freed). */
ds_status ds_model_source_weights_hash(ds_model_source *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
