/* strategy.c — parallelization strategies: per-operator configurations, pipeline stages,
 * micro-batches and schedules, gradient synchronization and memory options, and their
 * validation against a graph and a machine.
 *
 * A strategy does not hold its graph.  It keeps a layout (SimStrategyLayout): the names,
 * types and iteration spaces of the graph's operators, captured when the strategy is made
 * and shared by its copies.  That is enough to check a configuration in
 * sim_strategy_set_op() and to name operators in errors; sim_strategy_validate() then
 * checks the whole strategy against the graph and machine it is given. */
#include "sim-private.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------- */
/* Names of the enumerations                                                          */

static const char *const schedule_names[] = { "gpipe", "1f1b", "interleaved", NULL };
static const char *const allreduce_names[] = { "ring", "tree", "hierarchical", NULL };
static const char *const recompute_names[] = { "none", "selective", "full", NULL };
static const char *const precision_names[] = { "fp32", "mixed-fp16", "mixed-bf16", "tf32", "fp8",
                                                NULL };
static const char *const optimizer_names[] = { "sgd", "adam", NULL };

static const char *name_of(const char *const *names, int n, int v)
{
  return v >= 0 && v < n ? names[v] : "unknown";
}

static int index_of(const char *const *names, const char *name)
{
  if (!name)
    return -1;
  for (int i = 0; names[i]; i++)
    if (g_ascii_strcasecmp(names[i], name) == 0)
      return i;
  return -1;
}

const char *sim_schedule_name(SimSchedule s)
{
  return name_of(schedule_names, 3, (int)s);
}

const char *sim_allreduce_algo_name(SimAllreduceAlgo a)
{
  return name_of(allreduce_names, 3, (int)a);
}

const char *sim_recompute_name(SimRecompute r)
{
  return name_of(recompute_names, 3, (int)r);
}

const char *sim_precision_name(SimPrecision p)
{
  return name_of(precision_names, 5, (int)p);
}

const char *sim_optimizer_name(SimOptimizer o)
{
  return name_of(optimizer_names, 2, (int)o);
}

int sim_schedule_from_name(const char *name)
{
  return index_of(schedule_names, name);
}

int sim_allreduce_algo_from_name(const char *name)
{
  return index_of(allreduce_names, name);
}

int sim_recompute_from_name(const char *name)
{
  return index_of(recompute_names, name);
}

int sim_precision_from_name(const char *name)
{
  return index_of(precision_names, name);
}

int sim_optimizer_from_name(const char *name)
{
  return index_of(optimizer_names, name);
}

/* ---------------------------------------------------------------------------------- */
/* The layout: what a strategy remembers of its graph                                 */

void sim_strategy_op_info_fill(const SimGraph *g, int op, SimStrategyOpInfo *info)
{
  const SimOp *o = sim_graph_op_get(g, op);
  memset(info, 0, sizeof *info);
  info->name = o->name;
  info->type = o->type;
  info->ndims = CLAMP(o->space.ndims, 0, SIM_MAX_ITER);
  for (int d = 0; d < info->ndims; d++)
    info->dims[d] = o->space.dims[d];
}

static void layout_clear(gpointer data)
{
  SimStrategyLayout *l = data;
  g_free(l->graph_name);
  g_free(l->ops);
}

static SimStrategyLayout *layout_new(const SimGraph *g)
{
  int n_ops = sim_graph_n_ops(g);
  /* The operator names live in one block after the infos so the layout is two
   * allocations however large the graph. */
  gsize names_size = 0;
  for (int i = 0; i < n_ops; i++)
    names_size += strlen(sim_graph_op_name(g, i)) + 1;

  SimStrategyLayout *l = g_atomic_rc_box_new0(SimStrategyLayout);
  l->n_ops = n_ops;
  l->graph_name = g_strdup(sim_graph_get_name(g));
  l->batch = sim_graph_batch_size(g);
  gsize infos_size = sizeof(SimStrategyOpInfo) * (gsize)n_ops;
  l->ops = g_malloc0(infos_size + names_size + 1);
  char *names = (char *)l->ops + infos_size;
  for (int i = 0; i < n_ops; i++) {
    sim_strategy_op_info_fill(g, i, &l->ops[i]);
    const char *name = sim_graph_op_name(g, i);
    size_t len = strlen(name);
    memcpy(names, name, len + 1);
    l->ops[i].name = names;
    names += len + 1;
  }
  return l;
}

static void layout_unref(SimStrategyLayout *l)
{
  if (l)
    g_atomic_rc_box_release_full(l, layout_clear);
}

/* ---------------------------------------------------------------------------------- */
/* Lifecycle                                                                          */

static void config_set_single(SimOpConfig *c, int device)
{
  for (int d = 0; d < SIM_MAX_ITER; d++)
    c->degree[d] = 1;
  c->n_shards = 1;
  c->replicas = 1;
  g_free(c->devices);
  c->devices = g_new(int, 1);
  c->devices[0] = device;
}

