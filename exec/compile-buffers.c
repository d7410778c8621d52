/* compile-buffers.c — where the data of a compiled plan live: the box of every tensor,
 * gradient, contribution and weight a device holds (the hull of the regions its shards
 * read or write), the contributions that go straight into the gradient buffer, the
 * buffers themselves, the initial weights, and views of them in an op's coordinates. */
#include "compile.h"

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

/* The region of the owner's weight that a sharer's region @r (in its own coordinates)
 * stands for. */
SimRegion compile_map_to_owner(const Ctx *x, const OpInfo *o, int i, const SimRegion *r)
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

void compile_plan_boxes(Ctx *x)
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
        SimRegion m = compile_map_to_owner(x, o, i, r);
        const SimRegion *box = hull_get(x, EXEC_BUF_WEIGHT, d, -1, o->owner, i);
        SimShape ws = sim_graph_op_weight_shape(x->g, o->owner, i);
        SimRegion full = sim_region_full(&ws);
        if (!box || !sim_region_contains(box, &m) ||
            (o->map[i] == MAP_RESHAPE && !sim_region_equal(box, &full)))
          compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' uses weight %d of op '%s' on device "
                       "%d, where the owner's shards hold other parts of it",
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
void compile_find_aliases(Ctx *x)
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

ExecBuf *compile_buf_alloc(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index,
                           int mb, SimDType dtype, const SimRegion *box)
{
  return buf_alloc(x, kind, device, tensor, op, index, mb, dtype, box);
}

ExecBuf *exec_compiled_buf(const ExecCompiled *c, ExecBufKind kind, int device, int tensor,
                           int op, int index, int mb)
{
  BufKey k = { kind, device, tensor, op, index, mb };
  return g_hash_table_lookup(c->buf_index, &k);
}

void compile_alloc_buffers(Ctx *x)
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
void compile_init_weights(Ctx *x)
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
      SimRegion m = compile_map_to_owner(x, o, s->weight, box);
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

ExecView compile_buf_view(const ExecBuf *b)
{
  if (!b)
    return (ExecView){ 0 };
  return exec_view_dense(b->buffer, b->dtype, &b->box);
}

ExecBuf *compile_find_buf(Ctx *x, ExecBufKind kind, int device, int tensor, int op, int index,
                          int mb)
{
  return exec_compiled_buf(x->c, kind, device, tensor, op, index, mb);
}

/* The view, in op @op's own coordinates, of its weight @i (or of the gradient with
 * @kind EXEC_BUF_WGRAD, ...) on @dev. */
ExecView compile_weight_view(Ctx *x, int op, int i, int dev, ExecBufKind kind)
{
  const OpInfo *o = &x->ops[op];
  if (i >= o->n_shared || !op_on(&x->ops[o->owner], dev))
    return compile_buf_view(compile_find_buf(x, kind, dev, -1, op, i, -1));
  ExecBuf *b = compile_find_buf(x, kind, dev, -1, o->owner, i, -1);
  ExecView v = compile_buf_view(b);
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
SimRegion compile_stats_region(const SimRegion *rows, int p, int n)
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

ExecKernelArgs *compile_kernel_args(Ctx *x, int op, int sh, int mb, ExecKernelPhase phase)
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
    in[i] = compile_buf_view(compile_find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    ing[i] = compile_buf_view(compile_find_buf(x, EXEC_BUF_CONTRIB, d, t, op, 0, mb));
  }
  ExecView *w = own(c, g_new0(ExecView, MAX(o->n_w, 1)));
  ExecView *wg = own(c, g_new0(ExecView, MAX(o->n_w, 1)));
  for (int i = 0; i < o->n_w; i++) {
    w[i] = compile_weight_view(x, op, i, d, EXEC_BUF_WEIGHT);
    wg[i] = compile_weight_view(x, op, i, d, EXEC_BUF_WGRAD);
  }
  ExecView *out = own(c, g_new0(ExecView, MAX(o->n_out, 1)));
  ExecView *outg = own(c, g_new0(ExecView, MAX(o->n_out, 1)));
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    out[j] = compile_buf_view(compile_find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    outg[j] = compile_buf_view(compile_find_buf(x, EXEC_BUF_GRAD, d, t, -1, 0, mb));
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
    *st = compile_buf_view(compile_find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
    a->stats = st;
    a->accumulate = phase == EXEC_KERNEL_FORWARD;
    a->split_stats = phase == EXEC_KERNEL_BACKWARD;
  } else if (o->n_out > 0) {
    a->accumulate = o->out_partial[0];
  }
  a->saved = &x->saved[o->saved_base + sh * c->M + mb];
  return a;
}
