/* collectives.cu — timing NCCL's collectives over the GPUs of this process.
 *
 * One communicator per GPU (ncclCommInitAll), all driven from the calling thread inside
 * group calls, as NCCL's own tests do in their single-process mode.  Each timed run
 * records an event on every GPU's stream before and after the group; the run's time is
 * the slowest GPU's, since a collective ends when its last member does. */
#include "common.cuh"

#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 64

/* Every resource of one measurement, released by the destructor whatever failed. */
class Bench {
public:
  Bench() : n(0)
  {
    memset(comm, 0, sizeof comm);
    memset(stream, 0, sizeof stream);
    memset(send, 0, sizeof send);
    memset(recv, 0, sizeof recv);
    memset(start, 0, sizeof start);
    memset(stop, 0, sizeof stop);
    error[0] = '\0';
  }
  ~Bench()
  {
    for (int i = 0; i < n; i++) {
      cudaSetDevice(i);
      if (stream[i])
        cudaStreamSynchronize(stream[i]);
      if (comm[i])
        ncclCommDestroy(comm[i]);
      if (send[i])
        cudaFree(send[i]);
      if (recv[i])
        cudaFree(recv[i]);
      if (start[i])
        cudaEventDestroy(start[i]);
      if (stop[i])
        cudaEventDestroy(stop[i]);
      if (stream[i])
        cudaStreamDestroy(stream[i]);
    }
  }
  Bench(const Bench &) = delete;
  Bench &operator=(const Bench &) = delete;

  int n;
  ncclComm_t comm[MAX_GPUS];
  cudaStream_t stream[MAX_GPUS];
  void *send[MAX_GPUS], *recv[MAX_GPUS];
  cudaEvent_t start[MAX_GPUS], stop[MAX_GPUS];
  char error[512];
};

