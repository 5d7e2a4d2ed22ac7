/* SHA-256 (src/core/sha256.c): FIPS 180-4's examples, digests of other lengths around the block
 * boundaries (from Python's hashlib), and the incremental interface fed in uneven pieces. */
#include <string.h>

#include "core/sha256.h"
#include "test_util.h"

static void digest_hex(ds_sha256_ctx *c, char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  uint8_t d[32];
  ds_sha256_final(c, d);
  for (int i = 0; i < 32; i++) hex[2 * i] = digits[d[i] >> 4], hex[2 * i + 1] = digits[d[i] & 15];
  hex[64] = 0;
}

static void test_standard_examples(void) {
  char hex[65];
  ds_sha256_hex("abc", 3, hex);
  EXPECT(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  ds_sha256_hex(two, strlen(two), hex);
  EXPECT(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  ds_sha256_hex("", 0, hex);
  EXPECT(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  /* one million 'a', fed 1000 at a time */
  char a[1000];
  memset(a, 'a', sizeof a);
  ds_sha256_ctx c;
  ds_sha256_init(&c);
  for (int i = 0; i < 1000; i++) ds_sha256_update(&c, a, sizeof a);
  digest_hex(&c, hex);
  EXPECT(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

/* The padding cases: 55 bytes (one block), 56 (two), 63, 64, 65, 119, 120, 127, 128, ... */
static void test_lengths(void) {
  static const struct {
    size_t n;
    const char *hex;
  } want[] = {
      {1, "ca358758f6d27e6cf45272937977a748fd88391db679ceda7dc7bf1f005ee879"},
      {55, "16ed9c4697ca11d5f6fb25ea7900252dd4cb97215d7f6d0b2bb3e2a86ac0ec72"},
      {56, "939ada93b2fe1e9c596d767bb408567c83e253667f0b25e5be8e16f35f2cbac9"},
      {63, "6073f83b09ae82016cdbe24c18996c48f0eaa08ca675d0f6b90b807fc29e0149"},
      {64, "b337ba9b0c69c391364e985fdcb23a889887e59800832c92fbfa22b8a3c40304"},
      {65, "9d6a3fb113b586b4ab97bc11c993a27bd9b7bbcb756e0646083dc47a679600e6"},
      {119, "9773fbac8194c3d789af101b49b6a26073076895ef6e0f658432849dd477a43f"},
      {120, "070a538f085dd94821d4dc197c5c8b791051891d4fa2a1bf25d3c275236676f7"},
      {127, "5072b7a9a4cda7f6d80f1eff09b8b9653201dba22319daf32c6c05339d57f483"},
      {128, "485a94e53eba9717a5d8b7b4489cad92a752f1c5722e7dfd29dd164b7c438d11"},
      {1000, "533b698850849b7908b20a22658f639c0b2a476f1791f85f50188287c31a9aba"},
  };
  unsigned char pat[1000];
  for (int i = 0; i < 1000; i++) pat[i] = (unsigned char)((i * 131 + 7) & 255);
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    char hex[65];
    ds_sha256_hex(pat, want[k].n, hex);
    if (strcmp(hex, want[k].hex)) fprintf(stderr, "length %zu: %s\n", want[k].n, hex);
    EXPECT(!strcmp(hex, want[k].hex));
    /* the same bytes in pieces of 1, 2, 3, ... bytes */
    ds_sha256_ctx c;
    ds_sha256_init(&c);
    for (size_t at = 0, step = 1; at < want[k].n; at += step, step++)
      ds_sha256_update(&c, pat + at, at + step <= want[k].n ? step : want[k].n - at);
    digest_hex(&c, hex);
    EXPECT(!strcmp(hex, want[k].hex));
  }
}

int main(void) {
  TEST_RUN(test_standard_examples);
  TEST_RUN(test_lengths);
  return TEST_RESULT();
}
