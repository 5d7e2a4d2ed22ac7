/* Counter-based, seedable RNG: the same seed gives the same stream on every machine. */
#ifndef DSPARK_RNG_H
#define DSPARK_RNG_H

#include <stdint.h>

typedef struct { uint64_t state; } ds_rng;

void ds_rng_seed(ds_rng *r, uint64_t seed);
uint64_t ds_rng_next_u64(ds_rng *r);
/* Uniform in [0, 1) with 24 random bits (exactly representable in fp32). */
float ds_rng_uniform_f32(ds_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ds_rng_uniform_f64(ds_rng *r);
/* Mixes several integers (seed, rank, step) into one seed. */
uint64_t ds_seed_mix(uint64_t a, uint64_t b);

#endif
