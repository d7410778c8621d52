/* cpu-private.h — what the files of the CPU reference back end share: its buffers, view
 * access, and the kernels of each operator family. */
#pragma once

#include "../exec-private.h"

#include <math.h>

G_BEGIN_DECLS

struct _ExecBuffer {
  size_t bytes;
  void *data;
};

static inline float *cpu_f32(const ExecView *v)
{
  return (float *)v->buffer->data + v->offset;
}

static inline int64_t *cpu_i64(const ExecView *v)
{
  return (int64_t *)v->buffer->data + v->offset;
}

/* The element offset of a point relative to the view's base (cpu_f32). */
static inline int64_t cpu_off(const ExecView *v, const int64_t *idx)
{
  int64_t o = 0;
  for (int d = 0; d < v->box.ndim; d++)
    o += (idx[d] - v->box.lo[d]) * v->stride[d];
  return o;
}

static inline int64_t cpu_off2(const ExecView *v, int64_t i0, int64_t i1)
{
  return (i0 - v->box.lo[0]) * v->stride[0] + (i1 - v->box.lo[1]) * v->stride[1];
}

static inline gboolean cpu_has(const ExecView *v)
{
  return v && v->buffer != NULL;
}

/* A kernel's saved state (ExecKernelArgs.saved) starts with its own release. */
typedef struct {
  void (*free)(gpointer self);
} CpuSaved;

/* Fused activations and element-wise functions: the function and its derivative with
 * respect to its input. */
float cpu_act(SimUnaryKind k, float x, float scale);
float cpu_act_grad(SimUnaryKind k, float x, float scale);

/* The region of the op's tensor the shard touches: its lo/hi along the iteration dims
 * that index each tensor dimension, for ops whose tensors are indexed one to one. */
void cpu_range_region(const ExecKernelArgs *a, const int *dims, int ndim, SimRegion *out);

/* Integer attributes, with a default. */
int64_t cpu_attr_int(const ExecKernelArgs *a, const char *name, int64_t def);
double cpu_attr_float(const ExecKernelArgs *a, const char *name, double def);

/* Kernels, one per operator family: each handles the phases it has. */
gboolean cpu_kernel_linear(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_matmul(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_conv2d(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_pool2d(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_batchnorm(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_layernorm(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_embedding(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_unary(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_binary(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_softmax(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_dropout(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_concat(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_split(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_reshape(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_transpose(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_attention(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_lstm(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_cross_entropy(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_mse_loss(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_rmsnorm(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_gated_mlp(const ExecKernelArgs *a, GError **error);
gboolean cpu_kernel_moe(const ExecKernelArgs *a, GError **error);

/* Runs the kernel of @a's operator (kernels.c). */
gboolean cpu_kernel(const ExecKernelArgs *a, GError **error);
/* One optimizer step (kernels.c). */
gboolean cpu_update(const ExecUpdateArgs *a, GError **error);

G_END_DECLS
