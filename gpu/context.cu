/* context.cu — contexts, checked calls, device memory, events, strided copies and the
 * dense operands the operator families compute on. */
#include "common.cuh"

#include <nccl.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Errors                                                                              */

PcuStatus pcu_fail(PcuContext *ctx, PcuStatus status, const char *file, int line,
                   const char *call, const char *what)
{
  if (ctx) {
    const char *base = strrchr(file, '/');
    snprintf(ctx->error, sizeof ctx->error, "%s:%d: %s%s%s", base ? base + 1 : file, line, call,
             *call ? ": " : "", what);
  }
  return status;
}

PcuStatus pcu_fail_cuda(PcuContext *ctx, cudaError_t e, const char *file, int line,
                        const char *call)
{
  char what[256];
  snprintf(what, sizeof what, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  PcuStatus s = PCU_ERR_CUDA;
  if (e == cudaErrorMemoryAllocation)
    s = PCU_ERR_NO_MEMORY;
  else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
           e == cudaErrorInvalidDevice)
    s = PCU_ERR_NO_DEVICE;
  return pcu_fail(ctx, s, file, line, call, what);
}

const char *pcu_context_error(const PcuContext *ctx)
{
  return ctx ? ctx->error : "";
}

int pcu_dtype_size(int dtype)
{
  switch (dtype) {
  case PCU_F32: return 4;
  case PCU_F16: return 2;
  case PCU_BF16: return 2;
  case PCU_I32: return 4;
  case PCU_I64: return 8;
  default: return 0;
  }
}

cudaDataType_t pcu_cuda_type(int dtype)
{
  switch (dtype) {
  case PCU_F16: return CUDA_R_16F;
  case PCU_BF16: return CUDA_R_16BF;
  default: return CUDA_R_32F;
  }
}

cudnnDataType_t pcu_cudnn_type(int dtype)
{
  switch (dtype) {
  case PCU_F16: return CUDNN_DATA_HALF;
  case PCU_BF16: return CUDNN_DATA_BFLOAT16;
  default: return CUDNN_DATA_FLOAT;
  }
}

/* ---------------------------------------------------------------------------------- */
/* Devices and contexts                                                                */

int pcu_device_count(char *error, size_t error_size)
{
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (error && error_size)
      snprintf(error, error_size, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
               cudaGetErrorString(e));
    return -1;
  }
  return n;
}

static void append(char *out, size_t size, const char *fmt, ...)
{
  size_t len = strlen(out);
  if (len + 1 >= size)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + len, size - len, fmt, ap);
  va_end(ap);
}

PcuStatus pcu_device_describe(int device, char *out, size_t out_size)
{
  if (!out || !out_size)
    return PCU_ERR_INVALID;
  out[0] = '\0';
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    snprintf(out, out_size, "error=cudaGetDeviceProperties: %s\n", cudaGetErrorString(e));
    return PCU_ERR_NO_DEVICE;
  }
  int driver = 0, runtime = 0, nccl = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  append(out, out_size, "name=%s\n", prop.name);
  append(out, out_size, "memory=%.1f GiB\n", (double)prop.totalGlobalMem / (1 << 30));
  append(out, out_size, "sms=%d\n", prop.multiProcessorCount);
  append(out, out_size, "compute_capability=%d.%d\n", prop.major, prop.minor);
  append(out, out_size, "cuda_driver=%d.%d\n", driver / 1000, driver % 1000 / 10);
  append(out, out_size, "cuda_runtime=%d.%d\n", runtime / 1000, runtime % 1000 / 10);
  append(out, out_size, "cudnn=%zu\n", cudnnGetVersion());
  append(out, out_size, "nccl=%d.%d.%d\n", nccl / 10000, nccl / 100 % 100, nccl % 100);
  return PCU_OK;
}

