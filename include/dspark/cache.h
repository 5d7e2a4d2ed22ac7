/* The offline cache (spec/dspark.md section 6, spec/kd.md section 1): the target's supervision
 * captured once, for training many drafts (DSpark features) or students (sparse KD log-probs).
 *
 * A cache is a directory:
 *   manifest.json              every field that makes the cache valid for a run (below), the
 *                              `complete` flag and the list of shards with their checksums
 *   shard-%06d.safetensors     n samples each (the manifest's shard_size; the last may hold fewer):
 *       lengths                  [n]          I64  real tokens of each sample (min_length..S)
 *       input_ids                [n, S]       I32  ids; 0 at padding (t >= length)
 *       loss_mask                [n, S]       U8   1 = supervised; 0 at padding
 *       target_hidden_states     [n, S, m*d]  dtype  captured layers, concatenated in
 *                                             target_layer_ids order (features only)
 *       target_hidden_states_scale [n, S, m]  F32  int8 caches only: one scale per position and
 *                                             captured layer (below)
 *       target_last_hidden_states[n, S, d]    dtype  final-normed hidden state (features only)
 *       target_last_hidden_states_scale [n, S] F32 int8 caches only: one scale per position
 *       topk_ids                 [n, S, K]    I32  teacher top-K ids, by descending probability (KD)
 *       topk_logprobs            [n, S, K]    dtype  FULL-vocabulary log-probs of those ids (KD);
 *                                             BF16 in an int8 cache (ds_cache_logprob_dtype)
 *     Every value at padding is zero, except KD entries, which are sentinels there.
 *     dtype is the manifest's: "f32", "bf16", "f16" or "int8" (I8 features; see "int8 features").
 *   target_weights.safetensors embed_tokens.weight, lm_head.weight [V, d] (frozen tables, in the
 *                              target's dtype: F32, or its checkpoint's BF16 / F16)
 *   target_config.json, tokenizer.json   copies of the target's files (hashes in the manifest)
 *
 * KD entries (spec/kd.md section 1): for logits x of a position, lse = logsumexp(x / T) over the
 * whole vocabulary, q_i = x_i / T - lse for the K most probable ids (ties: the smaller id first),
 * sorted descending. With top_p < 1 a prefix is kept: entry i survives iff
 * (sum_{j<i} exp q_j) < top_p or i < max(min_k, 1). A dropped entry, and every entry of a padding
 * position, is the sentinel id -1 with log-prob -inf; the id is authoritative.
 *
 * int8 features: each row v of d values (one captured layer of one position in
 * target_hidden_states, the final-normed state of one position in target_last_hidden_states)
 * is stored as
 *     s = max_i |v_i| / 127                       (fp32 division; the row's scale, F32)
 *     q_i = clamp(rne(v_i / s), -127, 127)        (I8; rne: round half to even, as torch.round)
 * and read back as v_i ~= q_i * s in fp32, within s / 2 (and the fp32 rounding of v_i / s) of
 * v_i. A row whose s is 0 (all zeros, every padding position, or an absmax so small that
 * absmax / 127 underflows) stores q = 0. -128 is never written; a reader refuses a scale that
 * is negative or not finite. KD log-probs are not quantized: an int8 cache keeps them in BF16
 * (a log-prob's error matters in the exponent; they are a small part of a features cache).
 *
 * Every file is written atomically and deterministically (no time, pid or host in any byte), so
 * a capture killed at any point and rerun ends byte-identical to an uninterrupted one. The one
 * exception is `.lock`, not part of the cache: the lock file of the capture that writes it
 * (dspark/fileio.h ds_dir_lock_acquire), holding that process's pid. */
#ifndef DSPARK_CACHE_H
#define DSPARK_CACHE_H

#include "dspark/common.h"
#include "dspark/dtype.h"
#include "dspark/safetensors.h"
#include "dspark/sequences.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added manifest_xxh64 (the manifest's own checksum, below); version 1 caches are
 * refused with a hint to recapture. int8 caches kept version 2: "int8" is a new value of the
 * manifest's dtype field, which an older reader refuses by name instead of misreading. */
enum { DS_CACHE_FORMAT_VERSION = 2, DS_CACHE_MAX_LAYERS = 64 };

#define DS_CACHE_FORMAT "dspark-cache"
#define DS_CACHE_CHAT_TEMPLATE "chatml-v1" /* the built-in ChatML template's version string */
#define DS_CACHE_WEIGHTS_HASH_COVERS                                                                  \
  "xxh64 (seed 0) over every tensor of the checkpoint in name order: name, NUL, dtype name, NUL, ndim " \
  "and shape as little-endian int64, raw data bytes; metadata and file layout excluded"

