/* The quantized row kernel with AVX-512 VNNI (used at 256 bits through AVX-512 VL): the body is
 * nn/cpu_quant_x86.h; here its integer dot product, one dpbusd (u8 x s8 summed in fours into
 * int32, no int16 step). */
#if defined(__x86_64__) || defined(__i386__)
#define QT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QDOT(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define QROWS ds_quant_rows_vnni
#include "nn/cpu_quant_x86.h"
#endif
