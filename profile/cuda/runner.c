/* runner.c — the CUDA runner: measures operator shards with the executor's CUDA
 * operator library (gpu/parasol-cuda.h), timed by CUDA events on one stream.
 *
 * prepare() gives every tensor of the shard its own dense device buffer over the shard's
 * region, filled with deterministic values in [-1, 1) (ids and labels within their
 * ranges), and runs the forward pass once so that a backward pass has the state it
 * keeps.  A shard smaller than the GPU's L2 cache gets several such sets of buffers, used
 * in turn, so that a run does not find the previous run's data in the cache, as it would
 * not inside a training step (METHOD.md, "Time properly").  A run is one operator call
 * between two events; the events of a batch of runs are read after the batch, so the
 * host never stalls the stream between runs. */
#include "../profile-private.h"
#include "cuda-desc.h"

#include <string.h>

/* The GPU library's errors (PCU_ERROR) as the profiler's, with the same codes: the
 * profile command moves on past a device or memory error (cli/cmd-profile.c). */
static void profile_error_from_gpu(GError **error, GError *e)
{
  int code = e->code == PCU_ERROR_NO_MEMORY     ? PROFILE_ERROR_NO_MEMORY
             : e->code == PCU_ERROR_UNSUPPORTED ? PROFILE_ERROR_UNSUPPORTED
             : e->code == PCU_ERROR_INVALID     ? PROFILE_ERROR_INVALID
                                                : PROFILE_ERROR_DEVICE;
  g_set_error_literal(error, PROFILE_ERROR, code, e->message);
  g_error_free(e);
}

static void set_error(GError **error, PcuContext *ctx, PcuStatus s, const char *what)
{
  GError *e = NULL;
  pcu_set_error(&e, ctx, s, what);
  profile_error_from_gpu(error, e);
}

/* One set of the shard's buffers. */
typedef struct {
  PcuOpArgs fwd, bwd;
  void *saved;
  /* Update: per weight, fp32 states. */
  PcuUpdateArgs update[PCU_MAX_WEIGHTS];
  int n_update;
} Set;

/* Sets cycle until their buffers are this many bytes together: several times the L2
 * cache of current GPUs (60 MB on an H200). */
#define ROTATION_BYTES ((int64_t)256 << 20)
#define MAX_SETS 8

typedef struct {
  PcuContext *ctx;
  int device;
  char *name;
  char **notes;               /* name, value, ..., NULL                                  */
  /* The prepared shard. */
  gboolean ready;
  Set sets[MAX_SETS];
  int n_sets, next;
  GPtrArray *buffers;         /* device pointers to free                                 */
} Cuda;

static const char *cuda_device_name(ProfileRunner *self)
{
  return ((Cuda *)self->priv)->name;
}

static const char *const *cuda_notes(ProfileRunner *self)
{
  return (const char *const *)((Cuda *)self->priv)->notes;
}

static void cuda_release(ProfileRunner *self)
{
  Cuda *c = self->priv;
  if (!c->ctx)
    return;
  pcu_context_activate(c->ctx);
  for (int k = 0; k < c->n_sets; k++)
    if (c->sets[k].saved) {
      pcu_saved_free(c->ctx, c->sets[k].saved);
      c->sets[k].saved = NULL;
    }
  for (guint i = 0; c->buffers && i < c->buffers->len; i++)
    pcu_free(c->ctx, c->buffers->pdata[i]);
  if (c->buffers)
    g_ptr_array_set_size(c->buffers, 0);
  pcu_synchronize(c->ctx);
  c->ready = FALSE;
  c->n_sets = 0;
  c->next = 0;
}

/* A device buffer for @region of @dtype, filled with deterministic values (integers in
 * [0, @range)), or zeros with @zero. */