PcuContext *pcu_context_new(int device, int libraries, char *error, size_t error_size)
{
  PcuContext *ctx = (PcuContext *)calloc(1, sizeof(PcuContext));
  if (!ctx) {
    if (error && error_size)
      snprintf(error, error_size, "out of host memory");
    return NULL;
  }
  ctx->device = device;
  PcuStatus s = PCU_OK;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    s = pcu_fail_cuda(ctx, e, __FILE__, __LINE__, "cudaGetDeviceCount(&n)");
  } else if (device < 0 || device >= n) {
    snprintf(ctx->error, sizeof ctx->error, "GPU %d does not exist: %d GPU%s present", device,
             n, n == 1 ? "" : "s");
    s = PCU_ERR_NO_DEVICE;
  }
  if (s == PCU_OK)
    s = pcu_context_activate(ctx);
  if (s == PCU_OK) {
    e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
      s = pcu_fail_cuda(ctx, e, __FILE__, __LINE__, "cudaStreamCreateWithFlags");
  }
  if (s == PCU_OK) {
    /* Freed scratch stays in the pool for the next call instead of going back to the
     * driver, which would synchronize. */
    cudaMemPool_t pool;
    e = cudaDeviceGetDefaultMemPool(&pool, device);
    uint64_t keep = UINT64_MAX;
    if (e == cudaSuccess)
      e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess)
      s = pcu_fail_cuda(ctx, e, __FILE__, __LINE__, "cudaMemPoolSetAttribute");
  }
  if (s == PCU_OK && libraries) {
    cublasStatus_t b = cublasCreate(&ctx->blas);
    if (b == CUBLAS_STATUS_SUCCESS)
      b = cublasSetStream(ctx->blas, ctx->stream);
    if (b != CUBLAS_STATUS_SUCCESS)
      s = pcu_fail(ctx, PCU_ERR_CUDA, __FILE__, __LINE__, "cublasCreate",
                   cublasGetStatusString(b));
  }
  if (s == PCU_OK && libraries) {
    cudnnStatus_t d = cudnnCreate(&ctx->dnn);
    if (d == CUDNN_STATUS_SUCCESS)
      d = cudnnSetStream(ctx->dnn, ctx->stream);
    if (d != CUDNN_STATUS_SUCCESS)
      s = pcu_fail(ctx, PCU_ERR_CUDA, __FILE__, __LINE__, "cudnnCreate",
                   cudnnGetErrorString(d));
  }
  if (s != PCU_OK) {
    if (error && error_size)
      snprintf(error, error_size, "%s", ctx->error);
    pcu_context_free(ctx);
    return NULL;
  }
  return ctx;
}

void pcu_context_free(PcuContext *ctx)
{
  if (!ctx)
    return;
  cudaSetDevice(ctx->device);
  if (ctx->stream)
    cudaStreamSynchronize(ctx->stream);
  if (ctx->workspace)
    cudaFree(ctx->workspace);
  if (ctx->dnn)
    cudnnDestroy(ctx->dnn);
  if (ctx->blas)
    cublasDestroy(ctx->blas);
  if (ctx->stream)
    cudaStreamDestroy(ctx->stream);
  free(ctx);
}

int pcu_context_device(const PcuContext *ctx)
{
  return ctx->device;
}

void *pcu_context_stream(PcuContext *ctx)
{
  return (void *)ctx->stream;
}

