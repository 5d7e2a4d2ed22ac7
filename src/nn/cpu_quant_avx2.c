/* The quantized row kernel on AVX2 (+ FMA, F16C): the body is nn/cpu_quant_x86.h; here its
 * integer dot product, maddubs (u8 x s8 -> pairs in int16) then madd with ones (-> int32). */
#if defined(__x86_64__) || defined(__i386__)
#define QT __attribute__((target("avx2,fma,f16c")))
#define QDOT(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#define QROWS ds_quant_rows_avx2
#include "nn/cpu_quant_x86.h"
#endif