static gboolean buffer_for(Cuda *c, PcuArg *arg, int dtype, gboolean zero, int64_t range,
                           uint64_t seed, int64_t *bytes, GError **error)
{
  int64_t n = 1;
  for (int d = 0; d < arg->region.ndim; d++)
    n *= arg->region.hi[d] - arg->region.lo[d];
  *bytes += n * pcu_dtype_size(dtype);
  void *p = NULL;
  PcuStatus s = pcu_malloc(c->ctx, (size_t)n * (size_t)pcu_dtype_size(dtype), &p);
  if (s == PCU_OK) {
    g_ptr_array_add(c->buffers, p);
    if (!zero)
      s = pcu_fill_random(c->ctx, p, dtype, n, seed, range);
  }
  if (s != PCU_OK) {
    set_error(error, c->ctx, s, "allocating a tensor of the shard");
    return FALSE;
  }
  arg->v = pcu_view_dense(p, dtype, &arg->region);
  return TRUE;
}

/* The valid range of integer input @i of @op: the vocabulary for ids, the classes for
 * labels. */
static int64_t int_range(const SimGraph *g, int op, int i)
{
  g_autoptr(SimAttrs) at = sim_graph_op_attrs(g, op);
  int64_t v = 0;
  if (sim_graph_op_type(g, op) == SIM_OP_EMBEDDING && sim_attrs_get_int(at, "vocab", &v))
    return v;
  if (sim_graph_op_type(g, op) == SIM_OP_CROSS_ENTROPY && i == 1) {
    SimShape s = sim_graph_tensor_shape(g, sim_graph_op_input(g, op, 0));
    return s.dims[s.ndim - 1];
  }
  return 2;
}

/* Buffers for one set of the shard's tensors, described by @proto. */
static gboolean fill_set(Cuda *c, Set *set, const PcuOpArgs *proto, const SimGraph *g, int op,
                         gboolean split, uint64_t seed, int64_t *bytes, GError **error)
{
  PcuOpArgs *a = &set->fwd;
  *a = *proto;
  int dt = a->dtype;
  for (int i = 0; i < a->n_inputs; i++) {
    SimDType t = sim_graph_tensor_dtype(g, sim_graph_op_input(g, op, i));
    gboolean integer = t == SIM_DTYPE_INT32 || t == SIM_DTYPE_INT64;
    if (!buffer_for(c, &a->in[i], integer ? PCU_I64 : dt, FALSE, int_range(g, op, i),
                    seed + (uint64_t)i, bytes, error))
      return FALSE;
    if (!integer && !buffer_for(c, &a->in_grad[i], dt, TRUE, 0, 0, bytes, error))
      return FALSE;
  }
  for (int i = 0; i < a->n_weights; i++)
    if (!buffer_for(c, &a->w[i], dt, FALSE, 0, seed + 100 + (uint64_t)i, bytes, error) ||
        !buffer_for(c, &a->w_grad[i], dt, TRUE, 0, 0, bytes, error))
      return FALSE;
  for (int i = 0; i < a->n_outputs; i++)
    if (!buffer_for(c, &a->out[i], dt, TRUE, 0, 0, bytes, error) ||
        !buffer_for(c, &a->out_grad[i], dt, FALSE, 0, seed + 200 + (uint64_t)i, bytes, error))
      return FALSE;
  if (a->type == SIM_OP_CROSS_ENTROPY && split) {
    /* Classes split: the statistics of the rows, as the executor keeps them. */
    a->split_stats = 1;
    a->stats.region = a->out[0].region;
    memmove(a->stats.region.lo + 1, a->stats.region.lo, sizeof(int64_t) * (PCU_MAX_DIMS - 1));
    memmove(a->stats.region.hi + 1, a->stats.region.hi, sizeof(int64_t) * (PCU_MAX_DIMS - 1));
    a->stats.region.lo[0] = 0;
    a->stats.region.hi[0] = PCU_STATS_PLANES;
    a->stats.region.ndim++;
    if (!buffer_for(c, &a->stats, PCU_F32, TRUE, 0, 0, bytes, error))
      return FALSE;
  }
  a->saved = &set->saved;
  set->bwd = *a;
  set->bwd.phase = PCU_BACKWARD;
  /* Adam over each weight the op owns, with fp32 states. */
  set->n_update = 0;
  if (sim_graph_op_weight_owner(g, op) == op)
    for (int i = 0; i < a->n_weights; i++) {
      PcuUpdateArgs *u = &set->update[set->n_update++];
      memset(u, 0, sizeof *u);
      u->adam = 1;
      u->lr = 1e-3;
      u->beta1 = 0.9;
      u->beta2 = 0.999;
      u->eps = 1e-8;
      u->step = 1;
      u->weight = a->w[i].v;
      u->grad = a->w_grad[i].v;
      u->region = a->w[i].region;
      PcuArg s1 = a->w[i], s2 = a->w[i];
      if (!buffer_for(c, &s1, PCU_F32, TRUE, 0, 0, bytes, error) ||
          !buffer_for(c, &s2, PCU_F32, TRUE, 0, 0, bytes, error))
        return FALSE;
      u->state1 = s1.v;
      u->state2 = s2.v;
      int64_t n = 1;
      for (int d = 0; d < u->region.ndim; d++)
        n *= u->region.hi[d] - u->region.lo[d];
      u->part_lo = 0;
      u->part_hi = n;
    }
  return TRUE;
}