#define BENCH_CUDA(b, call)                                                                \
  do {                                                                                     \
    cudaError_t e__ = (call);                                                              \
    if (e__ != cudaSuccess) {                                                              \
      snprintf((b).error, sizeof (b).error, "%s:%d: %s: %s (%s)", "collectives.cu",         \
               __LINE__, #call, cudaGetErrorName(e__), cudaGetErrorString(e__));            \
      return e__ == cudaErrorMemoryAllocation ? PCU_ERR_NO_MEMORY : PCU_ERR_CUDA;           \
    }                                                                                      \
  } while (0)

#define BENCH_NCCL(b, call)                                                                \
  do {                                                                                     \
    ncclResult_t r__ = (call);                                                             \
    if (r__ != ncclSuccess) {                                                              \
      snprintf((b).error, sizeof (b).error, "%s:%d: %s: %s%s%s", "collectives.cu",         \
               __LINE__, #call, ncclGetErrorString(r__),                                   \
               ncclGetLastError(NULL) ? ": " : "", ncclGetLastError(NULL));                \
      return PCU_ERR_NCCL;                                                                 \
    }                                                                                      \
  } while (0)

/* Enqueues one collective on every GPU. */
static PcuStatus launch(Bench &b, int kind, size_t count)
{
  size_t part = count / (size_t)b.n;
  BENCH_NCCL(b, ncclGroupStart());
  for (int i = 0; i < b.n; i++) {
    switch (kind) {
    case 0: /* all-reduce */
      BENCH_NCCL(b, ncclAllReduce(b.send[i], b.recv[i], count, ncclFloat, ncclSum, b.comm[i],
                                  b.stream[i]));
      break;
    case 1: /* all-gather: each contributes a part, all receive the whole */
      BENCH_NCCL(b, ncclAllGather(b.send[i], b.recv[i], part, ncclFloat, b.comm[i],
                                  b.stream[i]));
      break;
    case 2: /* reduce-scatter: the whole in, a part out */
      BENCH_NCCL(b, ncclReduceScatter(b.send[i], b.recv[i], part, ncclFloat, ncclSum, b.comm[i],
                                      b.stream[i]));
      break;
    default: /* send-recv: a ring of pairs, GPU i to GPU i + 1 */
      BENCH_NCCL(b, ncclSend(b.send[i], count, ncclFloat, (i + 1) % b.n, b.comm[i],
                             b.stream[i]));
      BENCH_NCCL(b, ncclRecv(b.recv[i], count, ncclFloat, (i + b.n - 1) % b.n, b.comm[i],
                             b.stream[i]));
      break;
    }
  }
  BENCH_NCCL(b, ncclGroupEnd());
  return PCU_OK;
}

static PcuStatus measure(Bench &b, int kind, int n_gpus, size_t bytes, int warmup, int reps,
                         double *seconds)
{
  int present = 0;
  BENCH_CUDA(b, cudaGetDeviceCount(&present));
  if (n_gpus < 2 || n_gpus > MAX_GPUS || n_gpus > present) {
    snprintf(b.error, sizeof b.error, "%d GPUs asked for, %d present (2 to %d measurable)",
             n_gpus, present, MAX_GPUS);
    return n_gpus > present ? PCU_ERR_NO_DEVICE : PCU_ERR_INVALID;
  }
  size_t count = bytes / sizeof(float);
  if (count < (size_t)n_gpus)
    count = (size_t)n_gpus;
  count -= count % (size_t)n_gpus;
  int devs[MAX_GPUS];
  for (int i = 0; i < n_gpus; i++)
    devs[i] = i;
  BENCH_NCCL(b, ncclCommInitAll(b.comm, n_gpus, devs));
  b.n = n_gpus;
  for (int i = 0; i < n_gpus; i++) {
    BENCH_CUDA(b, cudaSetDevice(i));
    BENCH_CUDA(b, cudaStreamCreateWithFlags(&b.stream[i], cudaStreamNonBlocking));
    BENCH_CUDA(b, cudaMalloc(&b.send[i], count * sizeof(float)));
    BENCH_CUDA(b, cudaMalloc(&b.recv[i], count * sizeof(float)));
    BENCH_CUDA(b, cudaMemset(b.send[i], 0, count * sizeof(float)));
    BENCH_CUDA(b, cudaEventCreate(&b.start[i]));
    BENCH_CUDA(b, cudaEventCreate(&b.stop[i]));
  }
  for (int r = 0; r < warmup; r++)
    TRY(launch(b, kind, count));
  for (int i = 0; i < n_gpus; i++) {
    BENCH_CUDA(b, cudaSetDevice(i));
    BENCH_CUDA(b, cudaStreamSynchronize(b.stream[i]));
  }
  for (int r = 0; r < reps; r++) {
    for (int i = 0; i < n_gpus; i++) {
      BENCH_CUDA(b, cudaSetDevice(i));
      BENCH_CUDA(b, cudaEventRecord(b.start[i], b.stream[i]));
    }
    TRY(launch(b, kind, count));
    double slowest = 0.0;
    for (int i = 0; i < n_gpus; i++) {
      BENCH_CUDA(b, cudaSetDevice(i));
      BENCH_CUDA(b, cudaEventRecord(b.stop[i], b.stream[i]));
    }
    for (int i = 0; i < n_gpus; i++) {
      float ms = 0.f;
      BENCH_CUDA(b, cudaSetDevice(i));
      BENCH_CUDA(b, cudaEventSynchronize(b.stop[i]));
      BENCH_CUDA(b, cudaEventElapsedTime(&ms, b.start[i], b.stop[i]));
      if (1e-3 * ms > slowest)
        slowest = 1e-3 * ms;
    }
    seconds[r] = slowest;
  }
  return PCU_OK;
}

PcuStatus pcu_nccl_measure(int kind, int n_gpus, size_t bytes, int warmup, int reps,
                           double *seconds, char *error, size_t error_size)
{
  Bench b;
  PcuStatus s = measure(b, kind, n_gpus, bytes, warmup, reps, seconds);
  if (s != PCU_OK && error && error_size)
    snprintf(error, error_size, "%s", b.error);
  return s;
}
