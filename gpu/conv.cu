/* conv.cu — convolution, pooling and batch normalization through cuDNN.
 *
 * A shard of a convolution or pooling that splits the output rows or columns reads the
 * input rows its windows cover, clipped to the tensor: the clipped rows are padding.
 * When that padding is the same above and below (as for a whole operator), cuDNN pads
 * by itself; otherwise the input region is copied into a zeroed buffer of the rows the
 * windows cover and cuDNN runs without padding.  Pooling of such shards uses this file's
 * own kernels, since a max pool must not see zeros as padding.
 *
 * cuDNN's algorithms are chosen by its heuristics once per problem and context and
 * remembered, so that repeated calls (measurements, training steps) pay for the choice
 * once. */
#include "common.cuh"

#include <math.h>
#include <pthread.h>
#include <string.h>

static inline int64_t rsize(const PcuRegion &r, int d)
{
  return r.hi[d] - r.lo[d];
}

static inline bool present(const PcuArg &a)
{
  return a.v.data != NULL;
}

static bool fits_int(int64_t v)
{
  return v >= 0 && v <= 0x7fffffff;
}

/* ---------------------------------------------------------------------------------- */
/* Descriptors that release themselves                                                  */

class TensorDesc {
public:
  TensorDesc() : d_(NULL) {}
  ~TensorDesc()
  {
    if (d_)
      cudnnDestroyTensorDescriptor(d_);
  }
  TensorDesc(const TensorDesc &) = delete;
  TensorDesc &operator=(const TensorDesc &) = delete;
  PcuStatus init(PcuContext *ctx, int dtype, int64_t n, int64_t c, int64_t h, int64_t w)
  {
    if (!fits_int(n) || !fits_int(c) || !fits_int(h) || !fits_int(w))
      return FAIL(ctx, PCU_ERR_UNSUPPORTED, "a tensor larger than cuDNN's 32-bit sizes");
    DNN_CHECK(ctx, cudnnCreateTensorDescriptor(&d_));
    DNN_CHECK(ctx, cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, pcu_cudnn_type(dtype),
                                              (int)n, (int)c, (int)h, (int)w));
    return PCU_OK;
  }
  cudnnTensorDescriptor_t get() const { return d_; }
  cudnnTensorDescriptor_t *ptr() { return &d_; }

private:
  cudnnTensorDescriptor_t d_;
};

class FilterDesc {
public:
  FilterDesc() : d_(NULL) {}
  ~FilterDesc()
  {
    if (d_)
      cudnnDestroyFilterDescriptor(d_);
  }
  FilterDesc(const FilterDesc &) = delete;
  FilterDesc &operator=(const FilterDesc &) = delete;
  PcuStatus init(PcuContext *ctx, int dtype, int64_t k, int64_t c, int64_t h, int64_t w)
  {
    DNN_CHECK(ctx, cudnnCreateFilterDescriptor(&d_));
    DNN_CHECK(ctx, cudnnSetFilter4dDescriptor(d_, pcu_cudnn_type(dtype), CUDNN_TENSOR_NCHW,
                                              (int)k, (int)c, (int)h, (int)w));
    return PCU_OK;
  }
  cudnnFilterDescriptor_t get() const { return d_; }

private:
  cudnnFilterDescriptor_t d_;
};