SimStrategy *sim_strategy_new(const SimGraph *g, const SimMachine *m)
{
  g_return_val_if_fail(g != NULL, NULL);
  g_return_val_if_fail(m != NULL, NULL);

  SimStrategy *s = g_new0(SimStrategy, 1);
  s->layout = layout_new(g);
  s->n_ops = s->layout->n_ops;
  s->n_devices = sim_machine_n_devices(m);
  s->ops = g_new0(SimOpConfig, MAX(s->n_ops, 1));
  for (int i = 0; i < s->n_ops; i++)
    config_set_single(&s->ops[i], 0);

  s->n_stages = 1;
  s->op_stage = g_new0(int, MAX(s->n_ops, 1));
  s->stage_devices = g_new0(int *, 1);
  s->stage_devices[0] = g_new0(int, 1);
  s->stage_n_devices = g_new(int, 1);
  s->stage_n_devices[0] = 1;

  s->microbatches = 1;
  s->schedule = SIM_SCHEDULE_1F1B;
  s->chunks = 1;
  s->sync = (SimSyncOptions){ .algorithm = SIM_ALLREDUCE_RING, .bucket_bytes = 0,
                              .overlap = TRUE };
  s->memory = (SimMemoryOptions){ .recompute = SIM_RECOMPUTE_NONE, .zero1 = FALSE,
                                  .precision = SIM_PRECISION_FP32,
                                  .optimizer = SIM_OPTIMIZER_ADAM };
  s->sequence_parallel = FALSE;
  s->scatter_gather = FALSE;
  s->tp_comm_overlap = FALSE;
  s->tp_overlap = sim_tp_overlap_default();
  s->cp = 1;
  s->rewrites = g_ptr_array_new_with_free_func(g_free);
  return s;
}

static void stages_free(SimStrategy *s)
{
  for (int i = 0; i < s->n_stages; i++)
    g_free(s->stage_devices[i]);
  g_clear_pointer(&s->stage_devices, g_free);
  g_clear_pointer(&s->stage_n_devices, g_free);
  s->n_stages = 0;
}

void sim_strategy_free(SimStrategy *s)
{
  if (!s)
    return;
  for (int i = 0; i < s->n_ops; i++)
    g_free(s->ops[i].devices);
  g_free(s->ops);
  g_free(s->op_stage);
  stages_free(s);
  g_clear_pointer(&s->rewrites, g_ptr_array_unref);
  layout_unref(s->layout);
  g_free(s);
}

SimStrategy *sim_strategy_copy(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, NULL);

  SimStrategy *c = g_new0(SimStrategy, 1);
  *c = *s;
  c->layout = s->layout ? g_atomic_rc_box_acquire(s->layout) : NULL;
  c->ops = g_new0(SimOpConfig, MAX(s->n_ops, 1));
  for (int i = 0; i < s->n_ops; i++) {
    c->ops[i] = s->ops[i];
    c->ops[i].devices = g_memdup2(s->ops[i].devices, sizeof(int) * (gsize)s->ops[i].n_shards);
  }
  c->op_stage = g_memdup2(s->op_stage, sizeof(int) * (gsize)MAX(s->n_ops, 1));
  c->stage_devices = g_new0(int *, s->n_stages);
  c->stage_n_devices = g_memdup2(s->stage_n_devices, sizeof(int) * (gsize)s->n_stages);
  for (int i = 0; i < s->n_stages; i++)
    c->stage_devices[i] = g_memdup2(s->stage_devices[i],
                                    sizeof(int) * (gsize)s->stage_n_devices[i]);
  c->rewrites = g_ptr_array_new_with_free_func(g_free);
  for (guint i = 0; s->rewrites && i < s->rewrites->len; i++)
    g_ptr_array_add(c->rewrites, g_strdup(g_ptr_array_index(s->rewrites, i)));
  return c;
}

static gboolean ints_equal(const int *a, const int *b, int n)
{
  return n <= 0 || memcmp(a, b, sizeof(int) * (size_t)n) == 0;
}

