/* compile.c — turns a plan into one program per device.
 *
 * The plan says what every task means (sim_plan_task); this file decides where the data
 * live and which back-end calls carry each task out:
 *
 * - Buffers.  A device holds, per micro-batch, the values of every tensor it touches over
 *   the bounding box of the regions its shards read or write, a gradient buffer over the
 *   box its producer shards write (what they read in backward: contributions received
 *   from other devices plus those computed here), and per consumer op a contribution
 *   buffer over the box that op's shards read.  Keeping contributions per consumer op
 *   apart from the sum matters: a copy of gradients sends one consumer's contribution,
 *   and must not carry along what the device received from elsewhere.
 * - Order.  All tasks are put in one order that respects the plan's dependencies and
 *   every device's stream order (a topological order, preferring the simulator's
 *   predicted start times); each device's program is that order restricted to the tasks
 *   it takes part in.  Since a communication waits only for tasks earlier in that one
 *   order, the programs cannot deadlock.
 * - Meaning.  COMPUTE runs a kernel, first zeroing the outputs that are partial sums (at
 *   the first shard of each group on the device) and adding the device's own consumers'
 *   contributions into the gradient buffer (at the first backward shard); COPY sends and
 *   receives (gradients add up at the receiver); REDUCE all-reduces partial sums (cross
 *   entropy over split classes combines its statistics instead); SYNC all-reduces or
 *   reduce-scatters weight gradients of the shard groups holding one weight region;
 *   GATHER_PARAMS all-gathers the weights after a sharded update.
 */
#include "exec-private.h"
#include "heap.h"

#include <math.h>
#include <string.h>

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
} OpInfo;

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
  int n_saved;
  GError **error;
  gboolean failed;
} Ctx;

typedef struct {
  int kind, device, tensor, op, index, mb;
} BufKey;

static guint key_hash(gconstpointer p)
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

static gboolean key_equal(gconstpointer a, gconstpointer b)
{
  return memcmp(a, b, sizeof(BufKey)) == 0;
}

static gint key_compare(gconstpointer a, gconstpointer b)
{
  const int *x = a, *y = b;
  for (size_t k = 0; k < sizeof(BufKey) / sizeof(int); k++)
    if (x[k] != y[k])
      return x[k] < y[k] ? -1 : 1;
  return 0;
}

static BufKey *key_new(int kind, int device, int tensor, int op, int index, int mb)
{
  BufKey *k = g_new(BufKey, 1);
  *k = (BufKey){ kind, device, tensor, op, index, mb };
  return k;
}

static gboolean fail(Ctx *x, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static gboolean fail(Ctx *x, int code, const char *fmt, ...)
{
  if (!x->failed) {
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(x->error, EXEC_ERROR, code, msg);
    x->failed = TRUE;
  }
  return FALSE;
}

static void *own(ExecCompiled *c, void *p)
{
  g_ptr_array_add(c->owned, p);
  return p;
}

static gboolean is_float_dtype(SimDType t)
{
  return t != SIM_DTYPE_INT32 && t != SIM_DTYPE_INT64;
}

static gboolean region_equal(const SimRegion *a, const SimRegion *b)
{
  return sim_region_equal(a, b);
}

static gboolean describe_ops(Ctx *x)
{
  ExecCompiled *c = x->c;
  const SimGraph *g = x->g;
  x->ops = g_new0(OpInfo, c->n_ops);
  for (int op = 0; op < c->n_ops && !x->failed; op++) {
    OpInfo *o = &x->ops[op];
    o->type = sim_graph_op_type(g, op);
    o->is_input = o->type == SIM_OP_INPUT;
    o->owner = sim_graph_op_weight_owner(g, op);
    if (o->is_input)
      continue;
    o->n_in = sim_graph_op_n_inputs(g, op);
    o->n_out = sim_graph_op_n_outputs(g, op);
    o->n_w = sim_graph_op_n_weights(g, op);
    o->nd = sim_graph_op_n_dims(g, op);
    if (o->nd > EXEC_MAX_ITER || o->n_w > 8)
      return fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' has %d iteration dimensions",
                  sim_graph_op_name(g, op), o->nd);
    int n;
    o->dev = sim_strategy_op_devices(c->s, op, &n);
    o->n_shards = n;
    o->copy = g_new(int, n);
    o->lo = g_new(int64_t, (size_t)n * EXEC_MAX_ITER);
    o->hi = g_new(int64_t, (size_t)n * EXEC_MAX_ITER);
    o->in_reg = g_new(SimRegion, (size_t)n * MAX(o->n_in, 1));
    o->out_reg = g_new(SimRegion, (size_t)n * MAX(o->n_out, 1));
    o->w_reg = g_new(SimRegion, (size_t)n * MAX(o->n_w, 1));
    for (int sh = 0; sh < n; sh++) {
      o->copy[sh] = sim_plan_shard_copy(c->plan, op, sh);
      sim_plan_shard_range(c->plan, op, sh, o->lo + sh * EXEC_MAX_ITER, o->hi + sh * EXEC_MAX_ITER);
      for (int i = 0; i < o->n_in; i++)
        sim_plan_shard_region(c->plan, op, sh, SIM_TENSOR_INPUT, i, &o->in_reg[sh * o->n_in + i]);
      for (int j = 0; j < o->n_out; j++)
        sim_plan_shard_region(c->plan, op, sh, SIM_TENSOR_OUTPUT, j,
                              &o->out_reg[sh * o->n_out + j]);
      for (int i = 0; i < o->n_w; i++)
        sim_plan_shard_region(c->plan, op, sh, SIM_TENSOR_WEIGHT, i, &o->w_reg[sh * o->n_w + i]);
    }
    o->out_partial = g_new0(gboolean, MAX(o->n_out, 1));
    o->in_partial = g_new0(gboolean, MAX(o->n_in, 1));
    const int *deg = sim_strategy_op_degrees(c->s, op);
    for (int j = 0; j < o->n_out; j++)
      o->out_partial[j] = sim_graph_op_tensor_partial(g, op, SIM_TENSOR_OUTPUT, j, deg);
    for (int i = 0; i < o->n_in; i++)
      o->in_partial[i] = sim_graph_op_tensor_partial(g, op, SIM_TENSOR_INPUT, i, deg);
    o->ce_split = o->type == SIM_OP_CROSS_ENTROPY && o->out_partial[0];
    /* Integer tensors (token ids, labels) are read only by the ops that look them up. */
    for (int i = 0; i < o->n_in; i++) {
      SimDType dt = sim_graph_tensor_dtype(g, sim_graph_op_input(g, op, i));
      gboolean reader = o->type == SIM_OP_EMBEDDING || (o->type == SIM_OP_CROSS_ENTROPY && i == 1);
      if (!is_float_dtype(dt) && !reader)
        return fail(x, EXEC_ERROR_UNSUPPORTED,
                    "op '%s' (%s) computes on integer tensor '%s': the executor's kernels "
                    "compute on floating-point data",
                    sim_graph_op_name(g, op), sim_op_type_name(o->type),
                    sim_graph_tensor_name(g, sim_graph_op_input(g, op, i)));
    }
    /* A function applied to a partial sum is not the function of the sum. */
    if (o->n_out > 0 && o->out_partial[0] && sim_graph_op_fused_nonlinear(g, op))
      return fail(x, EXEC_ERROR_UNSUPPORTED,
                  "op '%s' (%s) splits a dimension its output does not depend on and applies "
                  "a fused activation to the partial sums: the result would differ from the "
                  "activation of their sum",
                  sim_graph_op_name(g, op), sim_op_type_name(o->type));
    if (o->owner != op) {
      o->n_shared = sim_graph_op_n_weights(g, o->owner);
      for (int i = 0; i < o->n_shared; i++) {
        SimShape u = sim_graph_op_weight_shape(g, op, i);
        SimShape w = sim_graph_op_weight_shape(g, o->owner, i);
        if (sim_shape_equal(&u, &w))
          o->map[i] = MAP_IDENTITY;
        else if (u.ndim == 2 && w.ndim == 2 && u.dims[0] == w.dims[1] && u.dims[1] == w.dims[0])
          o->map[i] = MAP_TRANSPOSE;
        else
          o->map[i] = MAP_RESHAPE;
      }
    }
    o->saved_base = x->n_saved;
    x->n_saved += n * c->M;
  }
  return !x->failed;
}

static gboolean describe_tensors(Ctx *x)
{
  ExecCompiled *c = x->c;
  const SimGraph *g = x->g;
  x->ten = g_new0(TensorInfo, c->n_tensors);
  for (int t = 0; t < c->n_tensors; t++) {
    TensorInfo *ti = &x->ten[t];
    ti->full = sim_graph_tensor_shape(g, t);
    ti->is_float = is_float_dtype(sim_graph_tensor_dtype(g, t));
    int prod = sim_graph_tensor_producer(g, t);
    ti->from_input = x->ops[prod].is_input;
    gboolean have = FALSE;
    /* The micro-batch shape as the producer and every consumer see it: they must agree. */
    int nc = sim_graph_tensor_n_consumers(g, t);
    for (int k = -1; k < nc; k++) {
      int op = k < 0 ? prod : sim_graph_tensor_consumer(g, t, k);
      if (x->ops[op].is_input)
        continue;
      SimShape s = { 0 };
      if (k < 0) {
        for (int j = 0; j < x->ops[op].n_out; j++)
          if (sim_graph_op_output(g, op, j) == t)
            s = sim_plan_tensor_shape(c->plan, op, SIM_TENSOR_OUTPUT, j);
      } else {
        for (int i = 0; i < x->ops[op].n_in; i++)
          if (sim_graph_op_input(g, op, i) == t)
            s = sim_plan_tensor_shape(c->plan, op, SIM_TENSOR_INPUT, i);
      }
      if (!have) {
        ti->mb = s;
        have = TRUE;
      } else if (!sim_shape_equal(&s, &ti->mb)) {
        return fail(x, EXEC_ERROR_UNSUPPORTED,
                    "tensor '%s' is divided into micro-batches along different dimensions by "
                    "op '%s' and its neighbours (a reshape or transpose that moves the samples)",
                    sim_graph_tensor_name(g, t), sim_graph_op_name(g, op));
      }
    }
    if (!have)
      ti->mb = ti->full;
    for (int d = 0; d < ti->full.ndim; d++) {
      ti->sample[d] = c->M > 1 && ti->mb.dims[d] != ti->full.dims[d];
      ti->n_sample += ti->sample[d];
    }
  }
  return TRUE;
}