typedef struct {
  char file[32];       /* "shard-000000.safetensors" */
  int64_t num_samples;
  uint64_t xxh64;      /* of the whole file */
} ds_cache_shard_info;

typedef struct {
  int format_version;
  int complete;
  char *target_path;             /* as given to the capture (malloc'd) */
  char target_architecture[64];
  uint64_t target_weights_xxh64; /* see DS_CACHE_WEIGHTS_HASH_COVERS (the model's, whatever
                                    target_weights) */
  char target_weights[16];       /* how the target held its weights while capturing
                                    (`--weights`, ds_target_weights_held): "as-stored", "bf16" or
                                    "f32"; "" for a cache written before the field (absent from
                                    its manifest: a GGUF in fp32, a directory's 16-bit matrices
                                    in place) */
  uint64_t target_config_xxh64;  /* of config.json's bytes */
  uint64_t tokenizer_xxh64;      /* of tokenizer.json's bytes */
  char chat_template[32];
  uint64_t chat_template_xxh64;  /* of the chat_template string */
  int64_t vocab_size, hidden_size, num_hidden_layers;
  int32_t target_layer_ids[DS_CACHE_MAX_LAYERS];
  int n_layers;                  /* m */
  ds_dtype dtype;                /* BF16, F16 or F32: features and KD log-probs; I8: int8
                                    features with scales, BF16 KD log-probs */
  int64_t seq_length;            /* S */
  int64_t eos_token_id;          /* joins plain-text documents (-1: none) */
  int64_t min_length;            /* shorter sequences were dropped */
  int64_t num_samples, num_tokens, shard_size;
  char *data_path;               /* as given (malloc'd) */
  uint64_t data_xxh64;           /* of the data file's bytes */
  uint64_t seed;                 /* recorded for provenance; the capture itself draws nothing */
  int features;                  /* DSpark features present */
  int64_t kd_topk;               /* K; 0 = no KD data */
  double kd_top_p, kd_temperature;
  int64_t kd_min_k;
  uint64_t target_weights_file_xxh64; /* of target_weights.safetensors; 0 until written */
  ds_cache_shard_info *shards;
  int64_t n_shards;
  uint64_t manifest_xxh64;       /* the file's own checksum, as parsed (see DS_CACHE_MANIFEST_HASH) */
} ds_cache_manifest;

/* manifest.json starts with the field "manifest_xxh64": xxh64 (seed 0) of the file's bytes with
 * that field's 16 hex digits replaced by sixteen '0' characters. The writer computes it last,
 * the parser verifies it after every other check: an edited field (target_layer_ids, a shard's
 * checksum, complete) is refused instead of flowing into training and export. */
#define DS_CACHE_MANIFEST_HASH \
  "xxh64 (seed 0) of manifest.json's bytes with this field's 16 hex digits replaced by '0'; written first"

void ds_cache_manifest_free(ds_cache_manifest *m);
/* Writes a manifest text's own checksum into its leading "manifest_xxh64" field (the 16 hex
 * digits, in place); 0 when the text does not start with that field. The writer's last step,
 * and the fuzzer's way past the checksum. */
int ds_cache_manifest_seal(char *text, size_t len);
/* Deterministic JSON text (malloc'd). */
char *ds_cache_manifest_json(const ds_cache_manifest *m);
/* Strict: every field present with its type and a valid value, no unknown field, shards
 * named in sequence with consistent counts, and last the file's own checksum
 * (manifest_xxh64, first in the file). label names the file in messages. */
ds_status ds_cache_manifest_parse(const char *json, size_t len, const char *label, ds_cache_manifest *out);
/* Compares every field that identifies the capture (all but complete, shards and the
 * target_weights file hash; target_weights included: a resumed capture never mixes shards of
 * weights held otherwise); the first difference is an error naming the field and both values. */
ds_status ds_cache_manifest_same_capture(const ds_cache_manifest *have, const ds_cache_manifest *want,
                                         const char *label);
/* "shard-%06d.safetensors" */
void ds_cache_shard_name(int64_t i, char *buf, size_t n);

/* What a run requires of a cache; -1 / 0 leave a field unchecked. */
typedef struct {
  int64_t seq_length;
  int n_layers;                  /* -1: any; else layer_ids[0..n) must equal the cache's */
  int32_t layer_ids[DS_CACHE_MAX_LAYERS];
  int dtype;                     /* -1: any */
  int64_t vocab_size, hidden_size, num_hidden_layers;
  int check_weights;  uint64_t target_weights_xxh64;
  int check_config;   uint64_t target_config_xxh64;
  int check_tokenizer; uint64_t tokenizer_xxh64;
  int check_data;     uint64_t data_xxh64;
  int need_features, need_kd;
  int allow_incomplete;          /* inspect only */
} ds_cache_expect;