gboolean sim_strategy_equal(const SimStrategy *a, const SimStrategy *b)
{
  g_return_val_if_fail(a != NULL && b != NULL, FALSE);

  if (a->n_ops != b->n_ops || a->n_devices != b->n_devices || a->n_stages != b->n_stages ||
      a->microbatches != b->microbatches || a->schedule != b->schedule ||
      a->chunks != b->chunks || a->sequence_parallel != b->sequence_parallel ||
      !a->scatter_gather != !b->scatter_gather || !a->tp_comm_overlap != !b->tp_comm_overlap ||
      MAX(a->cp, 1) != MAX(b->cp, 1) ||
      memcmp(&a->tp_overlap, &b->tp_overlap, sizeof a->tp_overlap))
    return FALSE;
  if (a->sync.algorithm != b->sync.algorithm || a->sync.bucket_bytes != b->sync.bucket_bytes ||
      !a->sync.overlap != !b->sync.overlap)
    return FALSE;
  if (a->memory.recompute != b->memory.recompute || !a->memory.zero1 != !b->memory.zero1 ||
      !a->memory.zero2 != !b->memory.zero2 || !a->memory.zero3 != !b->memory.zero3 ||
      a->memory.precision != b->memory.precision || a->memory.optimizer != b->memory.optimizer ||
      a->memory.offload != b->memory.offload ||
      !a->memory.offload_overlap != !b->memory.offload_overlap)
    return FALSE;
  for (int i = 0; i < a->n_ops; i++) {
    const SimOpConfig *x = &a->ops[i], *y = &b->ops[i];
    if (x->n_shards != y->n_shards || MAX(x->replicas, 1) != MAX(y->replicas, 1) ||
        !ints_equal(x->degree, y->degree, SIM_MAX_ITER) ||
        !ints_equal(x->devices, y->devices, x->n_shards))
      return FALSE;
  }
  if (!ints_equal(a->op_stage, b->op_stage, a->n_ops))
    return FALSE;
  for (int i = 0; i < a->n_stages; i++)
    if (a->stage_n_devices[i] != b->stage_n_devices[i] ||
        !ints_equal(a->stage_devices[i], b->stage_devices[i], a->stage_n_devices[i]))
      return FALSE;
  guint na = a->rewrites ? a->rewrites->len : 0, nb = b->rewrites ? b->rewrites->len : 0;
  if (na != nb)
    return FALSE;
  for (guint i = 0; i < na; i++)
    if (g_strcmp0(g_ptr_array_index(a->rewrites, i), g_ptr_array_index(b->rewrites, i)) != 0)
      return FALSE;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Per-operator configurations                                                        */

static void op_error(GError **error, int code, const SimStrategyOpInfo *info, const char *fmt,
                     ...) G_GNUC_PRINTF(4, 5);

static void op_error(GError **error, int code, const SimStrategyOpInfo *info, const char *fmt,
                     ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_set_error(error, SIM_ERROR, code, "op '%s' (%s): %s", info->name,
              sim_op_type_name(info->type), msg);
}

gboolean sim_strategy_check_config(const SimStrategyOpInfo *info, const SimOpConfig *c,
                                   int microbatches, int n_devices, char **where,
                                   GError **error)
{
  if (where)
    *where = NULL;
  int64_t product = 1;
  for (int d = 0; d < SIM_MAX_ITER; d++) {
    int k = c->degree[d];
    if (d >= info->ndims) {
      if (k != 1) {
        if (where)
          *where = g_strdup_printf("degrees[%d]", d);
        op_error(error, SIM_ERROR_INVALID, info,
                 "degree %d on dimension %d, but the operator has %d dimensions", k, d,
                 info->ndims);
        return FALSE;
      }
      continue;
    }
    const SimIterDim *dim = &info->dims[d];
    if (where)
      *where = g_strdup_printf("degrees.%s", dim->name);
    if (k < 1) {
      op_error(error, SIM_ERROR_INVALID, info, "degree %d on dimension '%s' is not positive",
               k, dim->name);
      return FALSE;
    }
    if (k > 1 && !dim->splittable) {
      op_error(error, SIM_ERROR_INVALID, info,
               "degree %d on dimension '%s', which cannot be split", k, dim->name);
      return FALSE;
    }
    if (d == 0 && microbatches > 1) {
      /* The lowering runs one micro-batch at a time, so the sample dimension is split
       * into micro-batches first and the degree divides what one micro-batch holds. */
      if (dim->size % microbatches != 0) {
        op_error(error, SIM_ERROR_INVALID, info,
                 "its sample dimension '%s' of size %" G_GINT64_FORMAT
                 " does not split into %d micro-batches",
                 dim->name, dim->size, microbatches);
        return FALSE;
      }
      int64_t per = dim->size / microbatches;
      if (per % k != 0) {
        op_error(error, SIM_ERROR_INVALID, info,
                 "degree %d on dimension '%s' does not divide its size %" G_GINT64_FORMAT
                 " per micro-batch (%" G_GINT64_FORMAT " in %d micro-batches)",
                 k, dim->name, per, dim->size, microbatches);
        return FALSE;
      }
    } else if (dim->size % k != 0) {
      op_error(error, SIM_ERROR_INVALID, info,
               "degree %d on dimension '%s' does not divide its size %" G_GINT64_FORMAT, k,
               dim->name, dim->size);
      return FALSE;
    }
    product *= k;
    if (where)
      g_clear_pointer(where, g_free);
  }
  if (c->replicas < 0) {
    if (where)
      *where = g_strdup("replicas");
    op_error(error, SIM_ERROR_INVALID, info, "%d replicas is not a number of copies",
             c->replicas);
    return FALSE;
  }
  int reps = MAX(c->replicas, 1);
  if (product * reps != c->n_shards) {
    if (where)
      *where = g_strdup("devices");
    if (reps > 1)
      op_error(error, SIM_ERROR_INVALID, info,
               "%d devices for %" G_GINT64_FORMAT " shards (the product of the degrees) x %d "
               "replicas", c->n_shards, product, reps);
    else
      op_error(error, SIM_ERROR_INVALID, info,
               "%d devices for %" G_GINT64_FORMAT " shards (the product of the degrees)",
               c->n_shards, product);
    return FALSE;
  }
  for (int i = 0; i < c->n_shards; i++) {
    if (c->devices[i] < 0 || c->devices[i] >= n_devices) {
      if (where)
        *where = g_strdup_printf("devices[%d]", i);
      op_error(error, SIM_ERROR_INVALID, info,
               "shard %d on device %d, but the machine has devices 0..%d", i, c->devices[i],
               n_devices - 1);
      return FALSE;
    }
    /* Two copies of one shard on one device would compute it twice for nothing. */
    for (int j = i - i % reps; j < i; j++) {
      if (c->devices[j] == c->devices[i]) {
        if (where)
          *where = g_strdup_printf("devices[%d]", i);
        op_error(error, SIM_ERROR_INVALID, info,
                 "copies %d and %d of shard %d are both on device %d", j % reps, i % reps,
                 i / reps, c->devices[i]);
        return FALSE;
      }
    }
  }
  return TRUE;
}

/* Two shards of one operator may share a device: the device then runs both, one after the
 * other.  That is how a strategy expresses, say, eight shards on four devices.  Copies of
 * one replicated shard, on the other hand, sit on distinct devices. */
gboolean sim_strategy_set_op(SimStrategy *s, int op, const int *degrees, const int *devices,
                             GError **error)
{
  return sim_strategy_set_op_replicated(s, op, degrees, 1, devices, error);
}

gboolean sim_strategy_set_op_replicated(SimStrategy *s, int op, const int *degrees,
                                        int replicas, const int *devices, GError **error)
{
  g_return_val_if_fail(s != NULL && s->layout != NULL, FALSE);
  g_return_val_if_fail(op >= 0 && op < s->n_ops, FALSE);
  g_return_val_if_fail(degrees != NULL && devices != NULL, FALSE);

  const SimStrategyOpInfo *info = &s->layout->ops[op];
  if (replicas < 1) {
    op_error(error, SIM_ERROR_INVALID, info, "%d replicas: at least one copy needed",
             replicas);
    return FALSE;
  }
  SimOpConfig c = { .n_shards = 1, .replicas = replicas };
  for (int d = 0; d < SIM_MAX_ITER; d++) {
    c.degree[d] = d < info->ndims ? degrees[d] : 1;
    if (c.degree[d] < 1) {
      op_error(error, SIM_ERROR_INVALID, info, "degree %d on dimension '%s' is not positive",
               c.degree[d], info->dims[d].name);
      return FALSE;
    }
    /* Saturate rather than overflow on absurd degrees; the check below rejects them. */
    c.n_shards = (int)MIN((int64_t)c.n_shards * c.degree[d], (int64_t)G_MAXINT / 2);
  }
  c.n_shards = (int)MIN((int64_t)c.n_shards * replicas, (int64_t)G_MAXINT / 2);
  c.devices = (int *)devices;
  /* The sample dimension is checked against the whole batch here, since the number of
   * micro-batches may still change; sim_strategy_validate() checks it per micro-batch. */
  if (!sim_strategy_check_config(info, &c, 1, s->n_devices, NULL, error))
    return FALSE;

  SimOpConfig *dst = &s->ops[op];
  if (dst->n_shards != c.n_shards) {
    g_free(dst->devices);
    dst->devices = g_new(int, c.n_shards);
  }
  memcpy(dst->degree, c.degree, sizeof c.degree);
  dst->n_shards = c.n_shards;
  dst->replicas = replicas;
  memcpy(dst->devices, devices, sizeof(int) * (size_t)c.n_shards);
  return TRUE;
}

const int *sim_strategy_op_degrees(const SimStrategy *s, int op)
{
  g_return_val_if_fail(s != NULL && op >= 0 && op < s->n_ops, NULL);
  return s->ops[op].degree;
}

const int *sim_strategy_op_devices(const SimStrategy *s, int op, int *n)
{
  g_return_val_if_fail(s != NULL && op >= 0 && op < s->n_ops, NULL);
  if (n)
    *n = s->ops[op].n_shards;
  return s->ops[op].devices;
}

int sim_strategy_op_n_shards(const SimStrategy *s, int op)
{
  g_return_val_if_fail(s != NULL && op >= 0 && op < s->n_ops, 0);
  return s->ops[op].n_shards;
}

int sim_strategy_op_replicas(const SimStrategy *s, int op)
{
  g_return_val_if_fail(s != NULL && op >= 0 && op < s->n_ops, 0);
  return MAX(s->ops[op].replicas, 1);
}

/* @shard counts shard coordinates, not copies: with replicas, entry i of the device list
 * holds coordinates i / replicas. */
void sim_config_shard_coords(const SimOpConfig *c, int ndims, int shard, int *coords)
{
  for (int d = ndims - 1; d >= 0; d--) {
    int k = MAX(c->degree[d], 1);
    coords[d] = shard % k;
    shard /= k;
  }
}

void sim_config_shard_range(const SimOp *op, const SimOpConfig *c, const int *coords,
                            int microbatches, int64_t *lo, int64_t *hi)
{
  for (int d = 0; d < op->space.ndims; d++) {
    int64_t size = op->space.dims[d].size;
    if (d == 0 && microbatches > 1)
      size /= microbatches;
    int64_t k = MAX(c->degree[d], 1);
    lo[d] = coords[d] * size / k;
    hi[d] = (coords[d] + 1) * size / k;
  }
}

/* ---------------------------------------------------------------------------------- */
/* Pipeline stages, micro-batches and schedules                                      */

gboolean sim_strategy_set_stages(SimStrategy *s, int n_stages, const int *op_stage,
                                 const int *const *stage_devices, const int *stage_n_devices,
                                 GError **error)
{
  g_return_val_if_fail(s != NULL, FALSE);
  g_return_val_if_fail(op_stage != NULL || s->n_ops == 0, FALSE);
  g_return_val_if_fail(stage_devices != NULL && stage_n_devices != NULL, FALSE);

  if (n_stages < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "%d pipeline stages: at least one needed",
                n_stages);
    return FALSE;
  }
  for (int i = 0; i < s->n_ops; i++) {
    if (op_stage[i] < 0 || op_stage[i] >= n_stages) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "op '%s' is in stage %d, but there are stages 0..%d",
                  s->layout ? s->layout->ops[i].name : "?", op_stage[i], n_stages - 1);
      return FALSE;
    }
  }
  for (int st = 0; st < n_stages; st++) {
    if (stage_n_devices[st] < 1) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "stage %d has no devices", st);
      return FALSE;
    }
    for (int j = 0; j < stage_n_devices[st]; j++) {
      int dev = stage_devices[st][j];
      if (dev < 0 || dev >= s->n_devices) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "stage %d: device %d, but the machine has devices 0..%d", st, dev,
                    s->n_devices - 1);
        return FALSE;
      }
      for (int k = 0; k < j; k++) {
        if (stage_devices[st][k] == dev) {
          g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                      "stage %d lists device %d twice", st, dev);
          return FALSE;
        }
      }
    }
  }

  stages_free(s);
  s->n_stages = n_stages;
  memcpy(s->op_stage, op_stage, sizeof(int) * (size_t)s->n_ops);
  s->stage_devices = g_new0(int *, n_stages);
  s->stage_n_devices = g_memdup2(stage_n_devices, sizeof(int) * (gsize)n_stages);
  for (int st = 0; st < n_stages; st++)
    s->stage_devices[st] = g_memdup2(stage_devices[st],
                                     sizeof(int) * (gsize)stage_n_devices[st]);
  return TRUE;
}

