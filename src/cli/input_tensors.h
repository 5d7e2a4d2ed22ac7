/* Tensors read from a user's safetensors input file (`dspark draft-forward`, `dspark loss`).
 * Every tensor is checked before use: presence, dtype, shape and, as it is read, the range of
 * every value. Each refusal is a DS_FAIL naming the file and the tensor, and for a bad value
 * its index ("FILE: tensor 'input_ids' holds 1099511627776 at [3]; ..."). */
#ifndef DSPARK_CLI_INPUT_TENSORS_H
#define DSPARK_CLI_INPUT_TENSORS_H

#include <stdint.h>

#include "dspark/safetensors.h"

/* Allowed dtypes, as bit sets of (1u << ds_dtype). */
#define CLI_DT(d) (1u << (d))
#define CLI_DT_INTS (CLI_DT(DS_I32) | CLI_DT(DS_I64))
#define CLI_DT_MASKS (CLI_DT(DS_U8) | CLI_DT(DS_BOOL))
#define CLI_DT_FLOATS (CLI_DT(DS_F32) | CLI_DT(DS_F16) | CLI_DT(DS_BF16))

/* *out = tensor `name`, or NULL when it is absent and not required. Its dtype must be in
 * `dtypes`. */
ds_status cli_in_get(const ds_safetensors *st, const char *name, int required, unsigned dtypes,
                     const ds_tensor_view **out);
/* The view's shape must be `shape[0..ndim)`; the message shows `symbolic` (e.g. "[T, m*d]")
 * beside the numbers. */
ds_status cli_in_shape(const ds_tensor_view *v, int ndim, const int64_t *shape, const char *symbolic);
/* "[2, 5]": the multi-dimensional index of flat element i of v. */
void cli_in_index(const ds_tensor_view *v, int64_t i, char *buf, size_t cap);
/* Integers (I32 / I64) into dst[numel]; every value must lie in [lo, hi], else an error
 * naming the value, its index and `what` (the meaning of the range). */
ds_status cli_in_ints(const ds_tensor_view *v, int64_t lo, int64_t hi, const char *what, int64_t *dst);
/* A mask (U8: nonzero = 1; BOOL: each byte 0 or 1) into dst[numel] as 0 / 1. */
ds_status cli_in_mask(const ds_tensor_view *v, uint8_t *dst);
/* Floats (F32 / F16 / BF16) into dst[numel] as fp32 (any value, NaN included). */
ds_status cli_in_floats(const ds_tensor_view *v, float *dst);
/* Index of the first NaN or infinite value of x[0..n), or -1. (allow_neg_inf: -inf is fine.) */
int64_t cli_first_nonfinite(const float *x, int64_t n, int allow_neg_inf);
/* A warning on stderr for each tensor of st whose name is not in names[0..n): an ignored
 * tensor is usually a misspelt one. */
void cli_in_warn_unknown(const ds_safetensors *st, const char *const *names, int n, const char *command);
/* fp32 data of an F32 view, aligned: the mapping itself when it is aligned, else a copy in *own
 * (NULL on failure; the caller frees *own). */
const float *cli_in_f32(const ds_tensor_view *v, float **own);
/* Reads one byte per page of p[0..nbytes) so that a mapped input is resident before a clock
 * starts: a timing line then covers the work alone, not the page faults of reading the file. */
void cli_page_in(const void *p, size_t nbytes);
/* ds_malloc of count elements of size bytes, refusing (DS_ERR_NOMEM, naming what and the
 * element count) a product that overflows size_t. */
void *cli_alloc(int64_t count, size_t size, const char *what);

#endif
