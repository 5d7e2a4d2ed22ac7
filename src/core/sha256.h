/* SHA-256 (FIPS 180-4), one-shot and incremental, for content identifiers that another program
 * computes with it (llama.cpp's converter names a tokenizer's pre-tokenizer by the SHA-256 of
 * its ids on a check text: src/model/hf_vocab_pre.c). Not for secrets: no constant time. */
#ifndef DSPARK_CORE_SHA256_H
#define DSPARK_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t bytes;        /* message length so far */
  unsigned char buf[64]; /* a partial block */
  size_t fill;
} ds_sha256_ctx;

void ds_sha256_init(ds_sha256_ctx *c);
void ds_sha256_update(ds_sha256_ctx *c, const void *data, size_t len);
void ds_sha256_final(ds_sha256_ctx *c, uint8_t digest[32]);
/* The digest of data[0..len) as 64 lowercase hex digits and a NUL (hex[65]). */
void ds_sha256_hex(const void *data, size_t len, char hex[65]);

#endif