class ConvDesc {
public:
  ConvDesc() : d_(NULL) {}
  ~ConvDesc()
  {
    if (d_)
      cudnnDestroyConvolutionDescriptor(d_);
  }
  ConvDesc(const ConvDesc &) = delete;
  ConvDesc &operator=(const ConvDesc &) = delete;
  PcuStatus init(PcuContext *ctx, int dtype, const int *pad, const int *stride,
                 const int *dilation, int groups)
  {
    DNN_CHECK(ctx, cudnnCreateConvolutionDescriptor(&d_));
    DNN_CHECK(ctx, cudnnSetConvolution2dDescriptor(d_, pad[0], pad[1], stride[0], stride[1],
                                                   dilation[0], dilation[1],
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN_CHECK(ctx, cudnnSetConvolutionGroupCount(d_, groups));
    /* fp32 stays fp32 (no TF32), so results match the CPU reference; half types use
     * the tensor cores. */
    DNN_CHECK(ctx, cudnnSetConvolutionMathType(d_, dtype == PCU_F32 ? CUDNN_FMA_MATH
                                                                     : CUDNN_TENSOR_OP_MATH));
    return PCU_OK;
  }
  cudnnConvolutionDescriptor_t get() const { return d_; }

private:
  cudnnConvolutionDescriptor_t d_;
};

class PoolDesc {
public:
  PoolDesc() : d_(NULL) {}
  ~PoolDesc()
  {
    if (d_)
      cudnnDestroyPoolingDescriptor(d_);
  }
  PoolDesc(const PoolDesc &) = delete;
  PoolDesc &operator=(const PoolDesc &) = delete;
  PcuStatus init(PcuContext *ctx, bool max, const int *window, const int *pad, const int *stride)
  {
    DNN_CHECK(ctx, cudnnCreatePoolingDescriptor(&d_));
    DNN_CHECK(ctx, cudnnSetPooling2dDescriptor(
                     d_, max ? CUDNN_POOLING_MAX_DETERMINISTIC
                             : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                     CUDNN_NOT_PROPAGATE_NAN, window[0], window[1], pad[0], pad[1], stride[0],
                     stride[1]));
    return PCU_OK;
  }
  cudnnPoolingDescriptor_t get() const { return d_; }

private:
  cudnnPoolingDescriptor_t d_;
};

static PcuStatus workspace(PcuContext *ctx, size_t bytes, void **out)
{
  if (bytes > ctx->workspace_size) {
    if (ctx->workspace) {
      CUDA_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
      CUDA_CHECK(ctx, cudaFree(ctx->workspace));
      ctx->workspace = NULL;
      ctx->workspace_size = 0;
    }
    CUDA_CHECK(ctx, cudaMalloc(&ctx->workspace, bytes));
    ctx->workspace_size = bytes;
  }
  *out = ctx->workspace;
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Windows over a shard's rows and columns                                             */

/* How the input rows (or columns) a shard's windows cover relate to those it holds: the
 * windows of outputs [o0, o1) cover inputs [need_lo, need_hi); the shard holds
 * [have_lo, have_hi), the cover clipped to the tensor. */
typedef struct {
  int64_t need_lo, need_hi, have_lo, have_hi;
  int64_t pad_lo, pad_hi;
} Span;

static Span span_of(int64_t o0, int64_t o1, int64_t k, int64_t s, int64_t p, int64_t d,
                    int64_t have_lo, int64_t have_hi)
{
  Span sp;
  sp.need_lo = o0 * s - p;
  sp.need_hi = (o1 - 1) * s - p + (k - 1) * d + 1;
  sp.have_lo = have_lo;
  sp.have_hi = have_hi;
  sp.pad_lo = have_lo - sp.need_lo;
  sp.pad_hi = sp.need_hi - have_hi;
  return sp;
}

/* Whether cuDNN's symmetric padding by pad_lo yields exactly the shard's outputs: over
 * the rows held, it makes floor(((outputs - 1) s + pad_lo - pad_hi) / s) + 1 outputs,
 * the right number when 0 <= pad_lo - pad_hi < s.  A negative pad_hi (held rows no
 * window reaches, as under a stride-2 1x1 convolution) is fine. */
static bool symmetric(const Span &sp, int64_t s)
{
  return sp.pad_lo >= 0 && sp.pad_lo >= sp.pad_hi && sp.pad_lo - sp.pad_hi < s;
}

/* ---------------------------------------------------------------------------------- */
/* Activation and bias over NCHW                                                       */

template <typename T>
__global__ void nchw_bias_act_kernel(void *yv, const void *bv, void *zv, int64_t n, int64_t hw,
                                     int64_t c, int act)
{
  T *y = (T *)yv, *z = (T *)zv;
  const T *b = (const T *)bv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = to_f<T>(y[i]) + (b ? to_f<T>(b[i / hw % c]) : 0.f);
    if (z)
      z[i] = from_f<T>(v);
    y[i] = from_f<T>(unary_f(act, v, 1.f));
  }
}

template <typename T>
__global__ void conv_act_grad_kernel(const void *dyv, const void *zv, void *dzv, int64_t n,
                                     int act)
{
  const T *dy = (const T *)dyv, *z = (const T *)zv;
  T *dz = (T *)dzv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = to_f<T>(z[i]);
    dz[i] = from_f<T>(to_f<T>(dy[i]) * unary_df(act, x, unary_f(act, x, 1.f), 1.f));
  }
}

/* ---------------------------------------------------------------------------------- */
/* Convolution                                                                         */

/* A convolution problem, the key of the algorithm cache. */
typedef struct {
  int dtype, groups;
  int x[4], w[4], y[4];
  int pad[2], stride[2], dilation[2];
} ConvKey;

typedef struct {
  ConvKey key;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  size_t ws_fwd, ws_data, ws_filter;
} ConvAlgos;

#define CONV_CACHE 512

/* One cache per process, shared by the contexts of its devices (the executor runs each
 * device in its own thread), so a lock guards it. */
static ConvAlgos conv_cache[CONV_CACHE];
static int conv_cache_n;
static int conv_cache_device[CONV_CACHE];
static pthread_mutex_t conv_cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* Algorithms whose workspace exceeds this are passed over. */
#define CONV_WORKSPACE_LIMIT ((size_t)2 << 30)

typedef struct {
  TensorDesc x, y, b;
  FilterDesc w;
  ConvDesc conv;
} ConvDescs;

static PcuStatus find_algos(PcuContext *ctx, const ConvKey *key, ConvDescs &d,
                              ConvAlgos *out)
{
  for (int i = 0; i < conv_cache_n; i++)
    if (conv_cache_device[i] == ctx->device && !memcmp(&conv_cache[i].key, key, sizeof *key)) {
      *out = conv_cache[i];
      return PCU_OK;
    }
  ConvAlgos a;
  memset(&a, 0, sizeof a);
  a.key = *key;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  DNN_CHECK(ctx, cudnnGetConvolutionForwardAlgorithm_v7(ctx->dnn, d.x.get(), d.w.get(),
                                                        d.conv.get(), d.y.get(),
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, fp));
  bool found = false;
  for (int i = 0; i < n && !found; i++)
    if (fp[i].status == CUDNN_STATUS_SUCCESS && fp[i].memory <= CONV_WORKSPACE_LIMIT) {
      a.fwd = fp[i].algo;
      a.ws_fwd = fp[i].memory;
      found = true;
    }
  if (!found)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "cuDNN offers no forward algorithm for this convolution");
  cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  DNN_CHECK(ctx, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                   ctx->dnn, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, dp));
  found = false;
  for (int i = 0; i < n && !found; i++)
    if (dp[i].status == CUDNN_STATUS_SUCCESS && dp[i].memory <= CONV_WORKSPACE_LIMIT) {
      a.bwd_data = dp[i].algo;
      a.ws_data = dp[i].memory;
      found = true;
    }
  if (!found)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "cuDNN offers no data-gradient algorithm");
  cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  DNN_CHECK(ctx, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                   ctx->dnn, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, wp));
  found = false;
  for (int i = 0; i < n && !found; i++)
    if (wp[i].status == CUDNN_STATUS_SUCCESS && wp[i].memory <= CONV_WORKSPACE_LIMIT) {
      a.bwd_filter = wp[i].algo;
      a.ws_filter = wp[i].memory;
      found = true;
    }
  if (!found)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "cuDNN offers no filter-gradient algorithm");
  /* A full cache forgets an arbitrary entry: it is only a shortcut. */
  int slot = conv_cache_n < CONV_CACHE ? conv_cache_n++ : (int)((unsigned)key->x[0] % CONV_CACHE);
  conv_cache[slot] = a;
  conv_cache_device[slot] = ctx->device;
  *out = a;
  return PCU_OK;
}