PcuStatus pcu_context_activate(PcuContext *ctx)
{
  CUDA_CHECK(ctx, cudaSetDevice(ctx->device));
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Memory and events                                                                   */

PcuStatus pcu_malloc(PcuContext *ctx, size_t bytes, void **out)
{
  *out = NULL;
  CUDA_CHECK(ctx, cudaMallocAsync(out, bytes ? bytes : 1, ctx->stream));
  CUDA_CHECK(ctx, cudaMemsetAsync(*out, 0, bytes ? bytes : 1, ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_free(PcuContext *ctx, void *p)
{
  if (p)
    CUDA_CHECK(ctx, cudaFreeAsync(p, ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_memset_zero(PcuContext *ctx, void *p, size_t bytes)
{
  CUDA_CHECK(ctx, cudaMemsetAsync(p, 0, bytes, ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_upload(PcuContext *ctx, void *dst, const void *src, size_t bytes)
{
  CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
  /* The host buffer may be reused as soon as this returns. */
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_download(PcuContext *ctx, void *dst, const void *src, size_t bytes)
{
  CUDA_CHECK(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_synchronize(PcuContext *ctx)
{
  CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_events_new(PcuContext *ctx, int n, void **events)
{
  for (int i = 0; i < n; i++)
    events[i] = NULL;
  for (int i = 0; i < n; i++) {
    cudaEvent_t e;
    cudaError_t err = cudaEventCreate(&e);
    if (err != cudaSuccess) {
      pcu_events_free(ctx, i, events);
      return pcu_fail_cuda(ctx, err, __FILE__, __LINE__, "cudaEventCreate(&e)");
    }
    events[i] = (void *)e;
  }
  return PCU_OK;
}

void pcu_events_free(PcuContext *ctx, int n, void **events)
{
  for (int i = 0; i < n; i++)
    if (events[i]) {
      cudaEventDestroy((cudaEvent_t)events[i]);
      events[i] = NULL;
    }
}

PcuStatus pcu_event_record(PcuContext *ctx, void *event)
{
  CUDA_CHECK(ctx, cudaEventRecord((cudaEvent_t)event, ctx->stream));
  return PCU_OK;
}

PcuStatus pcu_event_elapsed(PcuContext *ctx, void *start, void *end, double *seconds)
{
  float ms = 0.f;
  CUDA_CHECK(ctx, cudaEventSynchronize((cudaEvent_t)end));
  CUDA_CHECK(ctx, cudaEventElapsedTime(&ms, (cudaEvent_t)start, (cudaEvent_t)end));
  *seconds = 1e-3 * (double)ms;
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Filling and copying regions                                                         */

int64_t pcu_region_numel(const PcuRegion *r)
{
  int64_t n = 1;
  for (int d = 0; d < r->ndim; d++)
    n *= r->hi[d] > r->lo[d] ? r->hi[d] - r->lo[d] : 0;
  return n;
}

Strided pcu_strided(const PcuView *v, const PcuRegion *r)
{
  Strided s;
  memset(&s, 0, sizeof s);
  s.dtype = v->dtype;
  s.ndim = r->ndim;
  int64_t off = 0;
  for (int d = 0; d < r->ndim; d++) {
    s.size[d] = r->hi[d] - r->lo[d];
    s.stride[d] = v->stride[d];
    off += (r->lo[d] - v->lo[d]) * v->stride[d];
  }
  if (s.ndim == 0) {
    s.ndim = 1;
    s.size[0] = 1;
    s.stride[0] = 1;
  }
  s.base = (char *)v->data + off * pcu_dtype_size(v->dtype);
  return s;
}

bool pcu_view_is_dense_region(const PcuView *v, const PcuRegion *r)
{
  if (v->ndim != r->ndim)
    return false;
  int64_t expect = 1;
  for (int d = r->ndim - 1; d >= 0; d--) {
    if (v->lo[d] != r->lo[d] || v->hi[d] != r->hi[d])
      return false;
    /* A dimension of extent 1 may have any stride. */
    if (r->hi[d] - r->lo[d] > 1 && v->stride[d] != expect)
      return false;
    expect *= r->hi[d] - r->lo[d];
  }
  return true;
}

PcuView pcu_view_dense(void *data, int dtype, const PcuRegion *region)
{
  PcuView v;
  memset(&v, 0, sizeof v);
  v.data = data;
  v.dtype = dtype;
  v.ndim = region->ndim;
  int64_t st = 1;
  for (int d = region->ndim - 1; d >= 0; d--) {
    v.lo[d] = region->lo[d];
    v.hi[d] = region->hi[d];
    v.stride[d] = st;
    st *= region->hi[d] - region->lo[d];
  }
  return v;
}

template <typename T>
__global__ void fill_kernel(Strided s, int64_t n, float value)
{
  T v = from_f<T>(value);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    ((T *)s.base)[strided_offset(s, i)] = v;
}

template <typename T>
static PcuStatus fill_t(PcuContext *ctx, Strided s, int64_t n, float value)
{
  fill_kernel<T><<<pcu_blocks(n), 256, 0, ctx->stream>>>(s, n, value);
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

PcuStatus pcu_fill(PcuContext *ctx, const PcuView *v, const PcuRegion *region, float value)
{
  int64_t n = pcu_region_numel(region);
  if (n == 0)
    return PCU_OK;
  Strided s = pcu_flatten(pcu_strided(v, region));
  DISPATCH_FLOAT(ctx, v->dtype, fill_t, ctx, s, n, value);
}

template <typename D, typename S>
__global__ void copy_kernel(Strided dst, Strided src, int64_t n, bool accumulate)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    D *d = (D *)dst.base + strided_offset(dst, i);
    float x = to_f<S>(((const S *)src.base)[strided_offset(src, i)]);
    *d = from_f<D>(accumulate ? to_f<D>(*d) + x : x);
  }
}

__global__ void copy_i64_kernel(Strided dst, Strided src, int64_t n)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    ((int64_t *)dst.base)[strided_offset(dst, i)] =
      ((const int64_t *)src.base)[strided_offset(src, i)];
}

__global__ void copy_i32_to_i64_kernel(Strided dst, Strided src, int64_t n)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    ((int64_t *)dst.base)[strided_offset(dst, i)] =
      ((const int32_t *)src.base)[strided_offset(src, i)];
}

template <typename D>
static PcuStatus copy_from(PcuContext *ctx, Strided d, Strided s, int64_t n, bool acc)
{
  switch (s.dtype) {
  case PCU_F32: copy_kernel<D, float><<<pcu_blocks(n), 256, 0, ctx->stream>>>(d, s, n, acc); break;
  case PCU_F16: copy_kernel<D, __half><<<pcu_blocks(n), 256, 0, ctx->stream>>>(d, s, n, acc); break;
  case PCU_BF16:
    copy_kernel<D, __nv_bfloat16><<<pcu_blocks(n), 256, 0, ctx->stream>>>(d, s, n, acc);
    break;
  default: return FAIL(ctx, PCU_ERR_UNSUPPORTED, "copy between floating and integer types");
  }
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

/* Copies between two strided regions of equal sizes. */
static PcuStatus copy_strided(PcuContext *ctx, Strided d, Strided s, int64_t n, bool accumulate)
{
  if (n == 0)
    return PCU_OK;
  d = pcu_flatten(d);
  s = pcu_flatten(s);
  if (d.dtype == PCU_I64 || d.dtype == PCU_I32) {
    if (accumulate)
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "adding integer tensors");
    if (d.dtype == PCU_I64 && s.dtype == PCU_I64)
      copy_i64_kernel<<<pcu_blocks(n), 256, 0, ctx->stream>>>(d, s, n);
    else if (d.dtype == PCU_I64 && s.dtype == PCU_I32)
      copy_i32_to_i64_kernel<<<pcu_blocks(n), 256, 0, ctx->stream>>>(d, s, n);
    else
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "integer copy other than to int64");
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  DISPATCH_FLOAT(ctx, d.dtype, copy_from, ctx, d, s, n, accumulate);
}

PcuStatus pcu_copy(PcuContext *ctx, const PcuView *dst, const PcuView *src,
                   const PcuRegion *region, int accumulate)
{
  return copy_strided(ctx, pcu_strided(dst, region), pcu_strided(src, region),
                      pcu_region_numel(region), accumulate != 0);
}

PcuStatus pcu_copy_permuted(PcuContext *ctx, const PcuView *dst, const PcuView *src,
                            const PcuRegion *dst_region, const int *perm, int accumulate)
{
  PcuRegion sr;
  sr.ndim = dst_region->ndim;
  for (int d = 0; d < dst_region->ndim; d++) {
    sr.lo[perm[d]] = dst_region->lo[d];
    sr.hi[perm[d]] = dst_region->hi[d];
  }
  Strided s = pcu_strided(src, &sr);
  /* Walk the source in the destination's order. */
  Strided t = s;
  for (int d = 0; d < dst_region->ndim; d++) {
    t.size[d] = dst_region->hi[d] - dst_region->lo[d];
    t.stride[d] = s.stride[perm[d]];
  }
  return copy_strided(ctx, pcu_strided(dst, dst_region), t, pcu_region_numel(dst_region),
                      accumulate != 0);
}

/* ---------------------------------------------------------------------------------- */
/* Dense operands                                                                      */

PcuStatus Scratch::alloc(size_t bytes, void **out)
{
  *out = NULL;
  if (n_ >= (int)(sizeof p_ / sizeof p_[0]))
    return FAIL(ctx_, PCU_ERR_INVALID, "too many scratch buffers in one call");
  CUDA_CHECK(ctx_, cudaMallocAsync(out, bytes ? bytes : 1, ctx_->stream));
  p_[n_++] = *out;
  CUDA_CHECK(ctx_, cudaMemsetAsync(*out, 0, bytes ? bytes : 1, ctx_->stream));
  return PCU_OK;
}

PcuStatus scratch_tensor(Scratch &s, int dtype, int64_t n, void **out)
{
  return s.alloc((size_t)n * (size_t)pcu_dtype_size(dtype), out);
}

PcuStatus dense_in(PcuContext *ctx, Scratch &s, const PcuArg &a, int dtype, Dense *out)
{
  out->n = pcu_region_numel(&a.region);
  out->dtype = dtype;
  if (!a.v.data)
    return FAIL(ctx, PCU_ERR_INVALID, "an operand the operator reads is missing");
  if (a.v.dtype == dtype && pcu_view_is_dense_region(&a.v, &a.region)) {
    out->p = a.v.data;
    out->owned = false;
    return PCU_OK;
  }
  TRY(scratch_tensor(s, dtype, out->n, &out->p));
  out->owned = true;
  PcuView dv = pcu_view_dense(out->p, dtype, &a.region);
  return copy_strided(ctx, pcu_strided(&dv, &a.region), pcu_strided(&a.v, &a.region), out->n,
                      false);
}

PcuStatus dense_out(PcuContext *ctx, Scratch &s, const PcuArg &a, int dtype, Dense *out)
{
  out->n = pcu_region_numel(&a.region);
  out->dtype = dtype;
  if (a.v.dtype == dtype && pcu_view_is_dense_region(&a.v, &a.region)) {
    out->p = a.v.data;
    out->owned = false;
    return PCU_OK;
  }
  TRY(scratch_tensor(s, dtype, out->n, &out->p));
  out->owned = true;
  return PCU_OK;
}

PcuStatus dense_commit(PcuContext *ctx, const PcuArg &a, const Dense &d, bool accumulate)
{
  if (!d.owned)
    return PCU_OK;
  PcuView dv = pcu_view_dense(d.p, d.dtype, &a.region);
  return copy_strided(ctx, pcu_strided(&a.v, &a.region), pcu_strided(&dv, &a.region), d.n,
                      accumulate);
}

/* ---------------------------------------------------------------------------------- */
/* Small shared kernels                                                                */

template <typename T>
__global__ void axpby_kernel(const T *x, T *y, int64_t n, float a, bool beta)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<T>(a * to_f<T>(x[i]) + (beta ? to_f<T>(y[i]) : 0.f));
}

template <typename T>
static PcuStatus axpby_t(PcuContext *ctx, const void *x, void *y, int64_t n, float a, bool beta)
{
  axpby_kernel<T><<<pcu_blocks(n), 256, 0, ctx->stream>>>((const T *)x, (T *)y, n, a, beta);
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

PcuStatus pcu_axpby(PcuContext *ctx, int dtype, const void *x, void *y, int64_t n, float a,
                    bool beta)
{
  if (n == 0)
    return PCU_OK;
  DISPATCH_FLOAT(ctx, dtype, axpby_t, ctx, x, y, n, a, beta);
}

__global__ void combine_kernel(float *dst, const float *src, int64_t n, int max)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = max ? fmaxf(dst[i], src[i]) : dst[i] + src[i];
}

PcuStatus pcu_combine(PcuContext *ctx, float *dst, const float *src, int64_t n, int max)
{
  if (n == 0)
    return PCU_OK;
  combine_kernel<<<pcu_blocks(n), 256, 0, ctx->stream>>>(dst, src, n, max);
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

PcuStatus pcu_convert(PcuContext *ctx, void *dst, int dst_dtype, const void *src, int src_dtype,
                      int64_t n, bool accumulate)
{
  PcuRegion r;
  r.ndim = 1;
  r.lo[0] = 0;
  r.hi[0] = n;
  PcuView d = pcu_view_dense(dst, dst_dtype, &r);
  PcuView s = pcu_view_dense((void *)src, src_dtype, &r);
  return pcu_copy(ctx, &d, &s, &r, accumulate);
}

/* Values in [-1, 1) (integers in [0, range)) from the index: never zeros, which hide
 * wrong indexing and can run faster than real data. */
template <typename T>
__global__ void random_kernel(T *p, int64_t n, uint64_t seed)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = from_f<T>((float)(2.0 * hash_uniform(seed, (uint64_t)i, 17) - 1.0));
}

__global__ void random_int_kernel(int64_t *p, int64_t n, uint64_t seed, int64_t range)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t v = (int64_t)(hash_uniform(seed, (uint64_t)i, 23) * (double)range);
    p[i] = v < range ? v : range - 1;
  }
}

__global__ void random_int32_kernel(int32_t *p, int64_t n, uint64_t seed, int64_t range)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t v = (int64_t)(hash_uniform(seed, (uint64_t)i, 23) * (double)range);
    p[i] = (int32_t)(v < range ? v : range - 1);
  }
}

template <typename T>
static PcuStatus random_t(PcuContext *ctx, void *p, int64_t n, uint64_t seed)
{
  random_kernel<T><<<pcu_blocks(n), 256, 0, ctx->stream>>>((T *)p, n, seed);
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

PcuStatus pcu_fill_random(PcuContext *ctx, void *p, int dtype, int64_t n, uint64_t seed,
                          int64_t int_range)
{
  if (n == 0)
    return PCU_OK;
  if (dtype == PCU_I64 || dtype == PCU_I32) {
    int64_t range = int_range > 0 ? int_range : 2;
    if (dtype == PCU_I64)
      random_int_kernel<<<pcu_blocks(n), 256, 0, ctx->stream>>>((int64_t *)p, n, seed, range);
    else
      random_int32_kernel<<<pcu_blocks(n), 256, 0, ctx->stream>>>((int32_t *)p, n, seed, range);
    LAUNCH_CHECK(ctx);
    return PCU_OK;
  }
  DISPATCH_FLOAT(ctx, dtype, random_t, ctx, p, n, seed);
}

/* ---------------------------------------------------------------------------------- */
/* GEMM                                                                                */

PcuStatus pcu_gemm(PcuContext *ctx, int dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                   int64_t k, float alpha, const void *A, int64_t lda, int64_t stride_a,
                   const void *B, int64_t ldb, int64_t stride_b, float beta, void *C, int64_t ldc,
                   int64_t stride_c, int64_t batch)
{
  if (m == 0 || n == 0 || batch == 0)
    return PCU_OK;
  if (k == 0) {
    /* An empty contraction leaves beta * C: nothing to do for beta 1, zeros for 0. */
    if (beta == 0.f) {
      size_t es = (size_t)pcu_dtype_size(dtype);
      for (int64_t b = 0; b < batch; b++)
        CUDA_CHECK(ctx, cudaMemset2DAsync((char *)C + (size_t)(b * stride_c) * es,
                                          (size_t)ldc * es, 0, (size_t)n * es, (size_t)m,
                                          ctx->stream));
    }
    return PCU_OK;
  }
  const int64_t lim = 0x7fffffff;
  if (m > lim || n > lim || k > lim || lda > lim || ldb > lim || ldc > lim || batch > lim)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "a matrix product larger than cuBLAS's 32-bit sizes");
  /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B comes first. */
  cudaDataType_t t = pcu_cuda_type(dtype);
  BLAS_CHECK(ctx, cublasGemmStridedBatchedEx(
                    ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, B, t,
                    (int)ldb, stride_b, A, t, (int)lda, stride_a, &beta, C, t, (int)ldc,
                    stride_c, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* State kept from forward for backward                                                */

#define SAVED_SLOTS 16

struct PcuSaved {
  void *p[SAVED_SLOTS];
  size_t bytes[SAVED_SLOTS];
};

PcuStatus saved_buffer(PcuContext *ctx, void **saved, int slot, size_t bytes, void **out)
{
  if (!saved || slot < 0 || slot >= SAVED_SLOTS)
    return FAIL(ctx, PCU_ERR_INVALID, "no place to keep state for the backward pass");
  if (!*saved) {
    *saved = calloc(1, sizeof(PcuSaved));
    if (!*saved)
      return FAIL(ctx, PCU_ERR_NO_MEMORY, "out of host memory");
  }
  PcuSaved *s = (PcuSaved *)*saved;
  if (s->p[slot] && s->bytes[slot] >= bytes) {
    *out = s->p[slot];
    return PCU_OK;
  }
  if (s->p[slot]) {
    CUDA_CHECK(ctx, cudaFreeAsync(s->p[slot], ctx->stream));
    s->p[slot] = NULL;
  }
  CUDA_CHECK(ctx, cudaMallocAsync(&s->p[slot], bytes ? bytes : 1, ctx->stream));
  s->bytes[slot] = bytes;
  *out = s->p[slot];
  return PCU_OK;
}

void *saved_get(void *const *saved, int slot, size_t bytes)
{
  if (!saved || !*saved || slot < 0 || slot >= SAVED_SLOTS)
    return NULL;
  const PcuSaved *s = (const PcuSaved *)*saved;
  return s->p[slot] && s->bytes[slot] >= bytes ? s->p[slot] : NULL;
}

void pcu_saved_free(PcuContext *ctx, void *saved)
{
  if (!saved)
    return;
  PcuSaved *s = (PcuSaved *)saved;
  for (int i = 0; i < SAVED_SLOTS; i++)
    if (s->p[i])
      cudaFreeAsync(s->p[i], ctx->stream);
  free(s);
}

/* ---------------------------------------------------------------------------------- */
/* Column sums                                                                         */

template <typename T>
__global__ void ones_kernel(T *p, int64_t n)
{
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = from_f<T>(1.f);
}

PcuStatus scratch_ones(PcuContext *ctx, Scratch &s, int dtype, int64_t n, void **out)
{
  TRY(scratch_tensor(s, dtype, n, out));
  switch (dtype) {
  case PCU_F32: ones_kernel<float><<<pcu_blocks(n), 256, 0, ctx->stream>>>((float *)*out, n); break;
  case PCU_F16: ones_kernel<__half><<<pcu_blocks(n), 256, 0, ctx->stream>>>((__half *)*out, n); break;
  case PCU_BF16:
    ones_kernel<__nv_bfloat16><<<pcu_blocks(n), 256, 0, ctx->stream>>>((__nv_bfloat16 *)*out, n);
    break;
  default: return FAIL(ctx, PCU_ERR_UNSUPPORTED, "not a floating-point element type");
  }
  LAUNCH_CHECK(ctx);
  return PCU_OK;
}

PcuStatus pcu_colsum(PcuContext *ctx, Scratch &s, int dtype, const void *X, int64_t rows,
                     int64_t cols, void *colsum, bool add)
{
  void *ones = NULL;
  TRY(scratch_ones(ctx, s, dtype, rows, &ones));
  /* [1 x rows] . [rows x cols] = [1 x cols]. */
  return pcu_gemm(ctx, dtype, false, false, 1, cols, rows, 1.f, ones, rows, 0, X, cols, 0,
                  add ? 1.f : 0.f, colsum, cols, 0, 1);
}
