/* A corpus n-gram table for speculative proposals (`speculate --lookup-corpus`, spec/dspark.md
 * section 8: any proposal is lossless, its source only decides how often it is accepted).
 *
 * Built from training data (ds_dataset): for every supervised token (an answer's, the loss mask's
 * 1s) and every context of the 1 .. DS_NGRAM_MAX_CONTEXT tokens before it (prompt tokens
 * included, so the first token of an answer has the template's "assistant" turn as context), the
 * table keeps the token that followed the context most often, that count, and how often the
 * context was followed by a supervised token at all. A proposal continues a request from the
 * longest context that occurred, one token at a time, each new token becoming context.
 *
 * Contexts are keyed by a 64-bit hash of their tokens: two contexts that collide (odds near
 * 1e-7 over millions of contexts) share an entry, which makes a proposal worse and never the
 * output wrong. Built once per run in O(tokens) time; memory about 24 bytes a context. */
#ifndef DSPARK_NGRAM_H
#define DSPARK_NGRAM_H

#include "dspark/common.h"
#include "dspark/dataset.h"
#include "dspark/sequences.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest context a proposal matches. */
enum { DS_NGRAM_MAX_CONTEXT = 4 };

typedef struct ds_ngram ds_ngram;

/* The table of data's supervised tokens; an error when it holds none. */
ds_status ds_ngram_build(const ds_dataset *data, ds_ngram **out);
/* The table of the training data at inputs (ds_dataset_read: conversations rendered with tmpl
 * and enable_thinking, supervised on the assistant turns; plain text on every token, documents
 * joined by eos_id), each sequence cut at DS_NGRAM_SEQ_LEN tokens. */
enum { DS_NGRAM_SEQ_LEN = 4096 };
ds_status ds_ngram_load(const char *inputs, const ds_data_options *opt, const ds_tokenizer *tok,
                        const ds_chat_template *tmpl, int enable_thinking, int32_t eos_id, ds_ngram **out);
void ds_ngram_free(ds_ngram *g);
/* Contexts held; supervised tokens counted. */
int64_t ds_ngram_contexts(const ds_ngram *g);
int64_t ds_ngram_tokens(const ds_ngram *g);

/* Up to L tokens that continue ctx [n] (its last DS_NGRAM_MAX_CONTEXT tokens are read) into
 * out [L], and for each its share [L]: count of the token after its context / (occurrences of
 * the context + 1), an estimate of the chance it is accepted given the ones before were (the
 * + 1 keeps a context seen once at 1/2). Stops before a token whose context never occurred or
 * once the product of the shares falls below min_chain. Returns the tokens proposed. */
int64_t ds_ngram_propose(const ds_ngram *g, const int32_t *ctx, int64_t n, int64_t L, double min_chain, int32_t *out,
                         double *share);

#ifdef __cplusplus
}
#endif
#endif
