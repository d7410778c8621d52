/* cublas-load.c — cuBLAS, opened when the first GPU context asks for it.
 *
 * Merely loading libcublas (with the libcublasLt it pulls in) costs a process about
 * 0.1 s and 210 MB of resident memory before main() runs.  Linked into parasol, that
 * would be paid by every command, a one-line `parasol simulate` included, though only
 * the executor's CUDA back end and the profiler call cuBLAS.  So parasol does not link
 * it: the few cuBLAS functions the operator library calls are defined here and forward
 * to the library, which the first of them opens (dlopen, by the soname of the major
 * version the headers are from; LD_LIBRARY_PATH and the program's run path are searched
 * as for a linked library).  If it cannot be opened, the calls fail with
 * CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString() says why, which is what the
 * context's error message then reports. */
#include "parasol-cuda.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <glib.h>
#include <stdio.h>
#include <string.h>

#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)

typedef struct {
  cublasStatus_t (*create)(cublasHandle_t *);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  const char *(*status_string)(cublasStatus_t);
  cublasStatus_t (*gemm_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                    int, int, const void *, const void *const[], cudaDataType,
                                    int, const void *const[], cudaDataType, int, const void *,
                                    void *const[], cudaDataType, int, int, cublasComputeType_t,
                                    cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t,
                                            cublasOperation_t, int, int, int, const void *,
                                            const void *, cudaDataType, int, long long int,
                                            const void *, cudaDataType, int, long long int,
                                            const void *, void *, cudaDataType, int,
                                            long long int, int, cublasComputeType_t,
                                            cublasGemmAlgo_t);
} Api;

static Api api_;
static gboolean loaded_;
static char load_error_[512];

static gpointer load(gpointer unused)
{
  void *lib = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_error_, sizeof load_error_, "cuBLAS could not be loaded: %s", dlerror());
    return NULL;
  }
  static const struct {
    const char *name;
    size_t offset;
  } entries[] = {
    { "cublasCreate_v2", G_STRUCT_OFFSET(Api, create) },
    { "cublasDestroy_v2", G_STRUCT_OFFSET(Api, destroy) },
    { "cublasSetStream_v2", G_STRUCT_OFFSET(Api, set_stream) },
    { "cublasGetStatusString", G_STRUCT_OFFSET(Api, status_string) },
    { "cublasGemmBatchedEx", G_STRUCT_OFFSET(Api, gemm_batched_ex) },
    { "cublasGemmStridedBatchedEx", G_STRUCT_OFFSET(Api, gemm_strided_batched_ex) },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(entries); i++) {
    void *f = dlsym(lib, entries[i].name);
    if (!f) {
      snprintf(load_error_, sizeof load_error_, "%s has no %s: not the cuBLAS %d parasol was built for",
               CUBLAS_SONAME, entries[i].name, CUBLAS_VER_MAJOR);
      dlclose(lib);
      memset(&api_, 0, sizeof api_);
      return NULL;
    }
    /* POSIX lets a data pointer hold a function's address (dlsym's own contract). */
    memcpy((char *)&api_ + entries[i].offset, &f, sizeof f);
  }
  loaded_ = TRUE;
  return NULL;
}

static const Api *api(void)
{
  static GOnce once = G_ONCE_INIT;
  g_once(&once, load, NULL);
  return loaded_ ? &api_ : NULL;
}

const char *pcu_cublas_load(void)
{
  return api() ? NULL : load_error_;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle)
{
  const Api *a = api();
  return a ? a->create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle)
{
  const Api *a = api();
  return a ? a->destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
  const Api *a = api();
  return a ? a->set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status)
{
  const Api *a = api();
  return a ? a->status_string(status) : load_error_;
}

cublasStatus_t CUBLASWINAPI cublasGemmBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *const Aarray[], cudaDataType Atype, int lda,
    const void *const Barray[], cudaDataType Btype, int ldb, const void *beta,
    void *const Carray[], cudaDataType Ctype, int ldc, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
  const Api *a = api();
  if (!a)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  return a->gemm_batched_ex(handle, transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray,
                            Btype, ldb, beta, Carray, Ctype, ldc, batchCount, computeType,
                            algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta,
    void *C, cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
  const Api *a = api();
  if (!a)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  return a->gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                                    strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
                                    strideC, batchCount, computeType, algo);
}