/* ---- buffers --------------------------------------------------------------------------------- */

static void hull_add(Ctx *x, int kind, int device, int tensor, int op, int index,
                     const SimRegion *r)
{
  if (exec_region_is_empty(r))
    return;
  BufKey k = { kind, device, tensor, op, index, -1 };
  SimRegion *box = g_hash_table_lookup(x->boxes, &k);
  if (!box) {
    box = g_new(SimRegion, 1);
    *box = *r;
    g_hash_table_insert(x->boxes, key_new(kind, device, tensor, op, index, -1), box);
  } else {
    exec_region_hull(box, r);
  }
}

static const SimRegion *hull_get(Ctx *x, int kind, int device, int tensor, int op, int index)
{
  BufKey k = { kind, device, tensor, op, index, -1 };
  return g_hash_table_lookup(x->boxes, &k);
}

/* Whether op @o has a shard on @dev. */
static gboolean op_on(const OpInfo *o, int dev)
{
  for (int sh = 0; sh < o->n_shards; sh++)
    if (o->dev[sh] == dev)
      return TRUE;
  return FALSE;
}

/* The region of the owner's weight that a sharer's region @r (in its own coordinates)
 * stands for. */
static SimRegion map_to_owner(const Ctx *x, const OpInfo *o, int i, const SimRegion *r)
{
  SimShape w = sim_graph_op_weight_shape(x->g, o->owner, i);
  SimRegion out = *r;
  if (o->map[i] == MAP_TRANSPOSE) {
    out.lo[0] = r->lo[1];
    out.hi[0] = r->hi[1];
    out.lo[1] = r->lo[0];
    out.hi[1] = r->hi[0];
  } else if (o->map[i] == MAP_RESHAPE) {
    out = sim_region_full(&w);
  }
  return out;
}

static void plan_boxes(Ctx *x)
{
  ExecCompiled *c = x->c;
  const SimGraph *g = x->g;
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *o = &x->ops[op];
    if (o->is_input)
      continue;
    for (int sh = 0; sh < o->n_shards; sh++) {
      int d = o->dev[sh];
      for (int i = 0; i < o->n_in; i++) {
        int t = sim_graph_op_input(g, op, i);
        const SimRegion *r = &o->in_reg[sh * o->n_in + i];
        hull_add(x, EXEC_BUF_VALUE, d, t, -1, 0, r);
        if (x->ten[t].is_float && !x->ten[t].from_input)
          hull_add(x, EXEC_BUF_CONTRIB, d, t, op, 0, r);
      }
      for (int j = 0; j < o->n_out; j++) {
        int t = sim_graph_op_output(g, op, j);
        const SimRegion *r = &o->out_reg[sh * o->n_out + j];
        hull_add(x, EXEC_BUF_VALUE, d, t, -1, 0, r);
        if (x->ten[t].is_float)
          hull_add(x, EXEC_BUF_GRAD, d, t, -1, 0, r);
        if (o->ce_split) {
          SimRegion s = { .ndim = r->ndim + 1 };
          s.lo[0] = 0;
          s.hi[0] = EXEC_STATS_PLANES;
          for (int k = 0; k < r->ndim; k++) {
            s.lo[k + 1] = r->lo[k];
            s.hi[k + 1] = r->hi[k];
          }
          hull_add(x, EXEC_BUF_STATS, d, t, op, 0, &s);
        }
      }
      for (int i = 0; i < o->n_w; i++) {
        const SimRegion *r = &o->w_reg[sh * o->n_w + i];
        if (i >= o->n_shared)
          hull_add(x, EXEC_BUF_WEIGHT, d, -1, op, i, r);
      }
    }
  }
  /* A copy that carries several consumers' gradient contributions sends their sum, which
   * is staged in a buffer of its own. */
  for (int i = 0; i < c->n_tasks; i++) {
    SimPlanTask t;
    sim_plan_task(c->plan, i, &t);
    if (t.kind == SIM_PLAN_COPY && t.grad && t.n_ops > 1)
      hull_add(x, EXEC_BUF_STAGE, t.device, t.tensor, -1, 0, &t.region);
  }
  /* Shared weights, once the owners' boxes are known: a sharer uses the owner's buffer on
   * a device where the owner has shards, else keeps its own copy. */
  for (int op = 0; op < c->n_ops && !x->failed; op++) {
    const OpInfo *o = &x->ops[op];
    if (o->is_input || o->n_shared == 0)
      continue;
    const OpInfo *ow = &x->ops[o->owner];
    for (int sh = 0; sh < o->n_shards; sh++) {
      int d = o->dev[sh];
      for (int i = 0; i < o->n_shared; i++) {
        const SimRegion *r = &o->w_reg[sh * o->n_w + i];
        if (!op_on(ow, d)) {
          hull_add(x, EXEC_BUF_WEIGHT, d, -1, op, i, r);
          continue;
        }
        SimRegion m = map_to_owner(x, o, i, r);
        const SimRegion *box = hull_get(x, EXEC_BUF_WEIGHT, d, -1, o->owner, i);
        SimShape ws = sim_graph_op_weight_shape(x->g, o->owner, i);
        SimRegion full = sim_region_full(&ws);
        if (!box || !sim_region_contains(box, &m) ||
            (o->map[i] == MAP_RESHAPE && !sim_region_equal(box, &full)))
          fail(x, EXEC_ERROR_UNSUPPORTED,
               "op '%s' uses weight %d of op '%s' on device %d, where the owner's shards hold "
               "other parts of it",
               sim_graph_op_name(x->g, op), i, sim_graph_op_name(x->g, o->owner), d);
      }
    }
  }
}

/* A consumer's gradient contributions go straight into the producer's gradient buffer
 * where nothing else adds there: the one consumer of the tensor on the device, with the
 * same box as the gradient, and no copy or reduction of the tensor's gradient touching
 * the device.  Backward kernels add into their input gradients and the prologue zeroes
 * the gradient, so this saves a zeroing and a copy of every such tensor in each step,
 * which is what frameworks do (they write into one gradient buffer). */
static void find_aliases(Ctx *x)
{
  ExecCompiled *c = x->c;
  /* Per (device, tensor): the consumers contributing there, or -1 where a copy or a
   * reduction of the gradient touches it. */
#define DT(device, tensor) GSIZE_TO_POINTER((gsize)(device) * (gsize)c->n_tensors + (gsize)(tensor) + 1)
  g_autoptr(GHashTable) n_contrib = g_hash_table_new(g_direct_hash, g_direct_equal);
  for (int i = 0; i < c->n_tasks; i++) {
    SimPlanTask t;
    sim_plan_task(c->plan, i, &t);
    if (!t.grad || (t.kind != SIM_PLAN_COPY && t.kind != SIM_PLAN_REDUCE))
      continue;
    int n = t.kind == SIM_PLAN_COPY ? 2 : t.n_devices;
    for (int k = 0; k < n; k++) {
      int d = t.kind == SIM_PLAN_COPY ? (k ? t.peer : t.device) : t.devices[k];
      g_hash_table_insert(n_contrib, DT(d, t.tensor), GINT_TO_POINTER(-1));
    }
  }
  GHashTableIter it;
  gpointer kp, vp;
  g_hash_table_iter_init(&it, x->boxes);
  while (g_hash_table_iter_next(&it, &kp, &vp)) {
    const BufKey *key = kp;
    if (key->kind != EXEC_BUF_CONTRIB)
      continue;
    int n = GPOINTER_TO_INT(g_hash_table_lookup(n_contrib, DT(key->device, key->tensor)));
    if (n >= 0)
      g_hash_table_insert(n_contrib, DT(key->device, key->tensor), GINT_TO_POINTER(n + 1));
  }
  g_hash_table_iter_init(&it, x->boxes);
  while (g_hash_table_iter_next(&it, &kp, &vp)) {
    const BufKey *key = kp;
    if (key->kind != EXEC_BUF_CONTRIB ||
        GPOINTER_TO_INT(g_hash_table_lookup(n_contrib, DT(key->device, key->tensor))) != 1)
      continue;
    const SimRegion *grad = hull_get(x, EXEC_BUF_GRAD, key->device, key->tensor, -1, 0);
    if (grad && region_equal(grad, vp))
      g_hash_table_add(x->alias, key_new(key->kind, key->device, key->tensor, key->op,
                                         key->index, key->mb));
  }
#undef DT
}

static ExecBuf *buf_alloc(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index,
                          int mb, SimDType dtype, const SimRegion *box)
{
  ExecCompiled *c = x->c;
  ExecBuf *b = g_new0(ExecBuf, 1);
  *b = (ExecBuf){ kind, device, tensor, op, index, mb, dtype, *box, NULL };
  g_ptr_array_add(c->bufs, b);
  g_hash_table_insert(c->buf_index, key_new(kind, device, tensor, op, index, mb), b);
  if (!c->local[device] || x->failed)
    return b;
  size_t bytes = (size_t)sim_region_volume(box) * (dtype == SIM_DTYPE_INT64 ? 8 : 4);
  b->buffer = exec_backend_buffer_alloc(c->backend, device, MAX(bytes, 4), x->error);
  if (!b->buffer)
    x->failed = TRUE;
  return b;
}

ExecBuf *exec_compiled_buf(const ExecCompiled *c, ExecBufKind kind, int device, int tensor,
                           int op, int index, int mb)
{
  BufKey k = { kind, device, tensor, op, index, mb };
  return g_hash_table_lookup(c->buf_index, &k);
}