int sim_strategy_n_stages(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return s->n_stages;
}

int sim_strategy_op_stage(const SimStrategy *s, int op)
{
  g_return_val_if_fail(s != NULL && op >= 0 && op < s->n_ops, -1);
  return s->op_stage[op];
}

void sim_strategy_set_microbatches(SimStrategy *s, int n)
{
  g_return_if_fail(s != NULL);
  g_return_if_fail(n >= 1);
  s->microbatches = n;
}

int sim_strategy_get_microbatches(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return s->microbatches;
}

/* @chunks only means something to the interleaved schedule; the others keep 1 so that two
 * strategies that schedule alike compare equal and write the same file. */
void sim_strategy_set_schedule(SimStrategy *s, SimSchedule sched, int chunks)
{
  g_return_if_fail(s != NULL);
  g_return_if_fail(sched >= SIM_SCHEDULE_GPIPE && sched <= SIM_SCHEDULE_INTERLEAVED);
  g_return_if_fail(chunks >= 1);
  s->schedule = sched;
  s->chunks = sched == SIM_SCHEDULE_INTERLEAVED ? chunks : 1;
}

SimSchedule sim_strategy_get_schedule(const SimStrategy *s, int *chunks)
{
  g_return_val_if_fail(s != NULL, SIM_SCHEDULE_1F1B);
  if (chunks)
    *chunks = s->chunks;
  return s->schedule;
}

