/* The AVX-512 VNNI direct product on the 8-row packed copies of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
 * weights (the kernel in nn/cpu_quant_packed_x86.h, one 256-bit dpbusd as its integer dot). On an AMD EPYC Zen 4
 * it decoded SmolLM2 Q4_1 faster than the 16-row kernel of cpu_quant_avx512.c, which transposes
 * each block of the stored rows in registers (docs/compute.md). */
#if defined(__x86_64__) || defined(__i386__)
#define PT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define PACKED_VNNI 1
#define PACKED_ROWS ds_quant_packed_rows_vnni
#include "nn/cpu_quant_packed_x86.h"
#endif