static void alloc_buffers(Ctx *x)
{
  ExecCompiled *c = x->c;
  GHashTableIter it;
  gpointer kp, vp;
  /* A sorted walk keeps allocation (and so run-to-run behaviour) deterministic. */
  GArray *keys = g_array_new(FALSE, FALSE, sizeof(BufKey));
  g_hash_table_iter_init(&it, x->boxes);
  while (g_hash_table_iter_next(&it, &kp, &vp))
    g_array_append_vals(keys, kp, 1);
  g_array_sort(keys, key_compare);
  for (guint k = 0; k < keys->len && !x->failed; k++) {
    BufKey key = g_array_index(keys, BufKey, k);
    const SimRegion *box = g_hash_table_lookup(x->boxes, &key);
    switch ((ExecBufKind)key.kind) {
    case EXEC_BUF_VALUE:
    case EXEC_BUF_GRAD:
    case EXEC_BUF_CONTRIB:
    case EXEC_BUF_STATS:
    case EXEC_BUF_STAGE: {
      if (g_hash_table_contains(x->alias, &key))
        break;
      SimDType dt = key.kind == EXEC_BUF_VALUE && !x->ten[key.tensor].is_float ? SIM_DTYPE_INT64
                                                                               : SIM_DTYPE_FP32;
      for (int mb = 0; mb < c->M; mb++) {
        ExecBuf *b = buf_alloc(x, key.kind, key.device, key.tensor, key.op, key.index, mb, dt,
                               box);
        if (key.kind == EXEC_BUF_VALUE && x->ten[key.tensor].from_input && c->local[key.device])
          g_ptr_array_add(c->inputs, b);
      }
      break;
    }
    case EXEC_BUF_WEIGHT: {
      ExecWeightSlot slot = { .holder = key.op, .weight = key.index, .device = key.device };
      slot.w = buf_alloc(x, EXEC_BUF_WEIGHT, key.device, -1, key.op, key.index, -1,
                         SIM_DTYPE_FP32, box);
      slot.g = buf_alloc(x, EXEC_BUF_WGRAD, key.device, -1, key.op, key.index, -1,
                         SIM_DTYPE_FP32, box);
      slot.s1 = buf_alloc(x, EXEC_BUF_STATE1, key.device, -1, key.op, key.index, -1,
                          SIM_DTYPE_FP32, box);
      slot.s2 = buf_alloc(x, EXEC_BUF_STATE2, key.device, -1, key.op, key.index, -1,
                          SIM_DTYPE_FP32, box);
      g_array_append_val(c->slots, slot);
      break;
    }
    default:
      break;
    }
  }
  g_array_free(keys, TRUE);
  /* Aliased contributions are their gradient buffers (indexed, not owned twice). */
  g_hash_table_iter_init(&it, x->alias);
  while (!x->failed && g_hash_table_iter_next(&it, &kp, &vp)) {
    const BufKey *key = kp;
    for (int mb = 0; mb < c->M; mb++) {
      ExecBuf *gb = exec_compiled_buf(c, EXEC_BUF_GRAD, key->device, key->tensor, -1, 0, mb);
      g_assert(gb != NULL);
      g_hash_table_insert(c->buf_index,
                          key_new(EXEC_BUF_CONTRIB, key->device, key->tensor, key->op, 0, mb),
                          gb);
    }
  }
}

/* The initial values of @box of weight @i of @owner: generated, or taken from the whole
 * tensor that ExecOptions.weights gives. */
static gboolean weight_values(Ctx *x, int owner, int i, const SimRegion *box, float *out)
{
  ExecCompiled *c = x->c;
  if (!c->o.weights) {
    exec_weight_init(x->g, owner, i, box, c->o.seed, out);
    return TRUE;
  }
  SimShape s = sim_graph_op_weight_shape(x->g, owner, i);
  SimRegion full = sim_region_full(&s);
  g_autofree float *whole = g_new(float, MAX(sim_shape_numel(&s), 1));
  if (!c->o.weights(c->o.weights_data, x->g, owner, i, whole, x->error)) {
    x->failed = TRUE;
    return FALSE;
  }
  if (exec_region_is_empty(box))
    return TRUE;
  ExecView v = exec_view_dense(NULL, SIM_DTYPE_FP32, &full);
  int64_t idx[SIM_MAX_DIMS], k = 0;
  for (int d = 0; d < box->ndim; d++)
    idx[d] = box->lo[d];
  do
    out[k++] = whole[exec_view_offset(&v, idx)];
  while (exec_region_next(box, idx));
  return TRUE;
}

/* Writes the initial weights: an owner's from its own coordinates, a sharer's copy from
 * the owner's elements it stands for. */
static void init_weights(Ctx *x)
{
  ExecCompiled *c = x->c;
  for (guint k = 0; k < c->slots->len && !x->failed; k++) {
    ExecWeightSlot *s = &g_array_index(c->slots, ExecWeightSlot, k);
    if (!c->local[s->device])
      continue;
    const OpInfo *o = &x->ops[s->holder];
    const SimRegion *box = &s->w->box;
    int64_t n = sim_region_volume(box);
    g_autofree float *data = g_new(float, MAX(n, 1));
    if (s->weight >= o->n_shared) {
      if (!weight_values(x, s->holder, s->weight, box, data))
        return;
    } else {
      SimRegion m = map_to_owner(x, o, s->weight, box);
      g_autofree float *src = g_new(float, MAX(sim_region_volume(&m), 1));
      if (!weight_values(x, o->owner, s->weight, &m, src))
        return;
      if (o->map[s->weight] == MAP_TRANSPOSE) {
        int64_t r0 = box->hi[0] - box->lo[0], r1 = box->hi[1] - box->lo[1];
        for (int64_t a = 0; a < r0; a++)
          for (int64_t b = 0; b < r1; b++)
            data[a * r1 + b] = src[b * r0 + a];
      } else {
        memcpy(data, src, sizeof(float) * (size_t)n);
      }
    }
    if (!exec_backend_buffer_write(c->backend, s->device, s->w->buffer, 0, data,
                                   sizeof(float) * (size_t)n, x->error))
      x->failed = TRUE;
  }
}

/* ---- views ----------------------------------------------------------------------------------- */

static ExecView buf_view(const ExecBuf *b)
{
  if (!b)
    return (ExecView){ 0 };
  return exec_view_dense(b->buffer, b->dtype, &b->box);
}

static ExecBuf *find_buf(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index, int mb)
{
  return exec_compiled_buf(x->c, kind, device, tensor, op, index, mb);
}

/* The view, in op @op's own coordinates, of its weight @i (or of the gradient with
 * @kind EXEC_BUF_WGRAD, ...) on @dev. */
static ExecView weight_view(Ctx *x, int op, int i, int dev, ExecBufKind kind)
{
  const OpInfo *o = &x->ops[op];
  if (i >= o->n_shared || !op_on(&x->ops[o->owner], dev))
    return buf_view(find_buf(x, kind, dev, -1, op, i, -1));
  ExecBuf *b = find_buf(x, kind, dev, -1, o->owner, i, -1);
  ExecView v = buf_view(b);
  if (o->map[i] == MAP_TRANSPOSE) {
    SimRegion box = b->box;
    v.box.lo[0] = box.lo[1];
    v.box.hi[0] = box.hi[1];
    v.box.lo[1] = box.lo[0];
    v.box.hi[1] = box.hi[0];
    v.stride[0] = 1;
    v.stride[1] = box.hi[1] - box.lo[1];
  } else if (o->map[i] == MAP_RESHAPE) {
    SimShape u = sim_graph_op_weight_shape(x->g, op, i);
    SimRegion full = sim_region_full(&u);
    v = exec_view_dense(b->buffer, SIM_DTYPE_FP32, &full);
  }
  return v;
}

/* The region of planes [p, p + n) of the statistics over the rows @rows. */
static SimRegion stats_region(const SimRegion *rows, int p, int n)
{
  SimRegion r = { .ndim = rows->ndim + 1 };
  r.lo[0] = p;
  r.hi[0] = p + n;
  for (int k = 0; k < rows->ndim; k++) {
    r.lo[k + 1] = rows->lo[k];
    r.hi[k + 1] = rows->hi[k];
  }
  return r;
}