/* ---------------------------------------------------------------------------------- */
/* Synchronization, memory and other options                                         */

void sim_strategy_set_sync(SimStrategy *s, const SimSyncOptions *o)
{
  g_return_if_fail(s != NULL && o != NULL);
  g_return_if_fail(o->bucket_bytes >= 0);
  s->sync = *o;
  s->sync.overlap = !!o->overlap;
}

SimSyncOptions sim_strategy_get_sync(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, (SimSyncOptions){ 0 });
  return s->sync;
}

void sim_strategy_set_memory(SimStrategy *s, const SimMemoryOptions *o)
{
  g_return_if_fail(s != NULL && o != NULL);
  s->memory = *o;
  /* ZeRO-2 shards what ZeRO-1 does, and more; ZeRO-3 what ZeRO-2 does, and more. */
  s->memory.zero3 = !!o->zero3;
  s->memory.zero2 = !!o->zero2 || s->memory.zero3;
  s->memory.zero1 = !!o->zero1 || s->memory.zero2;
  s->memory.offload = o->offload > 0 ? MIN(o->offload, 1.0) : 0;
  s->memory.offload_overlap = s->memory.offload > 0 && o->offload_overlap;
}

SimMemoryOptions sim_strategy_get_memory(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, (SimMemoryOptions){ 0 });
  return s->memory;
}