static gboolean cuda_prepare(ProfileRunner *self, const SimGraph *g, int op,
                             const int64_t *extent, GError **error)
{
  Cuda *c = self->priv;
  cuda_release(self);
  PcuStatus s = pcu_context_activate(c->ctx);
  if (s != PCU_OK) {
    set_error(error, c->ctx, s, "selecting the GPU");
    return FALSE;
  }
  int nd = sim_graph_op_n_dims(g, op);
  int64_t lo[PCU_MAX_ITER] = { 0 }, hi[PCU_MAX_ITER] = { 0 };
  for (int d = 0; d < nd; d++)
    hi[d] = extent ? extent[d] : sim_graph_op_dim_size(g, op, d);
  /* The op computes in the type of its first floating-point output or input. */
  int dt = PCU_F32;
  gboolean found = FALSE;
  for (int i = 0; i < sim_graph_op_n_outputs(g, op) && !found; i++) {
    int t = pcu_dtype_of(sim_graph_tensor_dtype(g, sim_graph_op_output(g, op, i)));
    if (t != PCU_I64) {
      dt = t;
      found = TRUE;
    }
  }
  for (int i = 0; i < sim_graph_op_n_inputs(g, op) && !found; i++) {
    int t = pcu_dtype_of(sim_graph_tensor_dtype(g, sim_graph_op_input(g, op, i)));
    if (t != PCU_I64) {
      dt = t;
      found = TRUE;
    }
  }
  PcuOpArgs proto;
  GError *derr = NULL;
  if (!pcu_desc_init(&proto, g, op, lo, hi, dt, &derr)) {
    profile_error_from_gpu(error, derr);
    return FALSE;
  }
  gboolean split = pcu_desc_splits_reduction(g, op, lo, hi);
  proto.accumulate = split;
  uint64_t seed = pcu_name_hash(sim_graph_op_name(g, op));
  int64_t total = 0;
  for (int k = 0; k < MAX_SETS && (k == 0 || total * (k + 1) / k <= ROTATION_BYTES); k++) {
    int64_t bytes = 0;
    GError *ferr = NULL;
    if (!fill_set(c, &c->sets[k], &proto, g, op, split, seed + 1000 * (uint64_t)k, &bytes,
                  &ferr)) {
      /* Fewer sets than wished for still measure; none does not. */
      if (k > 0 && ferr->code == PROFILE_ERROR_NO_MEMORY) {
        g_error_free(ferr);
        break;
      }
      g_propagate_error(error, ferr);
      return FALSE;
    }
    c->n_sets = k + 1;
    total += bytes;
    /* One forward pass leaves what backward reads. */
    PcuStatus st = pcu_op_run(c->ctx, &c->sets[k].fwd);
    if (st == PCU_OK)
      st = pcu_synchronize(c->ctx);
    if (st != PCU_OK) {
      set_error(error, c->ctx, st, sim_graph_op_name(g, op));
      return FALSE;
    }
  }
  c->ready = TRUE;
  return TRUE;
}