static PcuStatus choose_algos(PcuContext *ctx, const ConvKey *key, ConvDescs &d, ConvAlgos *out)
{
  pthread_mutex_lock(&conv_cache_lock);
  PcuStatus st = find_algos(ctx, key, d, out);
  pthread_mutex_unlock(&conv_cache_lock);
  return st;
}


enum { CONV_Z };

PcuStatus pcu_op_conv2d(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuArg &X = a->in[0], &W = a->w[0], &Y = a->out[0];
  int64_t N = rsize(Y.region, 0), K = rsize(Y.region, 1);
  int64_t Ho = rsize(Y.region, 2), Wo = rsize(Y.region, 3);
  int64_t C = rsize(X.region, 1), kh = a->kernel[0], kw = a->kernel[1];
  int64_t cin_g = rsize(W.region, 1);
  if (a->groups > 1 && a->hi[1] - a->lo[1] > 1 &&
      (a->hi[2] - a->lo[2] != a->size[2] || a->hi[5] - a->lo[5] != a->size[5]))
    return FAIL(ctx, PCU_ERR_UNSUPPORTED,
                "a grouped convolution shard of several groups with part of each group's "
                "channels (its channels are not one box)");
  int groups = cin_g ? (int)(C / cin_g) : 1;
  if (groups < 1 || (int64_t)groups * cin_g != C || K % groups)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED,
                "a grouped convolution shard whose channels are not whole groups");
  Span sh = span_of(Y.region.lo[2], Y.region.hi[2], kh, a->stride[0], a->padding[0],
                    a->dilation[0], X.region.lo[2], X.region.hi[2]);
  Span sw = span_of(Y.region.lo[3], Y.region.hi[3], kw, a->stride[1], a->padding[1],
                    a->dilation[1], X.region.lo[3], X.region.hi[3]);
  bool sym = symmetric(sh, a->stride[0]) && symmetric(sw, a->stride[1]);
  int64_t Hx = sym ? rsize(X.region, 2) : sh.need_hi - sh.need_lo;
  int64_t Wx = sym ? rsize(X.region, 3) : sw.need_hi - sw.need_lo;
  int pad[2] = { sym ? (int)sh.pad_lo : 0, sym ? (int)sw.pad_lo : 0 };
  int stride[2] = { (int)a->stride[0], (int)a->stride[1] };
  int dil[2] = { (int)a->dilation[0], (int)a->dilation[1] };
  if (a->act != U_IDENTITY && a->accumulate && a->phase == PCU_FORWARD)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED,
                "a fused activation over a split reduction (partial sums)");

  ConvDescs d;
  TRY(d.x.init(ctx, dt, N, C, Hx, Wx));
  TRY(d.y.init(ctx, dt, N, K, Ho, Wo));
  TRY(d.b.init(ctx, dt, 1, K, 1, 1));
  TRY(d.w.init(ctx, dt, K, cin_g, kh, kw));
  TRY(d.conv.init(ctx, dt, pad, stride, dil, groups));
  int on, oc, oh, ow;
  DNN_CHECK(ctx, cudnnGetConvolution2dForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(), &on,
                                                       &oc, &oh, &ow));
  if (on != N || oc != K || oh != Ho || ow != Wo)
    return FAIL(ctx, PCU_ERR_INVALID, "cuDNN's output shape differs from the shard's");
  ConvKey key;
  memset(&key, 0, sizeof key);
  key.dtype = dt;
  key.groups = groups;
  int64_t xs[4] = { N, C, Hx, Wx }, ws[4] = { K, cin_g, kh, kw }, ys[4] = { N, K, Ho, Wo };
  for (int i = 0; i < 4; i++) {
    key.x[i] = (int)xs[i];
    key.w[i] = (int)ws[i];
    key.y[i] = (int)ys[i];
  }
  memcpy(key.pad, pad, sizeof pad);
  memcpy(key.stride, stride, sizeof stride);
  memcpy(key.dilation, dil, sizeof dil);
  ConvAlgos chosen;
  memset(&chosen, 0, sizeof chosen);
  TRY(choose_algos(ctx, &key, d, &chosen));
  const ConvAlgos *algo = &chosen;

  Scratch s(ctx);
  /* The input as cuDNN reads it: in place, packed, or packed into the padded cover. */
  Dense x;
  PcuRegion cover = X.region;
  if (sym) {
    TRY(dense_in(ctx, s, X, dt, &x));
  } else {
    cover.lo[2] = sh.need_lo;
    cover.hi[2] = sh.need_hi;
    cover.lo[3] = sw.need_lo;
    cover.hi[3] = sw.need_hi;
    x.n = pcu_region_numel(&cover);
    x.dtype = dt;
    x.owned = true;
    TRY(scratch_tensor(s, dt, x.n, &x.p));
    PcuView pv = pcu_view_dense(x.p, dt, &cover);
    TRY(pcu_copy(ctx, &pv, &X.v, &X.region, 0));
  }
  Dense w;
  TRY(dense_in(ctx, s, W, dt, &w));
  float one = 1.f, zero = 0.f;
  int64_t ny = N * K * Ho * Wo;
  bool bias = a->has_bias && a->bias_here && a->n_weights > 1;
  if (a->phase == PCU_FORWARD) {
    Dense y;
    TRY(dense_out(ctx, s, Y, dt, &y));
    float beta = dense_adds(y, a->accumulate) ? 1.f : 0.f;
    void *ws_p = NULL;
    TRY(workspace(ctx, algo->ws_fwd, &ws_p));
    DNN_CHECK(ctx, cudnnConvolutionForward(ctx->dnn, &one, d.x.get(), x.p, d.w.get(), w.p,
                                           d.conv.get(), algo->fwd, ws_p, algo->ws_fwd, &beta,
                                           d.y.get(), y.p));
    if (bias || a->act != U_IDENTITY) {
      Dense b = { NULL, 0, dt, false };
      if (bias)
        TRY(dense_in(ctx, s, a->w[1], dt, &b));
      void *z = NULL;
      if (a->act != U_IDENTITY)
        TRY(saved_buffer(ctx, a->saved, CONV_Z, (size_t)ny * pcu_dtype_size(dt), &z));
      LAUNCH_FLOAT(ctx, dt, nchw_bias_act_kernel, pcu_blocks(ny), 256, y.p, b.p, z, ny,
                   Ho * Wo, K, a->act);
    }
    return dense_commit(ctx, Y, y, a->accumulate);
  }
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  const void *dz = dy.p;
  if (a->act != U_IDENTITY) {
    const void *z = saved_get(a->saved, CONV_Z, (size_t)ny * pcu_dtype_size(dt));
    if (!z)
      return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of a convolution without its forward pass");
    void *t = NULL;
    TRY(scratch_tensor(s, dt, ny, &t));
    LAUNCH_FLOAT(ctx, dt, conv_act_grad_kernel, pcu_blocks(ny), 256, dy.p, z, t, ny, a->act);
    dz = t;
  }
  if (bias && present(a->w_grad[1])) {
    Dense db;
    TRY(dense_out(ctx, s, a->w_grad[1], dt, &db));
    float beta = dense_adds(db, true) ? 1.f : 0.f;
    DNN_CHECK(ctx, cudnnConvolutionBackwardBias(ctx->dnn, &one, d.y.get(), dz, &beta, d.b.get(),
                                                db.p));
    TRY(dense_commit(ctx, a->w_grad[1], db, true));
  }
  if (present(a->w_grad[0])) {
    Dense dw;
    TRY(dense_out(ctx, s, a->w_grad[0], dt, &dw));
    float beta = dense_adds(dw, true) ? 1.f : 0.f;
    void *ws_p = NULL;
    TRY(workspace(ctx, algo->ws_filter, &ws_p));
    DNN_CHECK(ctx, cudnnConvolutionBackwardFilter(ctx->dnn, &one, d.x.get(), x.p, d.y.get(), dz,
                                                  d.conv.get(), algo->bwd_filter, ws_p,
                                                  algo->ws_filter, &beta, d.w.get(), dw.p));
    TRY(dense_commit(ctx, a->w_grad[0], dw, true));
  }
  if (present(a->in_grad[0])) {
    void *ws_p = NULL;
    TRY(workspace(ctx, algo->ws_data, &ws_p));
    if (sym) {
      Dense dx;
      TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
      float beta = dense_adds(dx, true) ? 1.f : 0.f;
      DNN_CHECK(ctx, cudnnConvolutionBackwardData(ctx->dnn, &one, d.w.get(), w.p, d.y.get(), dz,
                                                  d.conv.get(), algo->bwd_data, ws_p,
                                                  algo->ws_data, &beta, d.x.get(), dx.p));
      TRY(dense_commit(ctx, a->in_grad[0], dx, true));
    } else {
      /* The gradient of the padded cover; its rows inside the tensor are the input's. */
      void *gx = NULL;
      TRY(scratch_tensor(s, dt, x.n, &gx));
      DNN_CHECK(ctx, cudnnConvolutionBackwardData(ctx->dnn, &one, d.w.get(), w.p, d.y.get(), dz,
                                                  d.conv.get(), algo->bwd_data, ws_p,
                                                  algo->ws_data, &zero, d.x.get(), gx));
      PcuView gv = pcu_view_dense(gx, dt, &cover);
      TRY(pcu_copy(ctx, &a->in_grad[0].v, &gv, &a->in_grad[0].region, 1));
    }
  }
  return PCU_OK;
}