void sim_strategy_set_sequence_parallel(SimStrategy *s, gboolean on)
{
  g_return_if_fail(s != NULL);
  s->sequence_parallel = !!on;
}

gboolean sim_strategy_get_sequence_parallel(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, FALSE);
  return s->sequence_parallel;
}

void sim_strategy_set_scatter_gather(SimStrategy *s, gboolean on)
{
  g_return_if_fail(s != NULL);
  s->scatter_gather = !!on;
}

void sim_strategy_set_context_parallel(SimStrategy *s, int cp)
{
  g_return_if_fail(s != NULL && cp >= 0);
  s->cp = MAX(cp, 1);
}

int sim_strategy_get_context_parallel(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, 1);
  return MAX(s->cp, 1);
}

gboolean sim_strategy_get_scatter_gather(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, FALSE);
  return s->scatter_gather;
}

void sim_strategy_set_tp_comm_overlap(SimStrategy *s, gboolean on)
{
  g_return_if_fail(s != NULL);
  s->tp_comm_overlap = !!on;
}

gboolean sim_strategy_get_tp_comm_overlap(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, FALSE);
  return s->tp_comm_overlap;
}

/* NeMo's userbuffers configuration for LLaMA-class models of hidden size 8192 at TP 4 on
 * H100 (docs/llm.md names it): proj_fprop takes 24 SMs, fc2_fprop 16; the chunks are the
 * tensor-parallel degree (its 4 splits at TP 4). */
SimTpOverlap sim_tp_overlap_default(void)
{
  return (SimTpOverlap){ .chunks = 0, .sms_attention = 24, .sms_other = 16 };
}

void sim_strategy_set_tp_overlap(SimStrategy *s, const SimTpOverlap *p)
{
  g_return_if_fail(s != NULL && p != NULL);
  g_return_if_fail(p->chunks >= 0 && p->sms_attention >= 0 && p->sms_other >= 0);
  s->tp_overlap = *p;
}

SimTpOverlap sim_strategy_get_tp_overlap(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, sim_tp_overlap_default());
  return s->tp_overlap;
}

void sim_strategy_add_rewrite(SimStrategy *s, const char *name)
{
  g_return_if_fail(s != NULL && name != NULL);
  g_ptr_array_add(s->rewrites, g_strdup(name));
}

int sim_strategy_n_rewrites(const SimStrategy *s)
{
  g_return_val_if_fail(s != NULL, 0);
  return (int)s->rewrites->len;
}

const char *sim_strategy_rewrite(const SimStrategy *s, int i)
{
  g_return_val_if_fail(s != NULL && i >= 0 && i < (int)s->rewrites->len, NULL);
  return g_ptr_array_index(s->rewrites, i);
}

void sim_strategy_clear_rewrites(SimStrategy *s)
{
  g_return_if_fail(s != NULL);
  g_ptr_array_set_size(s->rewrites, 0);
}

/* ---------------------------------------------------------------------------------- */
/* Validation                                                                         */

/* Stage device groups as sorted sets, to compare and intersect them. */
static int *sorted_group(const SimStrategy *s, int st)
{
  int *v = g_memdup2(s->stage_devices[st], sizeof(int) * (gsize)s->stage_n_devices[st]);
  qsort(v, (size_t)s->stage_n_devices[st], sizeof(int), sim_int_cmp);
  return v;
}

static gboolean sorted_disjoint(const int *a, int na, const int *b, int nb, int *common)
{
  int i = 0, j = 0;
  while (i < na && j < nb) {
    if (a[i] == b[j]) {
      *common = a[i];
      return FALSE;
    }
    if (a[i] < b[j])
      i++;
    else
      j++;
  }
  return TRUE;
}

/* Shard @k of op @op runs on device @dev, outside stage @st's devices: FALSE, and why. */
static gboolean not_in_stage(const SimGraph *g, int op, int k, int dev, int st, GError **error)
{
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "op '%s' (%s): shard %d on device %d, which is not in the device group of its "
              "stage %d",
              sim_graph_op_name(g, op), sim_op_type_name(sim_graph_op_type(g, op)), k, dev, st);
  return FALSE;
}