static ExecKernelArgs *kernel_args(Ctx *x, int op, int sh, int mb, ExecKernelPhase phase)
{
  ExecCompiled *c = x->c;
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  ExecKernelArgs *a = own(c, g_new0(ExecKernelArgs, 1));
  a->graph = x->g;
  a->op = op;
  a->phase = phase;
  a->shard = sh;
  a->mb = mb;
  memcpy(a->lo, o->lo + sh * EXEC_MAX_ITER, sizeof a->lo);
  memcpy(a->hi, o->hi + sh * EXEC_MAX_ITER, sizeof a->hi);
  a->batch = c->batch;
  a->sample_offset = (int64_t)mb * (c->batch / c->M);
  a->microbatches = c->M;
  a->n_inputs = o->n_in;
  a->n_weights = o->n_w;
  a->n_outputs = o->n_out;
  ExecView *in = own(c, g_new0(ExecView, MAX(o->n_in, 1)));
  ExecView *ing = own(c, g_new0(ExecView, MAX(o->n_in, 1)));
  for (int i = 0; i < o->n_in; i++) {
    int t = sim_graph_op_input(x->g, op, i);
    in[i] = buf_view(find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    ing[i] = buf_view(find_buf(x, EXEC_BUF_CONTRIB, d, t, op, 0, mb));
  }
  ExecView *w = own(c, g_new0(ExecView, MAX(o->n_w, 1)));
  ExecView *wg = own(c, g_new0(ExecView, MAX(o->n_w, 1)));
  for (int i = 0; i < o->n_w; i++) {
    w[i] = weight_view(x, op, i, d, EXEC_BUF_WEIGHT);
    wg[i] = weight_view(x, op, i, d, EXEC_BUF_WGRAD);
  }
  ExecView *out = own(c, g_new0(ExecView, MAX(o->n_out, 1)));
  ExecView *outg = own(c, g_new0(ExecView, MAX(o->n_out, 1)));
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    out[j] = buf_view(find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    outg[j] = buf_view(find_buf(x, EXEC_BUF_GRAD, d, t, -1, 0, mb));
  }
  a->in = in;
  a->in_grad = ing;
  a->w = w;
  a->w_grad = wg;
  a->out = out;
  a->out_grad = outg;
  if (o->ce_split) {
    int t = sim_graph_op_output(x->g, op, 0);
    ExecView *st = own(c, g_new(ExecView, 1));
    *st = buf_view(find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
    a->stats = st;
    a->accumulate = phase == EXEC_KERNEL_FORWARD;
    a->split_stats = phase == EXEC_KERNEL_BACKWARD;
  } else if (o->n_out > 0) {
    a->accumulate = o->out_partial[0];
  }
  a->saved = &x->saved[o->saved_base + sh * c->M + mb];
  return a;
}

/* ---- emitting ---------------------------------------------------------------------------------- */

/* TRUE the first time (@what, @a, @b, @c, @d, @r) is asked about. */
static gboolean first_time(Ctx *x, int what, int a, int b, int cc, int d, const SimRegion *r)
{
  struct {
    int what, a, b, c, d;
    SimRegion r;
  } key;
  memset(&key, 0, sizeof key);
  key.what = what;
  key.a = a;
  key.b = b;
  key.c = cc;
  key.d = d;
  if (r) {
    key.r.ndim = r->ndim;
    for (int k = 0; k < r->ndim; k++) {
      key.r.lo[k] = r->lo[k];
      key.r.hi[k] = r->hi[k];
    }
  }
  GBytes *k = g_bytes_new(&key, sizeof key);
  if (g_hash_table_contains(x->seen, k)) {
    g_bytes_unref(k);
    return FALSE;
  }
  g_hash_table_add(x->seen, k);
  return TRUE;
}

enum { SEEN_ZERO_OUT, SEEN_FOLD, SEEN_ZERO_CONTRIB, SEEN_UPDATE };

static void emit(Ctx *x, int dev, const ExecMop *m)
{
  if (x->c->local[dev])
    g_array_append_vals(x->c->programs[dev].mops, m, 1);
}

static void emit_time(Ctx *x, int dev, int task, gboolean begin)
{
  ExecProgram *p = &x->c->programs[dev];
  if (!x->c->local[dev])
    return;
  if (begin) {
    g_array_append_val(p->time_task, task);
    p->n_times++;
  }
  ExecMop m = { .kind = begin ? EXEC_MOP_BEGIN : EXEC_MOP_END, .timing = p->n_times - 1 };
  g_array_append_val(p->mops, m);
}

static void emit_fill(Ctx *x, int dev, const ExecView *v, const SimRegion *r, float value)
{
  if (!v->buffer && x->c->local[dev])
    return;
  ExecMop m = { .kind = EXEC_MOP_FILL, .a = *v, .region = *r, .value = value };
  emit(x, dev, &m);
}

static ExecGroup make_group(Ctx *x, const int *devs, int n, int dev, int64_t tag)
{
  int *copy = own(x->c, g_memdup2(devs, sizeof(int) * (size_t)n));
  int rank = 0;
  for (int k = 0; k < n; k++)
    if (devs[k] == dev)
      rank = k;
  return (ExecGroup){ .n = n, .devices = copy, .rank = rank, .tag = tag };
}

static void emit_coll(Ctx *x, ExecMopKind kind, int dev, const int *devs, int n, int64_t tag,
                      const ExecView *v, const SimRegion *r, ExecReduceOp op)
{
  ExecMop m = { .kind = kind, .a = *v, .region = *r, .reduce = op };
  m.group = make_group(x, devs, n, dev, tag);
  emit(x, dev, &m);
}

static void emit_forward(Ctx *x, int task, int op, int sh, int mb, gboolean recompute)
{
  ExecCompiled *c = x->c;
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  emit_time(x, d, task, TRUE);
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    const SimRegion *r = &o->out_reg[sh * o->n_out + j];
    if (!x->ten[t].is_float || !first_time(x, SEEN_ZERO_OUT, t, mb, recompute, d, r))
      continue;
    ExecView v = buf_view(find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    if (recompute && c->o.poison)
      emit_fill(x, d, &v, r, NAN);
    if (o->ce_split) {
      ExecView s = buf_view(find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
      SimRegion p0 = stats_region(r, EXEC_STATS_LOCAL_MAX, 2);
      SimRegion p1 = stats_region(r, EXEC_STATS_SUM, 2);
      emit_fill(x, d, &s, &p0, -INFINITY);
      emit_fill(x, d, &s, &p1, 0.0f);
    } else if (o->out_partial[j]) {
      emit_fill(x, d, &v, r, 0.0f);
    }
  }
  ExecMop m = { .kind = EXEC_MOP_KERNEL, .kernel = kernel_args(x, op, sh, mb, EXEC_KERNEL_FORWARD) };
  emit(x, d, &m);
  emit_time(x, d, task, FALSE);
}

static void emit_backward(Ctx *x, int task, int op, int sh, int mb)
{
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  emit_time(x, d, task, TRUE);
  /* The device's own consumers' contributions join what it received, once per region. */
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    const SimRegion *r = &o->out_reg[sh * o->n_out + j];
    if (!x->ten[t].is_float || !first_time(x, SEEN_FOLD, t, mb, 0, d, r))
      continue;
    ExecView gv = buf_view(find_buf(x, EXEC_BUF_GRAD, d, t, -1, 0, mb));
    int nc = sim_graph_tensor_n_consumers(x->g, t);
    for (int k = 0; k < nc; k++) {
      int cx = sim_graph_tensor_consumer(x->g, t, k);
      if (k > 0 && cx == sim_graph_tensor_consumer(x->g, t, k - 1))
        continue;
      ExecBuf *cb = find_buf(x, EXEC_BUF_CONTRIB, d, t, cx, 0, mb);
      SimRegion inter;
      if (!cb || cb->kind == EXEC_BUF_GRAD || !sim_region_intersect(&cb->box, r, &inter))
        continue;
      ExecMop m = { .kind = EXEC_MOP_COPY, .a = gv, .b = buf_view(cb), .region = inter,
                    .accumulate = TRUE };
      emit(x, d, &m);
    }
  }
  for (int i = 0; i < o->n_in; i++) {
    int t = sim_graph_op_input(x->g, op, i);
    ExecBuf *cb = find_buf(x, EXEC_BUF_CONTRIB, d, t, op, 0, mb);
    /* An aliased contribution is the gradient, which the prologue zeroed. */
    if (cb && cb->kind == EXEC_BUF_CONTRIB && first_time(x, SEEN_ZERO_CONTRIB, t, mb, op, d, NULL)) {
      ExecView v = buf_view(cb);
      emit_fill(x, d, &v, &cb->box, 0.0f);
    }
  }
  ExecMop m = { .kind = EXEC_MOP_KERNEL,
                .kernel = kernel_args(x, op, sh, mb, EXEC_KERNEL_BACKWARD) };
  emit(x, d, &m);
  emit_time(x, d, task, FALSE);
}

/* The group a weight region of @op on @dev belongs to. */
static ExecWeightGroup *group_of(Ctx *x, int op, int sh)
{
  ExecCompiled *c = x->c;
  for (guint k = 0; k < c->groups->len; k++) {
    ExecWeightGroup *gr = &g_array_index(c->groups, ExecWeightGroup, k);
    if (gr->op != op)
      continue;
    for (int m = 0; m < gr->n; m++)
      if (gr->members[m] == sh)
        return gr;
  }
  return NULL;
}

static int rank_in(const int *devs, int n, int dev)
{
  for (int k = 0; k < n; k++)
    if (devs[k] == dev)
      return k;
  return -1;
}

static void emit_update_region(Ctx *x, int d, const ExecWeightSlot *slot, const SimRegion *r,
                               int64_t plo, int64_t phi)
{
  ExecCompiled *c = x->c;
  ExecUpdateArgs *u = own(c, g_new0(ExecUpdateArgs, 1));
  u->optimizer = c->optimizer;
  u->lr = c->o.lr;
  u->momentum = c->o.momentum;
  u->beta1 = c->o.beta1;
  u->beta2 = c->o.beta2;
  u->eps = c->o.eps;
  u->weight = buf_view(slot->w);
  u->grad = buf_view(slot->g);
  u->state1 = buf_view(slot->s1);
  u->state2 = buf_view(slot->s2);
  u->region = *r;
  u->part_lo = plo;
  u->part_hi = phi;
  ExecMop m = { .kind = EXEC_MOP_UPDATE, .update = u };
  emit(x, d, &m);
}

/* An update applies the summed gradient to the weight regions of its own shard, each
 * region once per device (shards of a data-parallel group on one device share it), after
 * that shard's synchronization; under ZeRO-1 only this device's part of the region. */
static void emit_update(Ctx *x, int task, int op, int sh)
{
  ExecCompiled *c = x->c;
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  emit_time(x, d, task, TRUE);
  for (guint k = 0; k < c->slots->len; k++) {
    const ExecWeightSlot *slot = &g_array_index(c->slots, ExecWeightSlot, k);
    if (slot->holder != op || slot->device != d)
      continue;
    int i = slot->weight;
    const SimRegion *r = &o->w_reg[sh * o->n_w + i];
    if (!first_time(x, SEEN_UPDATE, op, i, 0, d, r))
      continue;
    int64_t n = sim_region_volume(r), plo = 0, phi = n;
    ExecWeightGroup *gr = i < o->n_shared ? NULL : group_of(x, op, sh);
    if (gr && gr->sharded) {
      int k2 = rank_in(gr->devices, gr->n_devices, d);
      exec_part_range(n, gr->n_devices, k2, &plo, &phi);
    }
    emit_update_region(x, d, slot, r, plo, phi);
  }
  emit_time(x, d, task, FALSE);
}

static int64_t coll_tag(int task, int k)
{
  return ((int64_t)task << 20) + k;
}

static void emit_copy(Ctx *x, int task, const SimPlanTask *t)
{
  int src = t->device, dst = t->peer;
  int64_t tag = coll_tag(task, 0);
  ExecBuf *from, *to;
  if (t->grad && t->relay) {
    /* A part of a gradient passed on (scatter-gather): the relaying device's gradient
     * buffer holds what it received, which the lowering makes the part alone (no consumer
     * of the tensor on that device). */
    int nc = sim_graph_tensor_n_consumers(x->g, t->tensor);
    for (int k = 0; k < nc; k++)
      if (find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor, sim_graph_tensor_consumer(x->g, t->tensor, k),
                   0, t->mb)) {
        fail(x, EXEC_ERROR_UNSUPPORTED,
             "task %d passes on part of the gradient of tensor '%s' from device %d, which "
             "also computes some of it",
             task, sim_graph_tensor_name(x->g, t->tensor), src);
        return;
      }
    from = find_buf(x, EXEC_BUF_GRAD, src, t->tensor, -1, 0, t->mb);
    to = find_buf(x, EXEC_BUF_GRAD, dst, t->tensor, -1, 0, t->mb);
  } else if (t->grad) {
    /* One consumer's contributions, or the staged sum of several. */
    from = t->n_ops > 1 ? find_buf(x, EXEC_BUF_STAGE, src, t->tensor, -1, 0, t->mb)
                        : find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor, t->ops[0], 0, t->mb);
    to = find_buf(x, EXEC_BUF_GRAD, dst, t->tensor, -1, 0, t->mb);
  } else {
    from = find_buf(x, EXEC_BUF_VALUE, src, t->tensor, -1, 0, t->mb);
    to = find_buf(x, EXEC_BUF_VALUE, dst, t->tensor, -1, 0, t->mb);
  }
  if (!from || !to || !sim_region_contains(&from->box, &t->region) ||
      !sim_region_contains(&to->box, &t->region)) {
    fail(x, EXEC_ERROR_UNSUPPORTED,
         "task %d copies %s of tensor '%s' from device %d to %d, where neither side's "
         "shards touch it",
         task, t->grad ? "the gradient" : "the value", sim_graph_tensor_name(x->g, t->tensor),
         src, dst);
    return;
  }
  emit_time(x, src, task, TRUE);
  if (t->grad && !t->relay && t->n_ops > 1) {
    ExecView sv = buf_view(from);
    emit_fill(x, src, &sv, &t->region, 0.0f);
    for (int k = 0; k < t->n_ops; k++) {
      ExecBuf *cb = find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor, t->ops[k], 0, t->mb);
      if (!cb || !sim_region_contains(&cb->box, &t->region)) {
        fail(x, EXEC_ERROR_UNSUPPORTED, "task %d sends gradients of op '%s' device %d does "
             "not hold", task, sim_graph_op_name(x->g, t->ops[k]), src);
        return;
      }
      ExecMop m = { .kind = EXEC_MOP_COPY, .a = sv, .b = buf_view(cb), .region = t->region,
                    .accumulate = TRUE };
      emit(x, src, &m);
    }
  }
  ExecMop s = { .kind = EXEC_MOP_SEND, .peer = dst, .a = buf_view(from), .region = t->region };
  s.group.tag = tag;
  emit(x, src, &s);
  emit_time(x, src, task, FALSE);
  emit_time(x, dst, task, TRUE);
  ExecMop r = { .kind = EXEC_MOP_RECV, .peer = src, .a = buf_view(to), .region = t->region,
                .accumulate = t->grad };
  r.group.tag = tag;
  emit(x, dst, &r);
  emit_time(x, dst, task, FALSE);
}