/* ---------------------------------------------------------------------------------- */
/* Pooling                                                                             */

/* Output element i of the shard (N x C x Ho x Wo, outputs from row o0 and column p0)
 * over the input region held in @X, whose rows and columns start at x0 and y0; window
 * positions outside that region are padding. */
typedef struct {
  int64_t N, C, Ho, Wo, o0, p0;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t x0, x1, y0, y1;
} PoolGeom;

template <typename T>
__global__ void pool_kernel(Strided X, Strided Y, PoolGeom g, bool max)
{
  int64_t n = g.N * g.C * g.Ho * g.Wo;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % g.Wo, oh = i / g.Wo % g.Ho, nc = i / (g.Wo * g.Ho);
    int64_t h0 = (g.o0 + oh) * g.sh - g.ph, w0 = (g.p0 + ow) * g.sw - g.pw;
    float acc = max ? -INFINITY : 0.f;
    for (int64_t a = 0; a < g.kh; a++)
      for (int64_t b = 0; b < g.kw; b++) {
        int64_t h = h0 + a, w = w0 + b;
        if (h < g.x0 || h >= g.x1 || w < g.y0 || w >= g.y1)
          continue;
        float v = to_f<T>(((const T *)X.base)[strided_offset(
          X, (nc * (g.x1 - g.x0) + h - g.x0) * (g.y1 - g.y0) + w - g.y0)]);
        acc = max ? fmaxf(acc, v) : acc + v;
      }
    ((T *)Y.base)[strided_offset(Y, i)] = from_f<T>(max ? acc : acc / (float)(g.kh * g.kw));
  }
}