static gboolean validate_stages(const SimStrategy *s, const SimGraph *g, int n_devices,
                                GError **error)
{
  if (s->n_stages < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "the strategy has no pipeline stage");
    return FALSE;
  }
  for (int st = 0; st < s->n_stages; st++) {
    if (s->stage_n_devices[st] < 1) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "stage %d has no devices", st);
      return FALSE;
    }
    for (int j = 0; j < s->stage_n_devices[st]; j++) {
      int dev = s->stage_devices[st][j];
      if (dev < 0 || dev >= n_devices) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "stage %d: device %d, but the machine has devices 0..%d", st, dev,
                    n_devices - 1);
        return FALSE;
      }
    }
  }

  g_autofree int *ops_in_stage = g_new0(int, s->n_stages);
  for (int i = 0; i < s->n_ops; i++) {
    int st = s->op_stage[i];
    if (st < 0 || st >= s->n_stages) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "op '%s' (%s) is in stage %d, but there are stages 0..%d",
                  sim_graph_op_name(g, i), sim_op_type_name(sim_graph_op_type(g, i)), st,
                  s->n_stages - 1);
      return FALSE;
    }
    ops_in_stage[st]++;
  }
  for (int st = 0; st < s->n_stages; st++) {
    if (ops_in_stage[st] == 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "stage %d has no operators", st);
      return FALSE;
    }
  }

  /* Activations flow forward through the pipeline: a consumer never sits in an earlier
   * stage than its producer, or the schedule would deadlock waiting for it. */
  for (int i = 0; i < s->n_ops; i++) {
    for (int j = 0; j < sim_graph_op_n_inputs(g, i); j++) {
      int p = sim_graph_tensor_producer(g, sim_graph_op_input(g, i, j));
      if (p >= 0 && s->op_stage[p] > s->op_stage[i]) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "op '%s' (%s) in stage %d consumes the output of op '%s' in the later "
                    "stage %d",
                    sim_graph_op_name(g, i), sim_op_type_name(sim_graph_op_type(g, i)),
                    s->op_stage[i], sim_graph_op_name(g, p), s->op_stage[p]);
        return FALSE;
      }
    }
  }

  /* Each op's shards run on its stage's devices. */
  g_autoptr(GPtrArray) groups = g_ptr_array_new_with_free_func(g_free);
  for (int st = 0; st < s->n_stages; st++)
    g_ptr_array_add(groups, sorted_group(s, st));
  for (int i = 0; i < s->n_ops; i++) {
    int st = s->op_stage[i];
    const int *grp = g_ptr_array_index(groups, st);
    for (int k = 0; k < s->ops[i].n_shards; k++) {
      int dev = s->ops[i].devices[k];
      if (!bsearch(&dev, grp, (size_t)s->stage_n_devices[st], sizeof(int), sim_int_cmp))
        return not_in_stage(g, i, k, dev, st, error);
    }
  }

  /* The schedules: GPipe and 1F1B run every stage on its own devices; interleaved 1F1B
   * gives each device group several model chunks, stage i on group i % (n_stages/chunks). */
  int n_groups = s->n_stages;
  if (s->schedule == SIM_SCHEDULE_INTERLEAVED) {
    if (s->chunks < 1 || s->n_stages % s->chunks != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "the interleaved schedule needs the %d stages to be a multiple of the %d "
                  "model chunks per device group",
                  s->n_stages, s->chunks);
      return FALSE;
    }
    n_groups = s->n_stages / s->chunks;
    /* Megatron's interleaved schedule sends micro-batches through the device groups in
     * rounds of one per group (Narayanan et al. 2021, section 2.2.2). */
    if (s->chunks > 1 && s->microbatches % n_groups != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "the interleaved schedule needs the %d micro-batches to be a multiple of "
                  "the %d device groups of the pipeline",
                  s->microbatches, n_groups);
      return FALSE;
    }
    for (int st = n_groups; st < s->n_stages; st++) {
      int base = st % n_groups;
      if (s->stage_n_devices[st] != s->stage_n_devices[base] ||
          !ints_equal(g_ptr_array_index(groups, st), g_ptr_array_index(groups, base),
                      s->stage_n_devices[st])) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "interleaved schedule with %d chunks: stage %d must run on the devices "
                    "of stage %d",
                    s->chunks, st, base);
        return FALSE;
      }
    }
  } else if (s->chunks != 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "%d model chunks per device group, but only the interleaved schedule has "
                "more than one",
                s->chunks);
    return FALSE;
  }
  for (int a = 0; a < n_groups; a++) {
    for (int b = a + 1; b < n_groups; b++) {
      int common = -1;
      if (!sorted_disjoint(g_ptr_array_index(groups, a), s->stage_n_devices[a],
                           g_ptr_array_index(groups, b), s->stage_n_devices[b], &common)) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "stages %d and %d share device %d; with the %s schedule every stage "
                    "needs its own devices",
                    a, b, common, sim_schedule_name(s->schedule));
        return FALSE;
      }
    }
  }
  return TRUE;
}

