/* The instruction set the CPU backend's own kernels run (cpu_isa.c): chosen once per process from
 * cpuid, capped by $DSPARK_MAX_ISA. Not a public header. */
#ifndef DSPARK_NN_CPU_ISA_H
#define DSPARK_NN_CPU_ISA_H

#include <stddef.h>

typedef enum { DS_ISA_PORTABLE = 0, DS_ISA_AVX2, DS_ISA_AVX512 } ds_isa;

/* The best instruction set this CPU (and OS) supports for these kernels: AVX-512F, or AVX2
 * with FMA and F16C, else portable C; never above $DSPARK_MAX_ISA (avx512 | avx2 | portable),
 * which lets a test run an AVX-512 machine as a CPU without AVX-512 runs (with oneDNN's
 * DNNL_MAX_CPU_ISA and MKL's MKL_ENABLE_INSTRUCTIONS for the libraries). */
ds_isa ds_isa_best(void);
const char *ds_isa_name(ds_isa isa);
/* 1 on an AMD CPU (cpuid vendor "AuthenticAMD"): for choices measured per vendor, such as the bf16
 * GEMM route (Zen 4's bf16 dot products outrun its fp32 FMAs, an Intel CPU's without AMX do not). */
int ds_cpu_is_amd(void);
/* The CPU's family as cpuid leaf 1 gives it (base family, plus the extended one where the base is
 * 15): 25 for AMD Zen 3 and Zen 4, 26 for Zen 5, 6 for Intel's cores; 0 where unknown. */
int ds_cpu_family(void);
/* How far ahead (bytes) the kernels that stream a frozen weight once per product, the quantized
 * packed ones and the 16-bit AVX-512 ones, ask for it: $DSPARK_WEIGHT_PREFETCH where set (0 .. 1
 * MiB; 0 for none), else 8 KiB on AMD family 26 and later (Zen 5), else the kernel's own measured
 * distance, elsewhere. On a Zen 5 their products and the stream overlapped only in part with
 * short distances or none (docs/compute.md); no other CPU has measured 8 KiB yet. */
size_t ds_weight_prefetch_bytes(size_t elsewhere);

#endif