/* Combines the statistics of cross entropy over split classes held by @devs over the rows
 * @rows, and writes the loss there. */
static void emit_ce_combine(Ctx *x, int task, int op, int mb, const SimRegion *rows,
                            const int *devs, int n)
{
  const OpInfo *o = &x->ops[op];
  int t = sim_graph_op_output(x->g, op, 0);
  for (int k = 0; k < n; k++) {
    int d = devs[k];
    int sh = -1;
    for (int s2 = 0; s2 < o->n_shards && sh < 0; s2++)
      if (o->dev[s2] == d && region_equal(&o->out_reg[s2], rows))
        sh = s2;
    if (sh < 0) {
      fail(x, EXEC_ERROR_UNSUPPORTED, "device %d sums partial losses of op '%s' it has no "
           "shard of", d, sim_graph_op_name(x->g, op));
      return;
    }
    if (task >= 0)
      emit_time(x, d, task, TRUE);
    ExecView s = buf_view(find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
    SimRegion gmax = stats_region(rows, EXEC_STATS_MAX, 1);
    /* The copy moves plane LOCAL_MAX onto plane MAX: a view of the statistics shifted by
     * one plane reads the local maxima where the region names the global ones. */
    ExecView lv = s;
    lv.offset -= (EXEC_STATS_MAX - EXEC_STATS_LOCAL_MAX) * s.stride[0];
    ExecMop cp = { .kind = EXEC_MOP_COPY, .a = s, .b = lv, .region = gmax };
    emit(x, d, &cp);
    int64_t base = task >= 0 ? task : (int64_t)x->c->n_tasks + (-task);
    if (n > 1) {
      emit_coll(x, EXEC_MOP_ALL_REDUCE, d, devs, n, coll_tag((int)base, 0), &s, &gmax,
                EXEC_REDUCE_MAX);
      ExecMop rs = { .kind = EXEC_MOP_KERNEL,
                     .kernel = kernel_args(x, op, sh, mb, EXEC_KERNEL_STATS_RESCALE) };
      emit(x, d, &rs);
      SimRegion sums = stats_region(rows, EXEC_STATS_SUM, 2);
      emit_coll(x, EXEC_MOP_ALL_REDUCE, d, devs, n, coll_tag((int)base, 1), &s, &sums,
                EXEC_REDUCE_SUM);
    }
    ExecMop fin = { .kind = EXEC_MOP_KERNEL,
                    .kernel = kernel_args(x, op, sh, mb, EXEC_KERNEL_STATS_FINISH) };
    emit(x, d, &fin);
    if (task >= 0)
      emit_time(x, d, task, FALSE);
  }
}

static void emit_reduce(Ctx *x, int task, const SimPlanTask *t)
{
  if (t->op < 0) {
    fail(x, EXEC_ERROR_UNSUPPORTED, "reduction task %d has no compute task before it", task);
    return;
  }
  const OpInfo *o = &x->ops[t->op];
  if (!t->grad && o->ce_split) {
    emit_ce_combine(x, task, t->op, t->mb, &t->region, t->devices, t->n_devices);
    return;
  }
  for (int k = 0; k < t->n_devices; k++) {
    int d = t->devices[k];
    emit_time(x, d, task, TRUE);
    if (t->n_devices > 1) {
      ExecBuf *b = t->grad ? find_buf(x, EXEC_BUF_CONTRIB, d, t->tensor, t->op, 0, t->mb)
                           : find_buf(x, EXEC_BUF_VALUE, d, t->tensor, -1, 0, t->mb);
      if (!b || !sim_region_contains(&b->box, &t->region)) {
        fail(x, EXEC_ERROR_UNSUPPORTED, "reduction task %d sums a region device %d does not "
             "hold", task, d);
        return;
      }
      ExecView v = buf_view(b);
      emit_coll(x, EXEC_MOP_ALL_REDUCE, d, t->devices, t->n_devices, coll_tag(task, 0), &v,
                &t->region, EXEC_REDUCE_SUM);
    }
    emit_time(x, d, task, FALSE);
  }
}

static gboolean same_devs(const int *a, int na, const int *b, int nb)
{
  return na == nb && memcmp(a, b, sizeof(int) * (size_t)na) == 0;
}

static void emit_sync(Ctx *x, int task, const SimPlanTask *t, gboolean gather)
{
  ExecCompiled *c = x->c;
  int sub = 0;
  for (int d = 0; d < t->n_devices; d++)
    emit_time(x, t->devices[d], task, TRUE);
  for (int q = 0; q < t->n_ops && !x->failed; q++) {
    int op = t->ops[q];
    const OpInfo *o = &x->ops[op];
    if (o->owner == op) {
      /* The next group of @op on these devices this kind of task has not covered. */
      ExecWeightGroup *gr = NULL;
      for (guint k = 0; k < c->groups->len && !gr; k++) {
        ExecWeightGroup *h = &g_array_index(c->groups, ExecWeightGroup, k);
        gboolean covered = gather ? !h->sharded || h->gathered : h->synced;
        if (h->op == op && !covered && same_devs(h->devices, h->n_devices, t->devices, t->n_devices))
          gr = h;
      }
      if (!gr) {
        fail(x, EXEC_ERROR_UNSUPPORTED, "task %d synchronizes op '%s' over devices no group "
             "of its shards shares", task, sim_graph_op_name(x->g, op));
        return;
      }
      if (gather) {
        gr->gathered = TRUE;
      } else {
        gr->synced = TRUE;
        gr->sharded = t->sharded;
      }
      for (int i = 0; i < o->n_w; i++) {
        const SimRegion *r = &o->w_reg[gr->members[0] * o->n_w + i];
        for (int k = 0; k < t->n_devices; k++) {
          int d = t->devices[k];
          ExecView v = weight_view(x, op, i, d, gather ? EXEC_BUF_WEIGHT : EXEC_BUF_WGRAD);
          ExecMopKind kind = gather ? EXEC_MOP_ALL_GATHER
                             : t->sharded ? EXEC_MOP_REDUCE_SCATTER
                                          : EXEC_MOP_ALL_REDUCE;
          emit_coll(x, kind, d, t->devices, t->n_devices, coll_tag(task, sub), &v, r,
                    EXEC_REDUCE_SUM);
        }
        sub++;
      }
      continue;
    }
    /* A copy of shared weights exchanges gradients with the owner's. */
    if (gather || t->sharded) {
      fail(x, EXEC_ERROR_UNSUPPORTED,
           "op '%s' keeps a copy of op '%s''s weights and the plan shards their optimizer "
           "states: the copy and the owner would update different parts",
           sim_graph_op_name(x->g, op), sim_graph_op_name(x->g, o->owner));
      return;
    }
    SharerItem *it = NULL;
    for (guint k = 0; k < x->sharers->len && !it; k++) {
      SharerItem *s = &g_array_index(x->sharers, SharerItem, k);
      if (s->op == op && !s->assigned && same_devs(s->devs, 2, t->devices, t->n_devices))
        it = s;
    }
    if (!it) {
      /* Not an exchange with the owner: the copies' own sum over the devices that hold
       * the same part (the output layer's copy on every data-parallel replica of the last
       * stage), before their exchange. */
      int part = -1;
      for (guint k = 0; k < x->sharers->len && part < 0; k++) {
        const SharerItem *s = &g_array_index(x->sharers, SharerItem, k);
        if (s->op == op && s->devs[1] == t->devices[0])
          part = s->shard;
      }
      if (part >= 0 && t->n_devices > 1) {
        for (int i = 0; i < o->n_shared; i++) {
          const SimRegion *r = &o->w_reg[part * o->n_w + i];
          for (int k = 0; k < t->n_devices; k++) {
            ExecView v = weight_view(x, op, i, t->devices[k], EXEC_BUF_WGRAD);
            emit_coll(x, EXEC_MOP_ALL_REDUCE, t->devices[k], t->devices, t->n_devices,
                      coll_tag(task, sub), &v, r, EXEC_REDUCE_SUM);
          }
          sub++;
        }
        continue;
      }
      fail(x, EXEC_ERROR_UNSUPPORTED, "task %d exchanges gradients of op '%s' between devices "
           "that hold no copy of its weights", task, sim_graph_op_name(x->g, op));
      return;
    }
    it->assigned = TRUE;
    for (int i = 0; i < o->n_shared; i++) {
      const SimRegion *r = &o->w_reg[it->shard * o->n_w + i];
      for (int k = 0; k < 2; k++) {
        int d = it->devs[k];
        ExecView v = weight_view(x, op, i, d, EXEC_BUF_WGRAD);
        emit_coll(x, EXEC_MOP_ALL_REDUCE, d, it->devs, 2, coll_tag(task, sub), &v, r,
                  EXEC_REDUCE_SUM);
      }
      sub++;
    }
  }
  for (int d = 0; d < t->n_devices; d++)
    emit_time(x, t->devices[d], task, FALSE);
}

/* Work the plan leaves out and exact results need, which the executor adds (untimed):
 * - the reduction of partial outputs that nothing consumes (a loss over split classes or
 *   split reduction dimensions);
 * - the sum of the gradients of an op's own weights beside the ones it shares (the bias
 *   of an output layer tied to the embedding) over the shards holding the same part. */
typedef enum { SYNTH_LOSS, SYNTH_WEIGHTS } SynthKind;

typedef struct {
  SynthKind kind;
  int op, mb;
  int shard;               /* SYNTH_WEIGHTS: a shard holding the part                   */
  int w0, w1;              /* SYNTH_WEIGHTS: the op's weights [w0, w1)                  */
  int *devices;            /* SYNTH_WEIGHTS: the devices holding it                     */
  int n_devices;
} Synth;

static void emit_synth(Ctx *x, int id, const Synth *s)
{
  const OpInfo *o = &x->ops[s->op];
  if (s->kind == SYNTH_WEIGHTS) {
    for (int i = s->w0; i < s->w1; i++) {
      const SimRegion *r = &o->w_reg[s->shard * o->n_w + i];
      for (int k = 0; k < s->n_devices; k++) {
        ExecView v = weight_view(x, s->op, i, s->devices[k], EXEC_BUF_WGRAD);
        emit_coll(x, EXEC_MOP_ALL_REDUCE, s->devices[k], s->devices, s->n_devices,
                  coll_tag(x->c->n_tasks + id * 1024 + i, 0), &v, r, EXEC_REDUCE_SUM);
      }
    }
    return;
  }
  int t = sim_graph_op_output(x->g, s->op, 0);
  /* One reduction per distinct region of the output, over the devices holding it. */
  GArray *done = g_array_new(FALSE, FALSE, sizeof(SimRegion));
  for (int sh = 0; sh < o->n_shards; sh++) {
    const SimRegion *r = &o->out_reg[sh * o->n_out];
    gboolean dup = FALSE;
    for (guint q = 0; q < done->len && !dup; q++)
      dup = region_equal(&g_array_index(done, SimRegion, q), r);
    if (dup)
      continue;
    g_array_append_vals(done, r, 1);
    int devs[256], n = 0;
    for (int s2 = 0; s2 < o->n_shards && n < 256; s2++)
      if (region_equal(&o->out_reg[s2 * o->n_out], r) && rank_in(devs, n, o->dev[s2]) < 0)
        devs[n++] = o->dev[s2];
    if (o->ce_split) {
      emit_ce_combine(x, -(id * 1024 + (int)done->len), s->op, s->mb, r, devs, n);
    } else if (n > 1) {
      for (int k = 0; k < n; k++) {
        ExecView v = buf_view(find_buf(x, EXEC_BUF_VALUE, devs[k], t, -1, 0, s->mb));
        emit_coll(x, EXEC_MOP_ALL_REDUCE, devs[k], devs, n,
                  coll_tag(x->c->n_tasks + id * 1024 + (int)done->len, 0), &v, r,
                  EXEC_REDUCE_SUM);
      }
    }
  }
  g_array_free(done, TRUE);
}

/* ---- the order of all tasks ------------------------------------------------------------------ */

typedef struct {
  double key;
  int id;
} HeapItem;

/* Ascending key, then id: a total order. */
static inline gboolean item_less(const HeapItem *a, const HeapItem *b)
{
  return a->key < b->key || (a->key == b->key && a->id < b->id);
}

SIM_HEAP_DEFINE(item_heap, HeapItem, item_less)

typedef struct {
  int from, to;
} Edge;

static gboolean build_programs(Ctx *x)
{
  ExecCompiled *c = x->c;
  SimPlan *p = c->plan;
  int n = c->n_tasks;

  /* The simulator's start times order the tasks where dependencies leave a choice. */
  g_autoptr(GError) sim_error = NULL;
  g_autoptr(SimReport) rep = sim_plan_simulate(p, &sim_error);
  if (!rep)
    return fail(x, EXEC_ERROR_UNSUPPORTED, "the plan cannot run: %s", sim_error->message);

  /* Compute tasks by (op, pass, mb) for the edges the executor adds. */
  GArray *edges = g_array_new(FALSE, FALSE, sizeof(Edge));
  GArray *synth = g_array_new(FALSE, FALSE, sizeof(Synth));
  GHashTable *fwd = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
  GHashTable *bwd = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                          (GDestroyNotify)g_array_unref);
  GHashTable *have_reduce = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
  GArray *ce_reduces = g_array_new(FALSE, FALSE, sizeof(int));
  GArray *syncs = g_array_new(FALSE, FALSE, sizeof(int));
  GArray **owner_tasks = g_new0(GArray *, c->n_ops);
  for (int i = 0; i < n; i++) {
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    for (int k = 0; k < sim_plan_n_successors(p, i); k++) {
      Edge e = { i, sim_plan_successor(p, i, k) };
      g_array_append_val(edges, e);
    }
    if (t.kind == SIM_PLAN_SYNC)
      g_array_append_val(syncs, i);
    if (t.kind == SIM_PLAN_COMPUTE && t.pass != SIM_PASS_FORWARD && !x->ops[t.op].is_input) {
      int owner = x->ops[t.op].owner;
      if (!owner_tasks[owner])
        owner_tasks[owner] = g_array_new(FALSE, FALSE, sizeof(int));
      g_array_append_val(owner_tasks[owner], i);
    }
    if (t.kind == SIM_PLAN_COMPUTE && t.pass == SIM_PASS_BACKWARD) {
      gint64 *key = g_new(gint64, 1);
      *key = (gint64)t.op * 65536 + t.mb;
      GArray *list = g_hash_table_lookup(bwd, key);
      if (!list) {
        list = g_array_new(FALSE, FALSE, sizeof(int));
        g_hash_table_insert(bwd, key, list);
      } else {
        g_free(key);
      }
      g_array_append_val(list, i);
    } else if (t.kind == SIM_PLAN_COMPUTE && t.pass == SIM_PASS_FORWARD && !t.recompute) {
      gint64 *key = g_new(gint64, 1);
      *key = ((gint64)t.op * 65536 + t.mb) * 1024 + t.shard;
      g_hash_table_insert(fwd, key, GINT_TO_POINTER(i + 1));
    } else if (t.kind == SIM_PLAN_REDUCE && !t.grad && t.op >= 0) {
      gint64 *key = g_new(gint64, 1);
      *key = (gint64)t.op * 65536 + t.mb;
      g_hash_table_add(have_reduce, key);
      if (x->ops[t.op].ce_split)
        g_array_append_val(ce_reduces, i);
    }
  }
  /* A synchronization sums complete gradients and precedes the updates that apply them:
   * every backward task, on the synchronized devices, of the ops using the weights
   * precedes it, and their updates there follow it.  The plan states this for the owner's
   * own groups; for a copy's exchange with the owner it orders only the copy's side. */
  for (guint k = 0; k < syncs->len; k++) {
    int i = g_array_index(syncs, int, k);
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    for (int q = 0; q < t.n_ops; q++) {
      GArray *users = owner_tasks[x->ops[t.ops[q]].owner];
      for (guint j = 0; users && j < users->len; j++) {
        int u = g_array_index(users, int, j);
        SimPlanTask ut;
        sim_plan_task(p, u, &ut);
        if (rank_in(t.devices, t.n_devices, ut.device) < 0)
          continue;
        Edge e = ut.pass == SIM_PASS_BACKWARD ? (Edge){ u, i } : (Edge){ i, u };
        g_array_append_val(edges, e);
      }
    }
  }
  /* An op's own weights beside the shared ones: summed over the shards holding the same
   * part before the op's updates there. */
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *o = &x->ops[op];
    if (o->is_input || o->n_shared == 0 || o->n_w <= o->n_shared)
      continue;
    gboolean *used = g_new0(gboolean, o->n_shards);
    for (int sh = 0; sh < o->n_shards; sh++) {
      if (used[sh])
        continue;
      Synth sy = { .kind = SYNTH_WEIGHTS, .op = op, .mb = -1, .shard = sh, .w0 = o->n_shared,
                   .w1 = o->n_w };
      sy.devices = own(c, g_new(int, o->n_shards));
      for (int s2 = sh; s2 < o->n_shards; s2++)
        if (!used[s2] && o->copy[s2] == o->copy[sh] &&
            region_equal(&o->w_reg[s2 * o->n_w + o->n_shared],
                         &o->w_reg[sh * o->n_w + o->n_shared])) {
          used[s2] = TRUE;
          if (rank_in(sy.devices, sy.n_devices, o->dev[s2]) < 0)
            sy.devices[sy.n_devices++] = o->dev[s2];
        }
      if (sy.n_devices < 2)
        continue;
      int id = n + (int)synth->len;
      g_array_append_val(synth, sy);
      GArray *users = owner_tasks[o->owner];
      for (guint j = 0; users && j < users->len; j++) {
        int u = g_array_index(users, int, j);
        SimPlanTask ut;
        sim_plan_task(p, u, &ut);
        if (ut.op != op || rank_in(sy.devices, sy.n_devices, ut.device) < 0)
          continue;
        Edge e = ut.pass == SIM_PASS_BACKWARD ? (Edge){ u, id } : (Edge){ id, u };
        g_array_append_val(edges, e);
      }
    }
    g_free(used);
  }
  for (guint k = 0; k < syncs->len; k++) {
    int i = g_array_index(syncs, int, k);
    SimPlanTask ex;
    sim_plan_task(p, i, &ex);
    for (int q = 0; q < ex.n_ops; q++) {
      int owner = x->ops[ex.ops[q]].owner;
      if (owner == ex.ops[q])
        continue;
      for (guint j = 0; j < syncs->len; j++) {
        int i2 = g_array_index(syncs, int, j);
        SimPlanTask ot;
        sim_plan_task(p, i2, &ot);
        gboolean has_owner = FALSE, touches = FALSE;
        for (int r = 0; r < ot.n_ops && !has_owner; r++)
          has_owner = ot.ops[r] == owner;
        for (int r = 0; r < ot.n_devices && !touches; r++)
          touches = rank_in(ex.devices, ex.n_devices, ot.devices[r]) >= 0;
        if (has_owner && touches && i2 != i) {
          Edge e = { i2, i };
          g_array_append_val(edges, e);
        }
      }
    }
  }
  /* Statistics combined by a reduction are read by the backward pass of the same loss. */
  for (guint k = 0; k < ce_reduces->len; k++) {
    int i = g_array_index(ce_reduces, int, k);
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    gint64 key = (gint64)t.op * 65536 + t.mb;
    GArray *list = g_hash_table_lookup(bwd, &key);
    for (guint q = 0; list && q < list->len; q++) {
      Edge e = { i, g_array_index(list, int, q) };
      g_array_append_val(edges, e);
    }
  }
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *o = &x->ops[op];
    if (o->is_input || o->n_out == 0 || !o->out_partial[0])
      continue;
    int t = sim_graph_op_output(x->g, op, 0);
    if (sim_graph_tensor_n_consumers(x->g, t) > 0)
      continue;
    for (int mb = 0; mb < c->M; mb++) {
      gint64 key = (gint64)op * 65536 + mb;
      if (g_hash_table_contains(have_reduce, &key))
        continue;
      Synth s = { .kind = SYNTH_LOSS, .op = op, .mb = mb };
      int id = n + (int)synth->len;
      g_array_append_val(synth, s);
      for (int sh = 0; sh < o->n_shards; sh++) {
        gint64 fk = key * 1024 + sh;
        int f = GPOINTER_TO_INT(g_hash_table_lookup(fwd, &fk)) - 1;
        if (f >= 0) {
          Edge e = { f, id };
          g_array_append_val(edges, e);
        }
      }
      GArray *list = g_hash_table_lookup(bwd, &key);
      for (guint q = 0; list && q < list->len; q++) {
        Edge e = { id, g_array_index(list, int, q) };
        g_array_append_val(edges, e);
      }
    }
  }
  /* Every device's stream order. */
  for (int d = 0; d < c->n_devices; d++) {
    int len = sim_plan_stream_length(p, d);
    for (int k = 1; k < len; k++) {
      Edge e = { sim_plan_stream_task(p, d, k - 1), sim_plan_stream_task(p, d, k) };
      g_array_append_val(edges, e);
    }
  }
  int total = n + (int)synth->len;
  int *indeg = g_new0(int, total);
  int *off = g_new0(int, (size_t)total + 1);
  for (guint k = 0; k < edges->len; k++) {
    Edge e = g_array_index(edges, Edge, k);
    indeg[e.to]++;
    off[e.from + 1]++;
  }
  for (int i = 0; i < total; i++)
    off[i + 1] += off[i];
  int *adj = g_new(int, MAX(edges->len, 1));
  int *pos = g_memdup2(off, sizeof(int) * (size_t)total);
  for (guint k = 0; k < edges->len; k++) {
    Edge e = g_array_index(edges, Edge, k);
    adj[pos[e.from]++] = e.to;
  }
  double *key = g_new0(double, total);
  for (int i = 0; i < n; i++) {
    SimTaskRecord rec;
    if (sim_report_record(rep, i, &rec))
      key[i] = rec.start;
  }
  for (int i = n; i < total; i++)
    key[i] = G_MAXDOUBLE;

  HeapItem *heap = NULL;
  int n_heap = 0, cap_heap = 0;
  for (int i = 0; i < total; i++)
    if (indeg[i] == 0)
      item_heap_push(&heap, &n_heap, &cap_heap, (HeapItem){ key[i], i });
  int emitted = 0;
  while (n_heap && !x->failed) {
    HeapItem it = item_heap_pop(heap, &n_heap);
    int i = it.id;
    emitted++;
    for (int k = off[i]; k < off[i + 1]; k++) {
      int j = adj[k];
      /* A synthesized step runs as soon as its inputs are ready. */
      if (j >= n && key[j] == G_MAXDOUBLE)
        key[j] = it.key;
      if (--indeg[j] == 0)
        item_heap_push(&heap, &n_heap, &cap_heap, (HeapItem){ MAX(key[j], it.key), j });
    }
    if (i >= n) {
      emit_synth(x, i - n, &g_array_index(synth, Synth, i - n));
      continue;
    }
    SimPlanTask t;
    sim_plan_task(p, i, &t);
    switch (t.kind) {
    case SIM_PLAN_COMPUTE:
      if (x->ops[t.op].is_input)
        break;
      if (t.pass == SIM_PASS_FORWARD)
        emit_forward(x, i, t.op, t.shard, t.mb, t.recompute);
      else if (t.pass == SIM_PASS_BACKWARD)
        emit_backward(x, i, t.op, t.shard, t.mb);
      else
        emit_update(x, i, t.op, t.shard);
      break;
    case SIM_PLAN_COPY:
      emit_copy(x, i, &t);
      break;
    case SIM_PLAN_REDUCE:
      emit_reduce(x, i, &t);
      break;
    case SIM_PLAN_SYNC:
      emit_sync(x, i, &t, FALSE);
      break;
    case SIM_PLAN_GATHER_PARAMS:
      emit_sync(x, i, &t, TRUE);
      break;
    case SIM_PLAN_TIMING:
    case SIM_PLAN_JOIN:
      break;
    }
  }
  if (!x->failed && emitted != total)
    fail(x, EXEC_ERROR_UNSUPPORTED, "the plan's dependencies and stream orders form a cycle "
         "(%d of %d tasks could be ordered)", emitted, total);
  g_free(heap);
  g_free(key);
  g_free(pos);
  g_free(adj);
  g_free(off);
  g_free(indeg);
  g_array_free(ce_reduces, TRUE);
  g_array_free(syncs, TRUE);
  for (int op = 0; op < c->n_ops; op++)
    if (owner_tasks[op])
      g_array_free(owner_tasks[op], TRUE);
  g_free(owner_tasks);
  g_hash_table_destroy(have_reduce);
  g_hash_table_destroy(bwd);
  g_hash_table_destroy(fwd);
  g_array_free(synth, TRUE);
  g_array_free(edges, TRUE);
  return !x->failed;
}