/* What a configuration cannot mean whatever the degrees: a split reduction yields partial
 * sums, to which a fused nonlinear activation cannot apply (sim_op_fused_nonlinear());
 * and an operator that moves the sample dimension away from dimension 0 of its output (a
 * reshape or transpose) cannot keep micro-batches apart. */
static gboolean check_semantics(const SimGraph *g, int op, const SimOpConfig *c, int microbatches,
                                GError **error)
{
  const SimOp *o = sim_graph_op_get(g, op);
  const SimOpClass *klass = sim_op_class(o->type);
  const SimAttrValue *act = NULL;
  for (int k = 0; k < klass->n_attrs; k++)
    if (!strcmp(klass->attrs[k].name, "activation"))
      act = &o->attrs[k];
  if (sim_op_fused_nonlinear(o))
    for (int d = 0; d < o->space.ndims; d++) {
      if (c->degree[d] <= 1 || o->space.dims[d].role != SIM_ROLE_REDUCTION)
        continue;
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "op '%s' (%s): degree %d on reduction dimension '%s' leaves partial sums, "
                  "which its fused %s activation cannot take; unfuse the activation or keep "
                  "the dimension whole",
                  o->name, sim_op_type_name(o->type), c->degree[d], o->space.dims[d].name,
                  act && act->i[0] != SIM_UNARY_IDENTITY
                    ? sim_unary_kind_name((SimUnaryKind)act->i[0])
                    : "relu");
      return FALSE;
    }
  if (microbatches > 1 && (o->type == SIM_OP_RESHAPE || o->type == SIM_OP_TRANSPOSE)) {
    const SimTensorMap *out = sim_space_output_map(o, 0);
    const SimTensorMap *in = sim_space_input_map(o, 0);
    if (out->map[0].dim != 0 || in->map[0].dim != 0) {
      g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                  "op '%s' (%s) moves the sample dimension, so its input and output cannot be "
                  "split into the same %d micro-batches",
                  o->name, sim_op_type_name(o->type), microbatches);
      return FALSE;
    }
  }
  return TRUE;
}

/* Operator @i's configuration: its degrees, devices and what its type allows. */
static gboolean validate_op(const SimStrategy *s, const SimGraph *g, int n_devices, int i,
                            GError **error)
{
  SimStrategyOpInfo info;
  sim_strategy_op_info_fill(g, i, &info);
  return sim_strategy_check_config(&info, &s->ops[i], s->microbatches, n_devices, NULL, error) &&
         check_semantics(g, i, &s->ops[i], s->microbatches, error);
}

gboolean sim_strategy_validate(const SimStrategy *s, const SimGraph *g, const SimMachine *m,
                               GError **error)
{
  g_return_val_if_fail(s != NULL && g != NULL && m != NULL, FALSE);

  int n_ops = sim_graph_n_ops(g);
  int n_devices = sim_machine_n_devices(m);
  if (s->n_ops != n_ops) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the strategy configures %d operators, but model '%s' has %d", s->n_ops,
                sim_graph_get_name(g), n_ops);
    return FALSE;
  }
  if (s->microbatches < 1) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "%d micro-batches: at least one needed",
                s->microbatches);
    return FALSE;
  }
  int64_t batch = sim_graph_batch_size(g);
  if (batch > 0 && batch % s->microbatches != 0) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the batch of %" G_GINT64_FORMAT " samples does not split into %d micro-batches",
                batch, s->microbatches);
    return FALSE;
  }
  for (int i = 0; i < n_ops; i++)
    if (!validate_op(s, g, n_devices, i, error))
      return FALSE;
  return validate_stages(s, g, n_devices, error);
}

gboolean sim_strategy_validate_op(const SimStrategy *s, const SimGraph *g, const SimMachine *m,
                                  int op, GError **error)
{
  g_return_val_if_fail(s != NULL && g != NULL && m != NULL, FALSE);
  g_return_val_if_fail(op >= 0 && op < s->n_ops, FALSE);
  int n_devices = sim_machine_n_devices(m);
  if (!validate_op(s, g, n_devices, op, error))
    return FALSE;
  /* The rest of the strategy was valid and a change to one operator moves no operator
   * between stages: what is left to check is that its shards run on its stage's devices
   * (validate_stages() says the same of every operator). */
  int st = s->op_stage[op];
  if (st < 0 || st >= s->n_stages)
    return validate_stages(s, g, n_devices, error);
  g_autofree uint8_t *in_stage = g_new0(uint8_t, MAX(n_devices, 1));
  for (int j = 0; j < s->stage_n_devices[st]; j++) {
    int dev = s->stage_devices[st][j];
    if (dev >= 0 && dev < n_devices)
      in_stage[dev] = 1;
  }
  for (int k = 0; k < s->ops[op].n_shards; k++) {
    int dev = s->ops[op].devices[k];
    if (dev < 0 || dev >= n_devices || !in_stage[dev])
      return not_in_stage(g, op, k, dev, st, error);
  }
  return TRUE;
}
