/* compile.h — the internals of the plan compiler shared by its files (exec/compile.c,
 * compile-buffers.c, compile-emit.c, compile-order.c): what it knows of every operator and
 * tensor, the keys of its buffers, and the steps of compilation.  Nothing outside them
 * includes it. */
#pragma once

#include "exec-private.h"

#include <string.h>

G_BEGIN_DECLS

/* ---- what the compiler knows of each operator ------------------------------------------- */

typedef enum { MAP_IDENTITY, MAP_TRANSPOSE, MAP_RESHAPE } WeightMap;

typedef struct {
  SimOpType type;
  gboolean is_input;
  int n_in, n_out, n_w, nd;
  int n_shards;
  const int *dev;
  int *copy;
  int64_t *lo, *hi;         /* [sh * EXEC_MAX_ITER + d]                                   */
  SimRegion *in_reg;        /* [sh * n_in + i]                                            */
  SimRegion *out_reg;       /* [sh * n_out + j]                                           */
  SimRegion *w_reg;         /* [sh * n_w + i]                                             */
  gboolean *out_partial, *in_partial;
  int owner;
  int n_shared;             /* weights that are the owner's (0 for an owner)               */
  WeightMap map[8];
  gboolean ce_split;        /* cross entropy over split classes                           */
  int saved_base;           /* first saved-state slot: + sh * M + mb                       */
  /* Ring attention (compile-ring.c): per shard, its ring (an index into Ctx.rings) and its
   * place in it; NULL when the op runs no ring. */
  int *ring, *ring_pos;
} OpInfo;

/* The shards of one ring attention: the same samples, heads and copy, the positions split
 * n ways; members in the order of their positions. */
typedef struct {
  int op, n;
  int *members;
  /* Megatron's two-chunk layout (compile-ring.c): the positions of a chunk, half a
   * member's; 0 where the ring keeps each member's contiguous positions. */
  int64_t half;
} Ring;

typedef struct {
  int n_sample;             /* dims divided by the micro-batches, as flags              */
  int sample[SIM_MAX_DIMS];
  SimShape full, mb;
  gboolean is_float;
  gboolean from_input;      /* produced by a graph input                                 */
} TensorInfo;

typedef struct {
  int op, shard;
  int devs[2];              /* the owner's device, the copy's device                      */
  gboolean assigned;
} SharerItem;

typedef struct {
  ExecCompiled *c;
  const SimGraph *g;
  OpInfo *ops;
  TensorInfo *ten;
  GHashTable *boxes;        /* BufKey (mb -1) -> SimRegion*                               */
  GHashTable *seen;         /* GBytes -> 1: "first" flags while emitting                  */
  GHashTable *alias;        /* BufKey of a CONTRIB (mb -1) -> 1: it is the GRAD buffer   */
  GArray *sharers;          /* SharerItem                                                */
  gpointer *saved;          /* saved-state slots                                         */
  GArray *rings;            /* Ring                                                      */
  int n_saved;
  GError **error;
  gboolean failed;
} Ctx;

typedef struct {
  int kind, device, tensor, op, index, mb;
} BufKey;

static inline guint key_hash(gconstpointer p)
{
  const BufKey *k = p;
  guint h = 17;
  h = h * 31 + (guint)k->kind;
  h = h * 31 + (guint)k->device;
  h = h * 31 + (guint)k->tensor;
  h = h * 31 + (guint)k->op;
  h = h * 31 + (guint)k->index;
  h = h * 31 + (guint)k->mb;
  return h;
}

static inline gboolean key_equal(gconstpointer a, gconstpointer b)
{
  return memcmp(a, b, sizeof(BufKey)) == 0;
}

static inline gint key_compare(gconstpointer a, gconstpointer b)
{
  const int *x = a, *y = b;
  for (size_t k = 0; k < sizeof(BufKey) / sizeof(int); k++)
    if (x[k] != y[k])
      return x[k] < y[k] ? -1 : 1;
  return 0;
}

static inline BufKey *key_new(int kind, int device, int tensor, int op, int index, int mb)
{
  BufKey *k = g_new(BufKey, 1);
  *k = (BufKey){ kind, device, tensor, op, index, mb };
  return k;
}

static inline void *own(ExecCompiled *c, void *p)
{
  g_ptr_array_add(c->owned, p);
  return p;
}

static inline gboolean is_float_dtype(SimDType t)
{
  return t != SIM_DTYPE_INT32 && t != SIM_DTYPE_INT64;
}

static inline gboolean region_equal(const SimRegion *a, const SimRegion *b)
{
  return sim_region_equal(a, b);
}

