/* Status codes, error reporting, invariant checks and dtypes shared by every module.
 *
 * Library functions return a ds_status and never exit. On failure they record a message a
 * user can act on (naming the file, tensor or field) that ds_last_error() returns; the
 * message lives in thread-local storage so two threads never see each other's errors. */
#ifndef DSPARK_COMMON_H
#define DSPARK_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DS_OK = 0,
  DS_ERR_IO,          /* open/read/write/mmap failed */
  DS_ERR_FORMAT,      /* a file's content is malformed or inconsistent */
  DS_ERR_ARG,         /* a caller passed an invalid value or option */
  DS_ERR_UNSUPPORTED, /* well formed, but a feature this build does not implement */
  DS_ERR_NOMEM,       /* allocation failed */
  DS_ERR_RANGE,       /* an index or id outside its valid range */
  DS_ERR_NOT_FOUND,   /* a named tensor, field or token is absent */
  DS_ERR_NUMERIC,     /* non-finite value where a finite one is required */
  DS_ERR_INTERNAL     /* a bug: an invariant that should hold did not */
  /* grow only at the end */
} ds_status;

const char *ds_status_name(ds_status st);

/* Records "file:line: message" as the calling thread's last error and returns st. */
ds_status ds_error_set(ds_status st, const char *src_file, int src_line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prepends context ("while loading X: ") to the current message and returns st unchanged. */
ds_status ds_error_wrap(ds_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *ds_last_error(void);
void ds_error_clear(void);

#define DS_FAIL(st, ...) ds_error_set((st), __FILE__, __LINE__, __VA_ARGS__)
#define DS_TRY(expr)                  \
  do {                                \
    ds_status ds_try_st_ = (expr);    \
    if (ds_try_st_ != DS_OK) return ds_try_st_; \
  } while (0)

/* Invariant check, on in release builds: prints the condition and calls the abort hook. */
typedef void (*ds_abort_hook)(const char *msg);
void ds_set_abort_hook(ds_abort_hook hook);
void ds_check_failed(const char *src_file, int src_line, const char *cond) __attribute__((noreturn));
#define DS_CHECK(cond) \
  do { if (!(cond)) ds_check_failed(__FILE__, __LINE__, #cond); } while (0)

/* Storage dtypes (safetensors names). Compute is fp32. The quantized ones (GGUF's block types,
 * dspark/ggml_quant.h) only ever describe a frozen weight held in place (ds_weight); no
 * safetensors file carries them (ds_dtype_from_name does not know them) and ds_dtype_size is 0. */
typedef enum {
  DS_F32 = 0, DS_F16, DS_BF16, DS_F64, DS_I64, DS_I32, DS_I16, DS_I8, DS_U8, DS_BOOL,
  DS_Q8_0, DS_Q4_0, DS_Q4_1, DS_Q4_K, DS_Q6_K, DS_Q5_0, DS_Q5_1, /* grow only here, before the count */
  DS_DTYPE_COUNT
} ds_dtype;

/* A read-only (frozen, never trained) matrix in its storage dtype, as the backend's *_w
 * kernels read it (include/dspark/backend.h): F32, BF16 or F16, row-major and contiguous, data
 * aligned to its element size; or one of GGUF's quantized types (Q8_0 ... Q5_1), rows of
 * blocks as GGUF stores them (dspark/ggml_quant.h), any alignment. The memory belongs to whoever made it (a model's buffer, a
 * checkpoint's mapping) and must outlive every use. */
typedef struct {
  const void *data;
  ds_dtype dtype;
} ds_weight;

size_t ds_dtype_size(ds_dtype dt);
const char *ds_dtype_name(ds_dtype dt);            /* "F32", "BF16", ... */
int ds_dtype_from_name(const char *name, ds_dtype *out); /* 1 on success */

/* Allocation that records DS_ERR_NOMEM with the purpose on failure. */
void *ds_malloc(size_t nbytes, const char *what);
void *ds_calloc(size_t n, size_t size, const char *what);
/* 64-byte aligned (for SIMD and BLAS); free with ds_free_aligned. */
void *ds_malloc_aligned(size_t nbytes, const char *what);
/* The same for a large buffer read whole, again and again (frozen weights): from 2 MiB on, 2 MiB
 * aligned and advised for transparent huge pages (Linux), which a decode step streams without a
 * TLB miss every 4 KiB; free with ds_free_aligned. Not for buffers touched sparsely (a KV
 * cache): each touched 2 MiB becomes resident whole. */
void *ds_malloc_huge(size_t nbytes, const char *what);
void ds_free_aligned(void *p);

double ds_time_sec(void); /* monotonic clock */
/* The median of v[n] (n >= 1; the mean of the middle two when n is even), v sorted in place:
 * for timings taken several times. */
double ds_median(double *v, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