void ds_cache_expect_any(ds_cache_expect *e);
/* The strict checks, with messages "LABEL: field 'F' is A in the cache but B in this run". */
ds_status ds_cache_manifest_check(const ds_cache_manifest *m, const ds_cache_expect *e, const char *label);

/* The manifest's dtype names: "bf16", "f16", "f32", "int8" (DS_I8); "?" for any other. */
const char *ds_cache_dtype_label(ds_dtype dt);
int ds_cache_dtype_from_label(const char *s, ds_dtype *out); /* 1 on success */
/* The storage dtype of topk_logprobs in a cache of dtype dt (BF16 for int8, else dt). */
ds_dtype ds_cache_logprob_dtype(ds_dtype dt);

/* int8 features (the formula above), `rows` rows of `cols` values each: q [rows, cols],
 * scale [rows]. Deterministic and independent of threads. */
void ds_cache_quantize_i8(int8_t *q, float *scale, const float *x, int64_t rows, int64_t cols);
void ds_cache_dequantize_i8(float *x, const int8_t *q, const float *scale, int64_t rows, int64_t cols);

/* ---------------------------------------------------------------- size estimate */

enum { DS_CACHE_MAX_TENSORS = 9 };

/* The bytes a capture writes, computed from the manifest it will write (its sizes, dtype, KD
 * K, num_samples, num_tokens, shard_size) before anything is written. Shard files are exact
 * (their safetensors headers included): every sample stores all S positions, padding too.
 * target_weights.safetensors is exact; manifest.json is within a few bytes. */
typedef struct {
  int n_tensors;
  const char *tensor[DS_CACHE_MAX_TENSORS];     /* shard tensor names */
  int64_t per_position[DS_CACHE_MAX_TENSORS];   /* bytes per stored position (lengths: per sample / S) */
  int64_t position_bytes;                       /* their sum (lengths excluded) */
  int64_t n_shards, samples, tokens, positions; /* positions = samples * S */
  int64_t shard_bytes;                          /* every shard file, headers included */
  int64_t last_shard_bytes, full_shard_bytes;   /* one full shard's file, the last shard's */
  int64_t weights_bytes;                        /* target_weights.safetensors */
  int64_t other_bytes;                          /* target_config.json, tokenizer.json, manifest.json */
  int64_t total_bytes;
} ds_cache_size;

/* embed_dtype / lm_head_dtype: the dtypes the target's tables are stored in (and copied in);
 * config_bytes / tokenizer_bytes: the sizes of the copied files. */
ds_status ds_cache_estimate(const ds_cache_manifest *m, ds_dtype embed_dtype, ds_dtype lm_head_dtype,
                            int64_t config_bytes, int64_t tokenizer_bytes, ds_cache_size *out);
/* Bytes of a shard file of such a cache holding n_samples samples. */
ds_status ds_cache_shard_file_bytes(const ds_cache_manifest *m, int64_t n_samples, int64_t *bytes);
/* The writer of target_weights.safetensors (embed_tokens, lm_head [V, d] in their dtypes);
 * capture writes it, the estimate asks its size. Free with ds_st_writer_free. */
ds_status ds_cache_target_weights_writer(ds_weight embed, ds_weight lm_head, int64_t V, int64_t d,
                                         ds_st_writer **out);

/* Hashes (xxh64, seed 0). */
ds_status ds_cache_hash_file(const char *path, uint64_t *out);
/* The weights' hash (DS_CACHE_WEIGHTS_HASH_COVERS) of an open checkpoint: a model directory's
 * safetensors or a GGUF file's dequantized tensors (include/dspark/model_source.h). */
ds_status ds_cache_hash_checkpoint(const ds_checkpoint *ck, uint64_t *out);
uint64_t ds_cache_hash_string(const char *s);
void ds_cache_hex(uint64_t h, char out[17]);

/* ---------------------------------------------------------------- shard writer (capture) */

/* One shard being filled, in the cache's layout (include/dspark/cache.h). */
typedef struct {
  int64_t *len;        /* (n) */
  int32_t *ids;        /* (n, S) */
  uint8_t *mask;       /* (n, S) */
  unsigned char *ctx;  /* (n, S, m*d) dtype */
  unsigned char *last; /* (n, S, d) dtype */
  float *ctx_scale;    /* (n, S, m) int8 caches only */
  float *last_scale;   /* (n, S) int8 caches only */
  int32_t *kid;        /* (n, S, K) */
  unsigned char *klp;  /* (n, S, K) ds_cache_logprob_dtype */
} ds_shard_buf;

ds_status ds_shard_buf_alloc(ds_shard_buf *b, const ds_cache_manifest *m, int64_t n);
void ds_shard_buf_free(ds_shard_buf *b);
/* Row j from one sample's fp32 outputs (ctx [len, m*d], last [len, d], kd_ids / kd_lp [len, K];
 * unused ones may be NULL): padding becomes zeros, KD padding the sentinels; int8 caches
 * quantize the features here. */
