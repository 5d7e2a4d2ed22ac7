/* CUDA emulation (see cuda_runtime.h): cublasGemmEx and cublasGemmStridedBatchedEx as cuBLAS documents them (column-major,
 * C = alpha op(A) op(B) + beta C), on fp32 or bf16 inputs, fp32 output, double accumulation. */
#ifndef DSPARK_CUDA_EMU_CUBLAS_H
#define DSPARK_CUDA_EMU_CUBLAS_H
#include "cuda_runtime.h"
typedef struct emu_cublas *cublasHandle_t;
typedef int cublasStatus_t;
#define CUBLAS_STATUS_SUCCESS 0
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUDA_R_32F, CUDA_R_16BF } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT } cublasGemmAlgo_t;
typedef enum { CUBLAS_DEFAULT_MATH } cublasMath_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t ctype, cublasGemmAlgo_t algo);
/* batchCount products of cublasGemmEx, operand i at A + i * strideA elements (B, C likewise). */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long strideA, const void *B, cudaDataType_t bt, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType_t ct, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t ctype,
                                          cublasGemmAlgo_t algo);
#endif