template <typename T>
__global__ void pool_backward_kernel(Strided X, Strided DY, float *dx, PoolGeom g, bool max)
{
  int64_t n = g.N * g.C * g.Ho * g.Wo;
  int64_t hx = g.x1 - g.x0, wx = g.y1 - g.y0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % g.Wo, oh = i / g.Wo % g.Ho, nc = i / (g.Wo * g.Ho);
    int64_t h0 = (g.o0 + oh) * g.sh - g.ph, w0 = (g.p0 + ow) * g.sw - g.pw;
    float dy = to_f<T>(((const T *)DY.base)[strided_offset(DY, i)]);
    if (!max) {
      float share = dy / (float)(g.kh * g.kw);
      for (int64_t a = 0; a < g.kh; a++)
        for (int64_t b = 0; b < g.kw; b++) {
          int64_t h = h0 + a, w = w0 + b;
          if (h >= g.x0 && h < g.x1 && w >= g.y0 && w < g.y1)
            atomicAdd(dx + (nc * hx + h - g.x0) * wx + w - g.y0, share);
        }
      continue;
    }
    /* The first maximum of the window takes the gradient, as PyTorch's does. */
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t a = 0; a < g.kh; a++)
      for (int64_t b = 0; b < g.kw; b++) {
        int64_t h = h0 + a, w = w0 + b;
        if (h < g.x0 || h >= g.x1 || w < g.y0 || w >= g.y1)
          continue;
        int64_t k = (nc * hx + h - g.x0) * wx + w - g.y0;
        float v = to_f<T>(((const T *)X.base)[strided_offset(X, k)]);
        if (v > best) {
          best = v;
          at = k;
        }
      }
    if (at >= 0)
      atomicAdd(dx + at, dy);
  }
}

