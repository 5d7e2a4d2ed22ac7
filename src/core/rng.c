#include "dspark/rng.h"

/* splitmix64: tiny state, full period 2^64, passes BigCrush; enough for sampling and init. */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void ds_rng_seed(ds_rng *r, uint64_t seed) { r->state = seed; }
uint64_t ds_rng_next_u64(ds_rng *r) { return splitmix64(&r->state); }
float ds_rng_uniform_f32(ds_rng *r) { return (float)(ds_rng_next_u64(r) >> 40) * (1.0f / 16777216.0f); }
double ds_rng_uniform_f64(ds_rng *r) { return (double)(ds_rng_next_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
uint64_t ds_seed_mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0x9e3779b97f4a7c15ull);
  return splitmix64(&x);
}