static PcuStatus run_once(Cuda *c, SimPass pass)
{
  Set *set = &c->sets[c->next];
  c->next = (c->next + 1) % MAX(c->n_sets, 1);
  if (pass == SIM_PASS_FORWARD)
    return pcu_op_run(c->ctx, &set->fwd);
  if (pass == SIM_PASS_BACKWARD)
    return pcu_op_run(c->ctx, &set->bwd);
  for (int i = 0; i < set->n_update; i++) {
    PcuStatus s = pcu_update(c->ctx, &set->update[i]);
    if (s != PCU_OK)
      return s;
  }
  return PCU_OK;
}

static gboolean cuda_run(ProfileRunner *self, SimPass pass, int n, double *seconds,
                         GError **error)
{
  Cuda *c = self->priv;
  if (!c->ready) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_INVALID, "no shard prepared");
    return FALSE;
  }
  g_autofree void **ev = g_new0(void *, 2 * (gsize)n);
  PcuStatus s = pcu_events_new(c->ctx, 2 * n, ev);
  for (int r = 0; s == PCU_OK && r < n; r++) {
    s = pcu_event_record(c->ctx, ev[2 * r]);
    if (s == PCU_OK)
      s = run_once(c, pass);
    if (s == PCU_OK)
      s = pcu_event_record(c->ctx, ev[2 * r + 1]);
  }
  for (int r = 0; s == PCU_OK && r < n; r++)
    s = pcu_event_elapsed(c->ctx, ev[2 * r], ev[2 * r + 1], &seconds[r]);
  pcu_events_free(c->ctx, 2 * n, ev);
  if (s != PCU_OK) {
    set_error(error, c->ctx, s, "running the shard");
    return FALSE;
  }
  return TRUE;
}

static void cuda_finalize(ProfileRunner *self)
{
  Cuda *c = self->priv;
  cuda_release(self);
  if (c->buffers)
    g_ptr_array_unref(c->buffers);
  pcu_context_free(c->ctx);
  g_free(c->name);
  g_strfreev(c->notes);
  g_free(c);
  self->priv = NULL;
}

static const ProfileRunnerClass cuda_class = {
  .api_version = PROFILE_RUNNER_API_VERSION,
  .name = "cuda",
  .device_name = cuda_device_name,
  .prepare = cuda_prepare,
  .run = cuda_run,
  .release = cuda_release,
  .finalize = cuda_finalize,
  .device_notes = cuda_notes,
};

ProfileRunner *profile_cuda_runner_new(int device, const char *device_name, GError **error)
{
  char msg[1024] = "";
  int n = pcu_device_count(msg, sizeof msg);
  if (n < 0) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_DEVICE, "no usable GPU: %s", msg);
    return NULL;
  }
  if (device >= n) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_DEVICE, "GPU %d does not exist: %d present",
                device, n);
    return NULL;
  }
  PcuContext *ctx = pcu_context_new(device, 1, msg, sizeof msg);
  if (!ctx) {
    g_set_error(error, PROFILE_ERROR, PROFILE_ERROR_DEVICE, "GPU %d: %s", device, msg);
    return NULL;
  }
  char desc[2048] = "";
  pcu_device_describe(device, desc, sizeof desc);
  Cuda *c = g_new0(Cuda, 1);
  c->ctx = ctx;
  c->device = device;
  c->buffers = g_ptr_array_new();
  g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
  g_auto(GStrv) lines = g_strsplit(desc, "\n", -1);
  const char *vendor = "GPU";
  for (int i = 0; lines[i]; i++) {
    char *eq = strchr(lines[i], '=');
    if (!eq)
      continue;
    *eq = '\0';
    if (!strcmp(lines[i], "name"))
      vendor = eq + 1;
    g_ptr_array_add(notes, g_strdup(lines[i]));
    g_ptr_array_add(notes, g_strdup(eq + 1));
  }
  g_ptr_array_add(notes, g_strdup("runner"));
  g_ptr_array_add(notes, g_strdup("cuda: the executor's CUDA kernels (cuBLAS, cuDNN), timed "
                                  "with CUDA events"));
  g_ptr_array_add(notes, NULL);
  c->notes = (char **)g_ptr_array_steal(notes, NULL);
  c->name = device_name ? g_strdup(device_name) : profile_gpu_name_from_vendor(vendor);
  ProfileRunner *r = g_new0(ProfileRunner, 1);
  r->klass = &cuda_class;
  r->priv = c;
  return r;
}