PcuStatus pcu_op_pool2d(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuArg &X = a->in[0], &Y = a->out[0];
  bool max = a->kind == 0;
  int64_t N = rsize(Y.region, 0), C = rsize(Y.region, 1);
  int64_t Ho = rsize(Y.region, 2), Wo = rsize(Y.region, 3);
  int64_t ny = N * C * Ho * Wo;
  if (ny == 0)
    return PCU_OK;
  Span sh = span_of(Y.region.lo[2], Y.region.hi[2], a->kernel[0], a->stride[0], a->padding[0],
                    1, X.region.lo[2], X.region.hi[2]);
  Span sw = span_of(Y.region.lo[3], Y.region.hi[3], a->kernel[1], a->stride[1], a->padding[1],
                    1, X.region.lo[3], X.region.hi[3]);
  Scratch s(ctx);
  float one = 1.f, zero = 0.f;
  if (symmetric(sh, a->stride[0]) && symmetric(sw, a->stride[1])) {
    int window[2] = { (int)a->kernel[0], (int)a->kernel[1] };
    int pad[2] = { (int)sh.pad_lo, (int)sw.pad_lo };
    int stride[2] = { (int)a->stride[0], (int)a->stride[1] };
    TensorDesc xd, yd;
    PoolDesc pd;
    TRY(xd.init(ctx, dt, N, C, rsize(X.region, 2), rsize(X.region, 3)));
    TRY(yd.init(ctx, dt, N, C, Ho, Wo));
    TRY(pd.init(ctx, max, window, pad, stride));
    Dense x;
    TRY(dense_in(ctx, s, X, dt, &x));
    if (a->phase == PCU_FORWARD) {
      Dense y;
      TRY(dense_out(ctx, s, Y, dt, &y));
      DNN_CHECK(ctx, cudnnPoolingForward(ctx->dnn, pd.get(), &one, xd.get(), x.p, &zero,
                                         yd.get(), y.p));
      /* cuDNN's backward reads the forward output. */
      void *keep = NULL;
      TRY(saved_buffer(ctx, a->saved, 0, (size_t)ny * pcu_dtype_size(dt), &keep));
      CUDA_CHECK(ctx, cudaMemcpyAsync(keep, y.p, (size_t)ny * pcu_dtype_size(dt),
                                      cudaMemcpyDeviceToDevice, ctx->stream));
      return dense_commit(ctx, Y, y, false);
    }
    if (!present(a->in_grad[0]))
      return PCU_OK;
    const void *y = saved_get(a->saved, 0, (size_t)ny * pcu_dtype_size(dt));
    if (!y)
      return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of pooling without its forward pass");
    Dense dy, dx;
    TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
    float beta = dense_adds(dx, true) ? 1.f : 0.f;
    DNN_CHECK(ctx, cudnnPoolingBackward(ctx->dnn, pd.get(), &one, yd.get(), y, yd.get(), dy.p,
                                        xd.get(), x.p, &beta, xd.get(), dx.p));
    return dense_commit(ctx, a->in_grad[0], dx, true);
  }
  PoolGeom g = { N, C, Ho, Wo, Y.region.lo[2], Y.region.lo[3], a->kernel[0], a->kernel[1],
                 a->stride[0], a->stride[1], a->padding[0], a->padding[1], X.region.lo[2],
                 X.region.hi[2], X.region.lo[3], X.region.hi[3] };
  Strided xs = pcu_strided(&X.v, &X.region);
  if (X.v.dtype != dt)
    return FAIL(ctx, PCU_ERR_UNSUPPORTED, "pooling of another element type than its own");
  if (a->phase == PCU_FORWARD) {
    LAUNCH_FLOAT(ctx, dt, pool_kernel, pcu_blocks(ny), 256, xs, pcu_strided(&Y.v, &Y.region), g,
                 max);
    return PCU_OK;
  }
  if (!present(a->in_grad[0]))
    return PCU_OK;
  float *acc = NULL;
  TRY(scratch_tensor(s, PCU_F32, pcu_region_numel(&X.region), (void **)&acc));
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  PcuView dyv = pcu_view_dense(dy.p, dt, &Y.region);
  LAUNCH_FLOAT(ctx, dt, pool_backward_kernel, pcu_blocks(ny), 256, xs,
               pcu_strided(&dyv, &Y.region), acc, g, max);
  PcuView av = pcu_view_dense(acc, PCU_F32, &X.region);
  return pcu_copy(ctx, &a->in_grad[0].v, &av, &a->in_grad[0].region, 1);
}