/* ---- weight groups, loss tensors, the prologue of a step --------------------------------------- */

static void find_groups(Ctx *x)
{
  ExecCompiled *c = x->c;
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *o = &x->ops[op];
    if (o->is_input || o->n_w == 0)
      continue;
    if (o->owner != op) {
      const OpInfo *ow = &x->ops[o->owner];
      /* Each copy (a shard on a device where the owner has none) sums its gradient with
       * one owner shard's, and both sides then with their replicas: exact when every
       * owner shard's part is tiled by the copies paired with it (one copy holding the
       * same part, as Megatron's output layer on the last stage, or copies holding
       * disjoint pieces of it), so that each element has one copy per owner replica. */
      int n_copies = 0;
      int64_t *covered = g_new0(int64_t, (size_t)ow->n_shards * MAX(o->n_shared, 1));
      gboolean exact = TRUE;
      guint first = x->sharers->len;
      for (int sh = 0; sh < o->n_shards; sh++) {
        if (op_on(ow, o->dev[sh]))
          continue;
        int osh = sh % ow->n_shards;
        n_copies++;
        for (int i = 0; i < o->n_shared && exact; i++) {
          SimRegion mine = map_to_owner(x, o, i, &o->w_reg[sh * o->n_w + i]);
          exact = sim_region_contains(&ow->w_reg[osh * ow->n_w + i], &mine);
          for (guint k = first; k < x->sharers->len && exact; k++) {
            const SharerItem *other = &g_array_index(x->sharers, SharerItem, k);
            if (other->shard % ow->n_shards != osh)
              continue;
            SimRegion theirs = map_to_owner(x, o, i, &o->w_reg[other->shard * o->n_w + i]), in;
            exact = !sim_region_intersect(&mine, &theirs, &in);
          }
          covered[osh * MAX(o->n_shared, 1) + i] += sim_region_volume(&mine);
        }
        SharerItem it = { op, sh, { ow->dev[osh], o->dev[sh] }, FALSE };
        g_array_append_val(x->sharers, it);
      }
      for (int osh = 0; osh < ow->n_shards && exact && n_copies > 0; osh++)
        for (int i = 0; i < o->n_shared && exact; i++)
          exact = covered[osh * MAX(o->n_shared, 1) + i] ==
                  sim_region_volume(&ow->w_reg[osh * ow->n_w + i]);
      g_free(covered);
      if (!exact) {
        fail(x, EXEC_ERROR_UNSUPPORTED,
             "op '%s' keeps %d cop%s of op '%s''s weights on devices without the owner, "
             "which has %d shard%s: the executor sums each copy's gradients with one owner "
             "shard, so the copies paired with each owner shard must hold disjoint pieces "
             "that make up its part",
             sim_graph_op_name(x->g, op), n_copies, n_copies == 1 ? "y" : "ies",
             sim_graph_op_name(x->g, o->owner), ow->n_shards, ow->n_shards == 1 ? "" : "s");
        return;
      }
      continue;
    }
    gboolean *used = g_new0(gboolean, o->n_shards);
    for (int sh = 0; sh < o->n_shards; sh++) {
      if (used[sh])
        continue;
      ExecWeightGroup gr = { .op = op };
      gr.members = own(c, g_new(int, o->n_shards));
      gr.devices = own(c, g_new(int, o->n_shards));
      for (int s2 = sh; s2 < o->n_shards; s2++) {
        if (used[s2] || o->copy[s2] != o->copy[sh] ||
            !region_equal(&o->w_reg[s2 * o->n_w], &o->w_reg[sh * o->n_w]))
          continue;
        used[s2] = TRUE;
        gr.members[gr.n++] = s2;
        if (rank_in(gr.devices, gr.n_devices, o->dev[s2]) < 0)
          gr.devices[gr.n_devices++] = o->dev[s2];
      }
      g_array_append_val(c->groups, gr);
    }
    g_free(used);
  }
}

