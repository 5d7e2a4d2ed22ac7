/* The instruction set of the CPU backend's own kernels (cpu_isa.h). */
#include "nn/cpu_isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define DS_X86 1
#include <cpuid.h>

/* F16C from cpuid leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c" */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static ds_isa isa_of_cpu(void) {
#ifdef DS_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return DS_ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) return DS_ISA_AVX2;
#endif
  return DS_ISA_PORTABLE;
}

static ds_isa g_best = DS_ISA_PORTABLE;

static void isa_decide(void) {
  ds_isa isa = isa_of_cpu(), cap = DS_ISA_AVX512;
  const char *e = getenv("DSPARK_MAX_ISA");
  if (e && *e) {
    if (!strcmp(e, "portable")) cap = DS_ISA_PORTABLE;
    else if (!strcmp(e, "avx2")) cap = DS_ISA_AVX2;
    else if (strcmp(e, "avx512"))
      fprintf(stderr, "warning: DSPARK_MAX_ISA=%s is not avx512, avx2 or portable; ignored\n", e);
  }
  g_best = isa < cap ? isa : cap;
}

ds_isa ds_isa_best(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, isa_decide);
  return g_best;
}

static int g_amd, g_family;

static void vendor_decide(void) {
#ifdef DS_X86
  unsigned a, b, c, d, v[3];
  if (!__get_cpuid(0, &a, &v[0], &v[2], &v[1])) return; /* the vendor string is in EBX, EDX, ECX */
  g_amd = !memcmp(v, "AuthenticAMD", 12);
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  g_family = (int)((a >> 8) & 0xF);
  if (g_family == 0xF) g_family += (int)((a >> 20) & 0xFF);
#endif
}

/* Once per process: under a hypervisor every cpuid traps, and this is asked per matmul. */
static pthread_once_t g_vendor_once = PTHREAD_ONCE_INIT;

int ds_cpu_is_amd(void) {
  pthread_once(&g_vendor_once, vendor_decide);
  return g_amd;
}

int ds_cpu_family(void) {
  pthread_once(&g_vendor_once, vendor_decide);
  return g_family;
}

/* $DSPARK_WEIGHT_PREFETCH, else this CPU's rule; -1: each kernel's own distance. Decided once:
 * the quantized kernels ask for it on every product. */
static long long g_prefetch = -1;

static void prefetch_decide(void) {
  const char *e = getenv("DSPARK_WEIGHT_PREFETCH");
  if (e && *e) {
    char *end;
    long long v = strtoll(e, &end, 10);
    if (!*end && v >= 0 && v <= (1 << 20)) {
      g_prefetch = v;
      return;
    }
    fprintf(stderr, "warning: DSPARK_WEIGHT_PREFETCH=%s is not a byte count in 0 .. 1048576; ignored\n", e);
  }
  if (ds_cpu_is_amd() && ds_cpu_family() >= 26) g_prefetch = 8192;
}

size_t ds_weight_prefetch_bytes(size_t elsewhere) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, prefetch_decide);
  return g_prefetch >= 0 ? (size_t)g_prefetch : elsewhere;
}

const char *ds_isa_name(ds_isa isa) {
  return isa == DS_ISA_AVX512 ? "AVX-512" : isa == DS_ISA_AVX2 ? "AVX2" : "portable";
}