/* ---------------------------------------------------------------------------------- */
/* Batch normalization (per channel, over the shard's samples and positions)            */

template <typename T>
__global__ void relu_kernel(void *yv, int64_t n)
{
  T *y = (T *)yv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    if (to_f<T>(y[i]) < 0.f)
      y[i] = from_f<T>(0.f);
}

template <typename T>
__global__ void relu_mask_kernel(const void *yv, const void *dyv, void *outv, int64_t n)
{
  const T *y = (const T *)yv, *dy = (const T *)dyv;
  T *out = (T *)outv;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = to_f<T>(y[i]) > 0.f ? dy[i] : from_f<T>(0.f);
}

enum { BN_MEAN, BN_INVSTD, BN_Y };

PcuStatus pcu_op_batchnorm(PcuContext *ctx, const PcuOpArgs *a)
{
  int dt = a->dtype;
  const PcuArg &X = a->in[0];
  int r = X.region.ndim;
  int64_t N = rsize(X.region, 0), C = rsize(X.region, 1);
  int64_t H = r > 2 ? rsize(X.region, 2) : 1, W = r > 3 ? rsize(X.region, 3) : 1;
  int64_t n = N * C * H * W;
  if (n == 0)
    return PCU_OK;
  double eps = a->eps > 0.0 ? a->eps : 1e-5;
  if (eps < CUDNN_BN_MIN_EPSILON)
    eps = CUDNN_BN_MIN_EPSILON;
  TensorDesc xd, pd;
  TRY(xd.init(ctx, dt, N, C, H, W));
  DNN_CHECK(ctx, cudnnCreateTensorDescriptor(pd.ptr()));
  DNN_CHECK(ctx, cudnnDeriveBNTensorDescriptor(pd.get(), xd.get(), CUDNN_BATCHNORM_SPATIAL));
  Scratch s(ctx);
  Dense x, gamma;
  TRY(dense_in(ctx, s, X, dt, &x));
  TRY(dense_in(ctx, s, a->w[0], PCU_F32, &gamma));
  float one = 1.f, zero = 0.f;
  if (a->phase == PCU_FORWARD) {
    Dense beta, y;
    TRY(dense_in(ctx, s, a->w[1], PCU_F32, &beta));
    TRY(dense_out(ctx, s, a->out[0], dt, &y));
    void *mean = NULL, *invstd = NULL;
    TRY(saved_buffer(ctx, a->saved, BN_MEAN, (size_t)C * sizeof(float), &mean));
    TRY(saved_buffer(ctx, a->saved, BN_INVSTD, (size_t)C * sizeof(float), &invstd));
    DNN_CHECK(ctx, cudnnBatchNormalizationForwardTraining(
                     ctx->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.get(), x.p, xd.get(),
                     y.p, pd.get(), gamma.p, beta.p, 0.0, NULL, NULL, eps, mean, invstd));
    if (a->relu) {
      void *keep = NULL;
      LAUNCH_FLOAT(ctx, dt, relu_kernel, pcu_blocks(n), 256, y.p, n);
      TRY(saved_buffer(ctx, a->saved, BN_Y, (size_t)n * pcu_dtype_size(dt), &keep));
      CUDA_CHECK(ctx, cudaMemcpyAsync(keep, y.p, (size_t)n * pcu_dtype_size(dt),
                                      cudaMemcpyDeviceToDevice, ctx->stream));
    }
    return dense_commit(ctx, a->out[0], y, false);
  }
  const void *mean = saved_get(a->saved, BN_MEAN, (size_t)C * sizeof(float));
  const void *invstd = saved_get(a->saved, BN_INVSTD, (size_t)C * sizeof(float));
  if (!mean || !invstd)
    return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of batch norm without its forward pass");
  Dense dy;
  TRY(dense_in(ctx, s, a->out_grad[0], dt, &dy));
  const void *g = dy.p;
  if (a->relu) {
    const void *y = saved_get(a->saved, BN_Y, (size_t)n * pcu_dtype_size(dt));
    if (!y)
      return FAIL(ctx, PCU_ERR_INVALID, "a backward pass of batch norm without its forward pass");
    void *t = NULL;
    TRY(scratch_tensor(s, dt, n, &t));
    LAUNCH_FLOAT(ctx, dt, relu_mask_kernel, pcu_blocks(n), 256, y, dy.p, t, n);
    g = t;
  }
  /* cuDNN writes dx, dgamma and dbeta together; parameter gradients go through fp32
   * scratch, added into their views after. */
  Dense dx;
  bool want_dx = present(a->in_grad[0]);
  if (want_dx) {
    TRY(dense_out(ctx, s, a->in_grad[0], dt, &dx));
  } else {
    dx.owned = true;
    dx.n = n;
    dx.dtype = dt;
    TRY(scratch_tensor(s, dt, n, &dx.p));
  }
  float *dparams = NULL;
  TRY(scratch_tensor(s, PCU_F32, 2 * C, (void **)&dparams));
  float beta_data = want_dx && dense_adds(dx, true) ? 1.f : 0.f;
  DNN_CHECK(ctx, cudnnBatchNormalizationBackward(
                   ctx->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &beta_data, &one, &zero, xd.get(),
                   x.p, xd.get(), g, xd.get(), dx.p, pd.get(), gamma.p, dparams, dparams + C, eps,
                   mean, invstd));
  if (want_dx)
    TRY(dense_commit(ctx, a->in_grad[0], dx, true));
  for (int i = 0; i < 2; i++)
    if (present(a->w_grad[i])) {
      PcuView v = pcu_view_dense(dparams + i * C, PCU_F32, &a->w_grad[i].region);
      TRY(pcu_copy(ctx, &a->w_grad[i].v, &v, &a->w_grad[i].region, 1));
    }
  return PCU_OK;
}