static void find_losses(Ctx *x)
{
  ExecCompiled *c = x->c;
  for (int t = 0; t < c->n_tensors; t++) {
    int op = sim_graph_tensor_producer(x->g, t);
    SimOpType type = x->ops[op].type;
    if (sim_graph_tensor_n_consumers(x->g, t) > 0 ||
        (type != SIM_OP_CROSS_ENTROPY && type != SIM_OP_MSE_LOSS))
      continue;
    ExecLoss l = { t, op, 1.0 / (double)sim_shape_numel(&x->ten[t].full) };
    g_array_append_val(c->losses, l);
  }
}

static gboolean is_loss(const ExecCompiled *c, int t, double *scale)
{
  for (guint k = 0; k < c->losses->len; k++)
    if (g_array_index(c->losses, ExecLoss, k).tensor == t) {
      *scale = g_array_index(c->losses, ExecLoss, k).scale;
      return TRUE;
    }
  return FALSE;
}

/* Gradients start at zero each step (the loss's at its seed), and with poisoning the
 * activations start as NaN. */
static void emit_prologue(Ctx *x)
{
  ExecCompiled *c = x->c;
  for (guint k = 0; k < c->bufs->len; k++) {
    ExecBuf *b = c->bufs->pdata[k];
    if (!c->local[b->device])
      continue;
    ExecView v = buf_view(b);
    double scale;
    switch (b->kind) {
    case EXEC_BUF_VALUE:
      if (c->o.poison && b->dtype == SIM_DTYPE_FP32 && !x->ten[b->tensor].from_input)
        emit_fill(x, b->device, &v, &b->box, NAN);
      break;
    case EXEC_BUF_GRAD:
      emit_fill(x, b->device, &v, &b->box,
                is_loss(c, b->tensor, &scale) ? (float)scale : 0.0f);
      break;
    case EXEC_BUF_WGRAD:
      emit_fill(x, b->device, &v, &b->box, 0.0f);
      break;
    default:
      break;
    }
  }
}