/* Whether op @o has a shard on @dev. */
static inline gboolean op_on(const OpInfo *o, int dev)
{
  for (int sh = 0; sh < o->n_shards; sh++)
    if (o->dev[sh] == dev)
      return TRUE;
  return FALSE;
}

static inline int rank_in(const int *devs, int n, int dev)
{
  for (int k = 0; k < n; k++)
    if (devs[k] == dev)
      return k;
  return -1;
}

static inline int64_t coll_tag(int task, int k)
{
  return ((int64_t)task << 20) + k;
}

/* Work the plan leaves out and exact results need, which the executor adds (untimed):
 * - the reduction of partial outputs that nothing consumes (a loss over split classes or
 *   split reduction dimensions);
 * - the sum of the gradients of an op's own weights beside the ones it shares (the bias
 *   of an output layer tied to the embedding) over the shards holding the same part. */
typedef enum { SYNTH_LOSS, SYNTH_WEIGHTS, SYNTH_RING } SynthKind;

typedef struct {
  SynthKind kind;
  int op, mb;
  int shard;               /* SYNTH_WEIGHTS: a shard holding the part                   */
  int w0, w1;              /* SYNTH_WEIGHTS: the op's weights [w0, w1)                  */
  int *devices;            /* SYNTH_WEIGHTS: the devices holding it                     */
  int n_devices;
  /* SYNTH_RING: the ring (Ctx.rings), the pass (forward, recomputation or backward) and
   * its members' tasks, in ring order: the step carries them all out at once. */
  int ring;
  SimPass pass;
  gboolean recompute;
  int *tasks;
} Synth;

/* Sets the error once (the first failure is the one reported) and returns FALSE. */
gboolean compile_fail(Ctx *x, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

/* Buffers (compile-buffers.c): the box each device holds of every tensor, gradient,
 * contribution and weight, the contributions that are the gradient buffer itself, the
 * buffers, the initial weights, and views of them. */
SimRegion compile_map_to_owner(const Ctx *x, const OpInfo *o, int i, const SimRegion *r);
void compile_plan_boxes(Ctx *x);
void compile_find_aliases(Ctx *x);
void compile_alloc_buffers(Ctx *x);
void compile_init_weights(Ctx *x);
ExecView compile_buf_view(const ExecBuf *b);
ExecBuf *compile_find_buf(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index,
                          int mb);
ExecView compile_weight_view(Ctx *x, int op, int i, int dev, ExecBufKind kind);
SimRegion compile_stats_region(const SimRegion *rows, int p, int n);
ExecKernelArgs *compile_kernel_args(Ctx *x, int op, int sh, int mb, ExecKernelPhase phase);

/* Emitting (compile-emit.c): the micro-operations that carry out one task on the devices
 * it involves, appended to their programs. */
void compile_emit_fill(Ctx *x, int dev, const ExecView *v, const SimRegion *r, float value);
void compile_emit_forward(Ctx *x, int task, int op, int sh, int mb, gboolean recompute);
void compile_emit_backward(Ctx *x, int task, int op, int sh, int mb);
void compile_emit_update(Ctx *x, int task, int op, int sh);
void compile_emit_copy(Ctx *x, int task, const SimPlanTask *t);
void compile_emit_reduce(Ctx *x, int task, const SimPlanTask *t);
void compile_emit_sync(Ctx *x, int task, const SimPlanTask *t, gboolean gather);
void compile_emit_synth(Ctx *x, int id, const Synth *s);

/* Ring attention (compile-ring.c): which shards run as rings, their block buffers, and
 * the micro-operations of one ring's pass (a SYNTH_RING step). */
gboolean compile_find_rings(Ctx *x);
void compile_ring_buffers(Ctx *x);
void compile_emit_ring(Ctx *x, int id, const Synth *s);
ExecBuf *compile_buf_alloc(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index,
                           int mb, SimDType dtype, const SimRegion *box);
/* compile-emit.c: what a forward or backward task does before its kernel. */
void compile_emit_time(Ctx *x, int dev, int task, gboolean begin);
void compile_prepare_forward(Ctx *x, int op, int sh, int mb, gboolean recompute);
void compile_prepare_backward(Ctx *x, int op, int sh, int mb);
void compile_emit_mop(Ctx *x, int dev, const ExecMop *m);

/* The order (compile-order.c): every task, and the steps the executor adds, in one order
 * that respects dependencies and stream orders, emitted in it. */
gboolean compile_build_programs(Ctx *x);

G_END_DECLS