ds_status ds_shard_store(ds_shard_buf *b, const ds_cache_manifest *m, int64_t j, int64_t len, const int32_t *ids,
                         const uint8_t *mask, const float *ctx, const float *last, const int32_t *kd_ids,
                         const float *kd_lp);
/* Writes rows [0, n) atomically to path; returns the file's xxh64 and size. */
ds_status ds_shard_write(const ds_shard_buf *b, const ds_cache_manifest *m, int64_t n, const char *path,
                         uint64_t *hash, int64_t *bytes);

/* ---------------------------------------------------------------- reader */

typedef struct ds_cache ds_cache;

/* Reads and checks the manifest (its own checksum included) against e, checks every shard's
 * header and shapes against the manifest and every sample's tokens (lengths, ids in the
 * vocabulary, masks 0/1, zero padding), and, for a complete cache, the copies
 * target_config.json and tokenizer.json against their hashes. Shard checksums are verified on
 * a shard's first feature read (or by ds_cache_verify_*). */
ds_status ds_cache_open(const char *dir, const ds_cache_expect *e, ds_cache **out);
void ds_cache_close(ds_cache *c);
const ds_cache_manifest *ds_cache_get_manifest(const ds_cache *c);
const char *ds_cache_path(const ds_cache *c);
/* The samples' tokens (ids, loss_mask, lengths; source_hash = data_xxh64), moved to the caller
 * (free with ds_dataset_free); a second call is an error. */
ds_status ds_cache_take_tokens(ds_cache *c, ds_dataset *out);
/* target_config.json / tokenizer.json of the cache, their hashes checked (malloc'd text). */
ds_status ds_cache_read_target_config(const ds_cache *c, char **text, size_t *len);
ds_status ds_cache_read_tokenizer(const ds_cache *c, char **text, size_t *len);
/* embed_tokens / lm_head [V, d] in the dtype the file stores each in (F32, BF16 or F16: the
 * target's; data 64-byte aligned, free with ds_free_aligned((void *)w.data)), the file's hash
 * checked against the manifest and every value finite. */
ds_status ds_cache_load_target_weights(const ds_cache *c, ds_weight *embed, ds_weight *lm_head);
/* Verifies shard i's checksum (once; remembered). */
ds_status ds_cache_verify_shard(ds_cache *c, int64_t i);
/* Verifies every shard, then the target weights and the copied json files. */
ds_status ds_cache_verify_all(ds_cache *c);
/* Converts rows [0, length) of sample idx to fp32 (int8 features: dequantized, q * scale);
 * any output may be NULL. A NaN or infinite
 * feature (a NaN or +inf log-prob) is a DS_ERR_NUMERIC naming the shard, the tensor, the
 * sample and the position; the stream passes it on with its status.
 *   ctx [S, m*d], last [S, d], topk_ids [S, K], topk_logprobs [S, K] */
ds_status ds_cache_read_sample(ds_cache *c, int64_t idx, float *ctx, float *last, int32_t *topk_ids,
                               float *topk_logprobs);
int64_t ds_cache_sample_length(const ds_cache *c, int64_t idx);

/* Prefetching stream: a background thread converts the pushed samples, in order, into a ring
 * of `depth` fp32 slots (depth >= 2: one held by the consumer, the rest ahead), verifying each
 * shard's checksum on its first use. The consumer pushes the indices it will need and takes
 * them back in the same order. Only the stream touches the cache until it is freed. */
typedef struct ds_cache_stream ds_cache_stream;

typedef struct {
  int64_t index, length;
  const float *ctx;            /* [length, m*d] (NULL without features) */
  const float *last;           /* [length, d] */
  const int32_t *topk_ids;     /* [length, K] (NULL unless want_kd) */
  const float *topk_logprobs;  /* [length, K] */
} ds_cache_sample;

ds_status ds_cache_stream_start(ds_cache *c, int depth, int want_kd, ds_cache_stream **out);
/* How many more indices may be pushed now. */
int ds_cache_stream_space(const ds_cache_stream *s);
ds_status ds_cache_stream_push(ds_cache_stream *s, int64_t index);
/* Releases the previous sample and waits for the oldest pushed one. Its pointers stay valid
 * until the next call. Seconds spent waiting accumulate in ds_cache_stream_wait_s. */
ds_status ds_cache_stream_next(ds_cache_stream *s, ds_cache_sample *out);
double ds_cache_stream_wait_s(const ds_cache_stream *s);
void ds_cache_stream_free(ds_cache_stream *s);

#ifdef __cplusplus
}
#endif
#endif
