/* Small helpers shared by the subcommands for option values; each prints a usage error that
 * names the option and returns 0 on bad input. */
#ifndef DSPARK_CLI_ARGS_H
#define DSPARK_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/dataset.h"
#include "dspark/draft.h"
#include "dspark/fileio.h"

/* argv[*i] is an option that takes a value: returns argv[*i + 1] and advances *i, or NULL. */
const char *cli_value(int argc, char **argv, int *i);
int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_float(const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" -> malloc'd array; returns 0 (after a message) on a malformed list. The empty
 * string gives n = 0: a caller that needs an entry says so. */
int cli_int_list(const char *opt, const char *s, int32_t **out, int64_t *n);
int cli_is_help(const char *arg);
/* --markov's value: none, vanilla, gated or rnn; 0 after a usage message naming opt. */
int cli_markov_type(const char *opt, const char *s, ds_markov_type *out);
/* --draft-weights' value: f32, bf16 or q8_0 (ds_draft_set_decode_weights); 0 after a usage message. */
int cli_draft_weights(const char *opt, const char *s, ds_dtype *out);
/* Its --help line, for the commands that decode with a draft (speculate, calibrate, profile). */
#define CLI_DRAFT_WEIGHTS_HELP                                                                                \
  "  --draft-weights f32|bf16|q8_0  the draft's matrices as its decoding reads them (default q8_0: a\n"       \
  "                        copy made at load; proposals of the rounded weights, output unchanged)\n"
#define CLI_DRAFT_WEIGHTS(dst) do { CLI_VALUE(); if (!cli_draft_weights(a, v, &(dst))) return 2; } while (0)

/* "L1,L2,.." -> dst[0..*n) with 1 <= *n <= max; 0 (after a message naming opt) otherwise. */
int cli_layer_ids(const char *opt, const char *s, int32_t *dst, int *n, int max);

/* --max-line-bytes N at argv[*i], the data readers' bound on a line (ds_data_options; N in bytes,
 * or with a K, M or G suffix: KiB, MiB, GiB): 1 when taken (*out set, *i advanced), 0 when
 * argv[*i] is another option, -1 after a usage message. One parser for every command that
 * reads --data (and tokenize --chat); CLI_MAX_LINE_HELP is its --help line. */
int cli_max_line_option(int argc, char **argv, int *i, size_t *out);
/* --data-format auto|text|jsonl at argv[*i] (ds_data_format_parse): 1 when taken (*out set, *i
 * advanced), 0 when argv[*i] is another option, -1 after a usage message naming cmd. */
int cli_data_format_option(const char *cmd, int argc, char **argv, int *i, ds_data_format *out);
#define CLI_MAX_LINE_HELP                                                                                   \
  "  --max-line-bytes N      the longest data line read whole, in bytes (K, M, G suffixes: KiB, MiB, GiB;\n" \
  "                          default 64M); a plain-text file read as one document counts as one line\n"

/* The --help line of --weights, which main takes out of argv for the commands that run a frozen
 * target (cli_weights_given, dspark/model_source.h). */
#define CLI_WEIGHTS_HELP                                                                                   \
  "  --weights as-stored|bf16|f32  a GGUF's quantized matrices used in place (default), or dequantized\n" \
  "                        to bf16 / f32 at load (docs/compute.md, \"Quantized frozen weights\")\n"

/* The --help line of --kv-cache, which main takes out of argv for the commands that decode with
 * a KV cache (ds_set_kv_cache_dtype, dspark/target.h). */
#define CLI_KV_CACHE_HELP                                                                                 \
  "  --kv-cache f32|f16    the keys and values of past tokens in fp32 or f16, half the bytes a cached\n" \
  "                        token; default f16 for a GGUF's quantized weights used as stored (as\n"       \
  "                        llama.cpp), fp32 otherwise (docs/compute.md, \"The KV cache\")\n"

/* ds_output_check for command cmd, before any work: 0 when the output may be written; else,
 * after the error (naming the option and the input), the command's exit status: 2 for an
 * output over an input (a usage error), 1 for a path that cannot be used (a file where a
 * directory goes, a symlink loop). */
int cli_output_refused(const char *cmd, const char *option, const char *path, ds_output_kind kind,
                       const ds_input_path *inputs, size_t n_inputs);
#define CLI_N_INPUTS(in) (sizeof(in) / sizeof((in)[0]))

/* Option-loop helpers for the subcommands with many options. They expect locals
 * `int i`, `const char *a` (= argv[i]), `const char *v`, `int64_t n`, `double x` and return 2
 * from the command on a usage error (the message names the option). */
#define CLI_VALUE() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
#define CLI_INT(lo, hi, dst) do { CLI_VALUE(); if (!cli_int(a, v, lo, hi, &n)) return 2; dst = n; } while (0)
#define CLI_NUM(lo, hi, dst) do { CLI_VALUE(); if (!cli_float(a, v, lo, hi, &x)) return 2; dst = x; } while (0)

#endif
