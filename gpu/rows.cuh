/* rows.cuh — what the library's own kernels (kernels.cu, kernels-loss.cu) share: extents
 * of regions, and the block reductions of the row-wise kernels, which give one block of
 * ROW_THREADS threads to a row. */
#pragma once

#include "common.cuh"

static inline int64_t rsize(const PcuRegion &r, int d)
{
  return r.hi[d] - r.lo[d];
}

static inline int64_t rlast(const PcuRegion &r)
{
  return r.ndim ? rsize(r, r.ndim - 1) : 1;
}

static inline bool present(const PcuArg &a)
{
  return a.v.data != NULL;
}

static inline unsigned row_blocks(int64_t rows)
{
  return (unsigned)(rows < 1 ? 1 : rows > (1 << 30) ? (1 << 30) : rows);
}

/* ---------------------------------------------------------------------------------- */
/* Block reductions                                                                    */

__device__ __forceinline__ float warp_sum(float v)
{
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v)
{
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum (or max) over the block; every thread gets the result.  @buf holds 32 floats. */
static __device__ float block_sum(float v, float *buf)
{
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0)
    buf[warp] = v;
  __syncthreads();
  float t = threadIdx.x < (blockDim.x + 31) / 32 ? buf[threadIdx.x] : 0.f;
  if (warp == 0)
    t = warp_sum(t);
  if (threadIdx.x == 0)
    buf[0] = t;
  __syncthreads();
  return buf[0];
}

static __device__ float block_max(float v, float *buf)
{
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0)
    buf[warp] = v;
  __syncthreads();
  float t = threadIdx.x < (blockDim.x + 31) / 32 ? buf[threadIdx.x] : -INFINITY;
  if (warp == 0)
    t = warp_max(t);
  if (threadIdx.x == 0)
    buf[0] = t;
  __syncthreads();
  return buf[0];
}

#define ROW_THREADS 256