/* ---- the compiler ------------------------------------------------------------------------------ */

ExecCompiled *exec_compile(ExecBackend *b, SimPlan *plan, const ExecOptions *o, GError **error)
{
  ExecCompiled *c = g_new0(ExecCompiled, 1);
  c->plan = plan;
  c->g = sim_plan_get_graph(plan);
  c->s = sim_plan_get_strategy(plan);
  c->backend = b;
  c->n_devices = sim_plan_n_devices(plan);
  c->M = sim_plan_microbatches(plan);
  c->n_ops = sim_graph_n_ops(c->g);
  c->n_tensors = sim_graph_n_tensors(c->g);
  c->batch = sim_graph_batch_size(c->g);
  c->n_tasks = sim_plan_n_tasks(plan);
  c->o = *o;
  SimMemoryOptions mo = sim_strategy_get_memory(c->s);
  c->optimizer = mo.optimizer;
  if (c->o.lr <= 0)
    c->o.lr = c->optimizer == SIM_OPTIMIZER_ADAM ? 1e-3 : 0.05;
  c->bufs = g_ptr_array_new();
  c->buf_index = g_hash_table_new_full(key_hash, key_equal, g_free, NULL);
  c->slots = g_array_new(FALSE, TRUE, sizeof(ExecWeightSlot));
  c->groups = g_array_new(FALSE, TRUE, sizeof(ExecWeightGroup));
  c->losses = g_array_new(FALSE, TRUE, sizeof(ExecLoss));
  c->owned = g_ptr_array_new_with_free_func(g_free);
  c->inputs = g_ptr_array_new();
  c->local = g_new0(gboolean, c->n_devices);
  c->programs = g_new0(ExecProgram, c->n_devices);
  for (int d = 0; d < c->n_devices; d++) {
    c->programs[d].device = d;
    c->programs[d].mops = g_array_new(FALSE, TRUE, sizeof(ExecMop));
    c->programs[d].time_task = g_array_new(FALSE, FALSE, sizeof(int));
    c->programs[d].saved = g_ptr_array_new();
  }

  Ctx x = { .c = c, .g = c->g, .error = error };
  x.boxes = g_hash_table_new_full(key_hash, key_equal, g_free, g_free);
  x.alias = g_hash_table_new_full(key_hash, key_equal, g_free, NULL);
  x.seen = g_hash_table_new_full(g_bytes_hash, g_bytes_equal, (GDestroyNotify)g_bytes_unref,
                                 NULL);
  x.sharers = g_array_new(FALSE, TRUE, sizeof(SharerItem));

  if (exec_backend_open(b, c->n_devices, error)) {
    int *devs = g_new(int, c->n_devices);
    int nl = exec_backend_local_devices(b, c->n_devices, devs);
    for (int k = 0; k < nl; k++)
      if (devs[k] >= 0 && devs[k] < c->n_devices)
        c->local[devs[k]] = TRUE;
    g_free(devs);
  } else {
    x.failed = TRUE;
  }
  if (!x.failed && describe_ops(&x) && describe_tensors(&x)) {
    plan_boxes(&x);
    if (!x.failed)
      find_aliases(&x);
    if (!x.failed)
      alloc_buffers(&x);
    if (!x.failed)
      init_weights(&x);
    x.saved = g_new0(gpointer, MAX(x.n_saved, 1));
    own(c, x.saved);
    find_groups(&x);
    find_losses(&x);
    if (!x.failed)
      emit_prologue(&x);
    if (!x.failed)
      build_programs(&x);
  }
  for (int d = 0; d < c->n_devices; d++) {
    ExecProgram *pr = &c->programs[d];
    pr->times = g_new0(double, 2 * (size_t)MAX(pr->n_times, 1));
    if (x.saved)
      for (int op = 0; x.ops && op < c->n_ops; op++) {
        const OpInfo *oi = &x.ops[op];
        if (oi->is_input)
          continue;
        for (int sh = 0; sh < oi->n_shards; sh++)
          if (oi->dev[sh] == d)
            for (int mb = 0; mb < c->M; mb++)
              g_ptr_array_add(pr->saved, &x.saved[oi->saved_base + sh * c->M + mb]);
      }
  }

  for (int op = 0; x.ops && op < c->n_ops; op++) {
    OpInfo *oi = &x.ops[op];
    g_free(oi->copy);
    g_free(oi->lo);
    g_free(oi->hi);
    g_free(oi->in_reg);
    g_free(oi->out_reg);
    g_free(oi->w_reg);
    g_free(oi->out_partial);
    g_free(oi->in_partial);
  }
  g_free(x.ops);
  g_free(x.ten);
  g_hash_table_destroy(x.boxes);
  g_hash_table_destroy(x.alias);
  g_hash_table_destroy(x.seen);
  g_array_free(x.sharers, TRUE);
  if (x.failed) {
    exec_compiled_free(c);
    return NULL;
  }
  return c;
}

void exec_compiled_free(ExecCompiled *c)
{
  if (!c)
    return;
  for (int d = 0; d < c->n_devices; d++) {
    ExecProgram *p = &c->programs[d];
    for (guint k = 0; p->saved && k < p->saved->len; k++) {
      gpointer *slot = p->saved->pdata[k];
      exec_backend_saved_free(c->backend, d, *slot);
      *slot = NULL;
    }
    if (p->saved)
      g_ptr_array_free(p->saved, TRUE);
    g_array_free(p->mops, TRUE);
    g_array_free(p->time_task, TRUE);
    g_free(p->times);
  }
  for (guint k = 0; k < c->bufs->len; k++) {
    ExecBuf *b = c->bufs->pdata[k];
    exec_backend_buffer_free(c->backend, b->device, b->buffer);
    g_free(b);
  }
  g_ptr_array_free(c->bufs, TRUE);
  g_hash_table_destroy(c->buf_index);
  g_array_free(c->slots, TRUE);
  g_array_free(c->groups, TRUE);
  g_array_free(c->losses, TRUE);
  g_ptr_array_free(c->owned, TRUE);
  g_ptr_array_free(c->inputs, TRUE);
  g_free(c->programs);
  g_free(c->local);
  g_free(c);
}
