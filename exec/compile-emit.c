/* compile-emit.c — what each task means on each device it involves: the micro-operations
 * of a forward or backward shard, an update, a copy, a reduction of partial sums (or the
 * combination of cross-entropy statistics), a weight synchronization or gather, and the
 * steps the executor adds (compile.h, Synth). */
#include "compile.h"

#include <math.h>

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

void compile_emit_mop(Ctx *x, int dev, const ExecMop *m)
{
  emit(x, dev, m);
}

static void emit_time(Ctx *x, int dev, int task, gboolean begin);

void compile_emit_time(Ctx *x, int dev, int task, gboolean begin)
{
  emit_time(x, dev, task, begin);
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

void compile_emit_fill(Ctx *x, int dev, const ExecView *v, const SimRegion *r, float value)
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

/* The outputs a forward shard writes: poisoned before recomputation, zeroed where it adds
 * partial sums (once per region), cross-entropy statistics reset. */
void compile_prepare_forward(Ctx *x, int op, int sh, int mb, gboolean recompute)
{
  ExecCompiled *c = x->c;
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    const SimRegion *r = &o->out_reg[sh * o->n_out + j];
    if (!x->ten[t].is_float || !first_time(x, SEEN_ZERO_OUT, t, mb, recompute, d, r))
      continue;
    ExecView v = compile_buf_view(compile_find_buf(x, EXEC_BUF_VALUE, d, t, -1, 0, mb));
    if (recompute && c->o.poison)
      compile_emit_fill(x, d, &v, r, NAN);
    if (o->ce_split) {
      ExecView s = compile_buf_view(compile_find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
      SimRegion p0 = compile_stats_region(r, EXEC_STATS_LOCAL_MAX, 2);
      SimRegion p1 = compile_stats_region(r, EXEC_STATS_SUM, 2);
      compile_emit_fill(x, d, &s, &p0, -INFINITY);
      compile_emit_fill(x, d, &s, &p1, 0.0f);
    } else if (o->out_partial[j]) {
      compile_emit_fill(x, d, &v, r, 0.0f);
    }
  }
}

void compile_emit_forward(Ctx *x, int task, int op, int sh, int mb, gboolean recompute)
{
  int d = x->ops[op].dev[sh];
  emit_time(x, d, task, TRUE);
  compile_prepare_forward(x, op, sh, mb, recompute);
  ExecMop m = { .kind = EXEC_MOP_KERNEL,
                .kernel = compile_kernel_args(x, op, sh, mb, EXEC_KERNEL_FORWARD) };
  emit(x, d, &m);
  emit_time(x, d, task, FALSE);
}

/* What a backward shard needs before its kernel: the device's own consumers'
 * contributions summed into the output gradients, its input contributions zeroed. */
void compile_prepare_backward(Ctx *x, int op, int sh, int mb)
{
  const OpInfo *o = &x->ops[op];
  int d = o->dev[sh];
  /* The device's own consumers' contributions join what it received, once per region. */
  for (int j = 0; j < o->n_out; j++) {
    int t = sim_graph_op_output(x->g, op, j);
    const SimRegion *r = &o->out_reg[sh * o->n_out + j];
    if (!x->ten[t].is_float || !first_time(x, SEEN_FOLD, t, mb, 0, d, r))
      continue;
    ExecView gv = compile_buf_view(compile_find_buf(x, EXEC_BUF_GRAD, d, t, -1, 0, mb));
    int nc = sim_graph_tensor_n_consumers(x->g, t);
    for (int k = 0; k < nc; k++) {
      int cx = sim_graph_tensor_consumer(x->g, t, k);
      if (k > 0 && cx == sim_graph_tensor_consumer(x->g, t, k - 1))
        continue;
      ExecBuf *cb = compile_find_buf(x, EXEC_BUF_CONTRIB, d, t, cx, 0, mb);
      SimRegion inter;
      if (!cb || cb->kind == EXEC_BUF_GRAD || !sim_region_intersect(&cb->box, r, &inter))
        continue;
      ExecMop m = { .kind = EXEC_MOP_COPY, .a = gv, .b = compile_buf_view(cb), .region = inter,
                    .accumulate = TRUE };
      emit(x, d, &m);
    }
  }
  for (int i = 0; i < o->n_in; i++) {
    int t = sim_graph_op_input(x->g, op, i);
    ExecBuf *cb = compile_find_buf(x, EXEC_BUF_CONTRIB, d, t, op, 0, mb);
    /* An aliased contribution is the gradient, which the prologue zeroed. */
    if (cb && cb->kind == EXEC_BUF_CONTRIB && first_time(x, SEEN_ZERO_CONTRIB, t, mb, op, d, NULL)) {
      ExecView v = compile_buf_view(cb);
      compile_emit_fill(x, d, &v, &cb->box, 0.0f);
    }
  }
}

void compile_emit_backward(Ctx *x, int task, int op, int sh, int mb)
{
  int d = x->ops[op].dev[sh];
  emit_time(x, d, task, TRUE);
  compile_prepare_backward(x, op, sh, mb);
  ExecMop m = { .kind = EXEC_MOP_KERNEL,
                .kernel = compile_kernel_args(x, op, sh, mb, EXEC_KERNEL_BACKWARD) };
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


/* Boxes of @r covering the elements [@lo, @hi) of its row-major order, from dimension
 * @d on (the outer ones fixed to one index each), appended to @out. */
static void linear_boxes(SimRegion r, int d, int64_t lo, int64_t hi, GArray *out)
{
  if (lo >= hi)
    return;
  if (d >= r.ndim) {
    g_array_append_val(out, r);
    return;
  }
  int64_t inner = 1;
  for (int e = d + 1; e < r.ndim; e++)
    inner *= r.hi[e] - r.lo[e];
  int64_t a = lo / inner, b = (hi - 1) / inner, base = r.lo[d];
  if (lo % inner == 0 && hi % inner == 0) {
    r.lo[d] = base + a;
    r.hi[d] = base + hi / inner;
    g_array_append_val(out, r);
    return;
  }
  SimRegion s = r;
  s.lo[d] = base + a;
  s.hi[d] = base + a + 1;
  if (a == b) {
    linear_boxes(s, d + 1, lo - a * inner, hi - a * inner, out);
    return;
  }
  linear_boxes(s, d + 1, lo - a * inner, inner, out);
  if (b > a + 1) {
    SimRegion m = r;
    m.lo[d] = base + a + 1;
    m.hi[d] = base + b;
    g_array_append_val(out, m);
  }
  s.lo[d] = base + b;
  s.hi[d] = base + b + 1;
  linear_boxes(s, d + 1, 0, hi - b * inner, out);
}

/* Fills @v over the elements of @r outside [@plo, @phi) of its row-major order: what a
 * device does not keep of a ZeRO-3 weight or gradient. */
static void fill_outside_part(Ctx *x, int dev, const ExecView *v, const SimRegion *r, int64_t plo,
                              int64_t phi, float value)
{
  GArray *boxes = g_array_new(FALSE, FALSE, sizeof(SimRegion));
  linear_boxes(*r, 0, 0, plo, boxes);
  linear_boxes(*r, 0, phi, sim_region_volume(r), boxes);
  for (guint k = 0; k < boxes->len; k++)
    compile_emit_fill(x, dev, v, &g_array_index(boxes, SimRegion, k), value);
  g_array_free(boxes, TRUE);
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
  u->weight = compile_buf_view(slot->w);
  u->grad = compile_buf_view(slot->g);
  u->state1 = compile_buf_view(slot->s1);
  u->state2 = compile_buf_view(slot->s2);
  u->region = *r;
  u->part_lo = plo;
  u->part_hi = phi;
  ExecMop m = { .kind = EXEC_MOP_UPDATE, .update = u };
  emit(x, d, &m);
}

/* An update applies the summed gradient to the weight regions of its own shard, each
 * region once per device (shards of a data-parallel group on one device share it), after
 * that shard's synchronization; under ZeRO-1 only this device's part of the region. */
void compile_emit_update(Ctx *x, int task, int op, int sh)
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
    /* ZeRO-3: the rest of the weights is not kept until the next gather. */
    if (gr && gr->zero3 && c->o.poison) {
      ExecView w = compile_buf_view(slot->w);
      fill_outside_part(x, d, &w, r, plo, phi, NAN);
    }
  }
  emit_time(x, d, task, FALSE);
}


void compile_emit_copy(Ctx *x, int task, const SimPlanTask *t)
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
      if (compile_find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor,
                           sim_graph_tensor_consumer(x->g, t->tensor, k), 0, t->mb)) {
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d passes on part of the gradient of tensor "
                     "'%s' from device %d, which also computes some of it", task,
                     sim_graph_tensor_name(x->g, t->tensor), src);
        return;
      }
    from = compile_find_buf(x, EXEC_BUF_GRAD, src, t->tensor, -1, 0, t->mb);
    to = compile_find_buf(x, EXEC_BUF_GRAD, dst, t->tensor, -1, 0, t->mb);
  } else if (t->grad) {
    /* One consumer's contributions, or the staged sum of several. */
    from = t->n_ops > 1
             ? compile_find_buf(x, EXEC_BUF_STAGE, src, t->tensor, -1, 0, t->mb)
             : compile_find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor, t->ops[0], 0, t->mb);
    to = compile_find_buf(x, EXEC_BUF_GRAD, dst, t->tensor, -1, 0, t->mb);
  } else {
    from = compile_find_buf(x, EXEC_BUF_VALUE, src, t->tensor, -1, 0, t->mb);
    to = compile_find_buf(x, EXEC_BUF_VALUE, dst, t->tensor, -1, 0, t->mb);
  }
  if (!from || !to || !sim_region_contains(&from->box, &t->region) ||
      !sim_region_contains(&to->box, &t->region)) {
    compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d copies %s of tensor '%s' from device %d to "
                 "%d, where neither side's shards touch it", task,
                 t->grad ? "the gradient" : "the value", sim_graph_tensor_name(x->g, t->tensor),
                 src, dst);
    return;
  }
  emit_time(x, src, task, TRUE);
  if (t->grad && !t->relay && t->n_ops > 1) {
    ExecView sv = compile_buf_view(from);
    compile_emit_fill(x, src, &sv, &t->region, 0.0f);
    for (int k = 0; k < t->n_ops; k++) {
      ExecBuf *cb = compile_find_buf(x, EXEC_BUF_CONTRIB, src, t->tensor, t->ops[k], 0, t->mb);
      if (!cb || !sim_region_contains(&cb->box, &t->region)) {
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d sends gradients of op '%s' device %d "
                     "does not hold", task, sim_graph_op_name(x->g, t->ops[k]), src);
        return;
      }
      ExecMop m = { .kind = EXEC_MOP_COPY, .a = sv, .b = compile_buf_view(cb), .region = t->region,
                    .accumulate = TRUE };
      emit(x, src, &m);
    }
  }
  ExecMop s = { .kind = EXEC_MOP_SEND, .peer = dst, .a = compile_buf_view(from),
                .region = t->region };
  s.group.tag = tag;
  emit(x, src, &s);
  emit_time(x, src, task, FALSE);
  emit_time(x, dst, task, TRUE);
  ExecMop r = { .kind = EXEC_MOP_RECV, .peer = src, .a = compile_buf_view(to), .region = t->region,
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
      compile_fail(x, EXEC_ERROR_UNSUPPORTED, "device %d sums partial losses of op '%s' it has no "
                   "shard of", d, sim_graph_op_name(x->g, op));
      return;
    }
    if (task >= 0)
      emit_time(x, d, task, TRUE);
    ExecView s = compile_buf_view(compile_find_buf(x, EXEC_BUF_STATS, d, t, op, 0, mb));
    SimRegion gmax = compile_stats_region(rows, EXEC_STATS_MAX, 1);
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
                     .kernel = compile_kernel_args(x, op, sh, mb, EXEC_KERNEL_STATS_RESCALE) };
      emit(x, d, &rs);
      SimRegion sums = compile_stats_region(rows, EXEC_STATS_SUM, 2);
      emit_coll(x, EXEC_MOP_ALL_REDUCE, d, devs, n, coll_tag((int)base, 1), &s, &sums,
                EXEC_REDUCE_SUM);
    }
    ExecMop fin = { .kind = EXEC_MOP_KERNEL,
                    .kernel = compile_kernel_args(x, op, sh, mb, EXEC_KERNEL_STATS_FINISH) };
    emit(x, d, &fin);
    if (task >= 0)
      emit_time(x, d, task, FALSE);
  }
}

void compile_emit_reduce(Ctx *x, int task, const SimPlanTask *t)
{
  if (t->op < 0) {
    compile_fail(x, EXEC_ERROR_UNSUPPORTED, "reduction task %d has no compute task before it",
                 task);
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
      ExecBuf *b = t->grad ? compile_find_buf(x, EXEC_BUF_CONTRIB, d, t->tensor, t->op, 0, t->mb)
                           : compile_find_buf(x, EXEC_BUF_VALUE, d, t->tensor, -1, 0, t->mb);
      if (!b || !sim_region_contains(&b->box, &t->region)) {
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "reduction task %d sums a region device %d does "
                     "not hold", task, d);
        return;
      }
      ExecView v = compile_buf_view(b);
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

void compile_emit_sync(Ctx *x, int task, const SimPlanTask *t, gboolean gather)
{
  ExecCompiled *c = x->c;
  int sub = 0;
  for (int d = 0; d < t->n_devices; d++)
    emit_time(x, t->devices[d], task, TRUE);
  for (int q = 0; q < t->n_ops && !x->failed; q++) {
    int op = t->ops[q];
    const OpInfo *o = &x->ops[op];
    if (o->owner == op) {
      /* The next group of @op on these devices this kind of task has not covered; under
       * ZeRO-3, which the plan synchronizes and gathers many times a step, the one it
       * has covered least. */
      ExecWeightGroup *gr = NULL;
      for (guint k = 0; k < c->groups->len; k++) {
        ExecWeightGroup *h = &g_array_index(c->groups, ExecWeightGroup, k);
        if (h->op != op || !same_devs(h->devices, h->n_devices, t->devices, t->n_devices))
          continue;
        if (h->zero3) {
          if (!gr || (gather ? h->n_gathers < gr->n_gathers : h->n_syncs < gr->n_syncs))
            gr = h;
        } else if (!gr && !(gather ? !h->sharded || h->gathered : h->synced)) {
          gr = h;
        }
      }
      if (!gr) {
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d synchronizes op '%s' over devices no "
                     "group of its shards shares", task, sim_graph_op_name(x->g, op));
        return;
      }
      if (gr->zero3 && !gather && !t->sharded) {
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d sums the gradients of op '%s' whole, "
                     "but the plan shards its weights (ZeRO-3)", task, sim_graph_op_name(x->g, op));
        return;
      }
      if (gather) {
        gr->gathered = TRUE;
        gr->n_gathers++;
      } else {
        gr->synced = TRUE;
        gr->sharded = t->sharded;
        gr->n_syncs++;
      }
      for (int i = 0; i < o->n_w; i++) {
        const SimRegion *r = &o->w_reg[gr->members[0] * o->n_w + i];
        for (int k = 0; k < t->n_devices; k++) {
          int d = t->devices[k];
          ExecView v = compile_weight_view(x, op, i, d, gather ? EXEC_BUF_WEIGHT : EXEC_BUF_WGRAD);
          ExecMopKind kind = gather ? EXEC_MOP_ALL_GATHER
                             : t->sharded ? EXEC_MOP_REDUCE_SCATTER
                                          : EXEC_MOP_ALL_REDUCE;
          emit_coll(x, kind, d, t->devices, t->n_devices, coll_tag(task, sub), &v, r,
                    EXEC_REDUCE_SUM);
          /* ZeRO-3: a device keeps the summed gradients of its part alone; what it had
           * of the others' parts went into their sums. */
          if (gr->zero3 && !gather) {
            int64_t plo, phi;
            exec_part_range(sim_region_volume(r), t->n_devices, k, &plo, &phi);
            fill_outside_part(x, d, &v, r, plo, phi, 0.0f);
          }
        }
        sub++;
      }
      continue;
    }
    /* A copy of shared weights exchanges gradients with the owner's. */
    if (gather || t->sharded) {
      compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' keeps a copy of op '%s''s weights and the "
                   "plan shards their optimizer states: the copy and the owner would update "
                   "different parts", sim_graph_op_name(x->g, op),
                   sim_graph_op_name(x->g, o->owner));
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
            ExecView v = compile_weight_view(x, op, i, t->devices[k], EXEC_BUF_WGRAD);
            emit_coll(x, EXEC_MOP_ALL_REDUCE, t->devices[k], t->devices, t->n_devices,
                      coll_tag(task, sub), &v, r, EXEC_REDUCE_SUM);
          }
          sub++;
        }
        continue;
      }
      compile_fail(x, EXEC_ERROR_UNSUPPORTED, "task %d exchanges gradients of op '%s' between "
                   "devices that hold no copy of its weights", task, sim_graph_op_name(x->g, op));
      return;
    }
    it->assigned = TRUE;
    for (int i = 0; i < o->n_shared; i++) {
      const SimRegion *r = &o->w_reg[it->shard * o->n_w + i];
      for (int k = 0; k < 2; k++) {
        int d = it->devs[k];
        ExecView v = compile_weight_view(x, op, i, d, EXEC_BUF_WGRAD);
        emit_coll(x, EXEC_MOP_ALL_REDUCE, d, it->devs, 2, coll_tag(task, sub), &v, r,
                  EXEC_REDUCE_SUM);
      }
      sub++;
    }
  }
  for (int d = 0; d < t->n_devices; d++)
    emit_time(x, t->devices[d], task, FALSE);
}

void compile_emit_synth(Ctx *x, int id, const Synth *s)
{
  const OpInfo *o = &x->ops[s->op];
  if (s->kind == SYNTH_RING) {
    compile_emit_ring(x, id, s);
    return;
  }
  if (s->kind == SYNTH_WEIGHTS) {
    for (int i = s->w0; i < s->w1; i++) {
      const SimRegion *r = &o->w_reg[s->shard * o->n_w + i];
      for (int k = 0; k < s->n_devices; k++) {
        ExecView v = compile_weight_view(x, s->op, i, s->devices[k], EXEC_BUF_WGRAD);
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
        ExecBuf *b = compile_find_buf(x, EXEC_BUF_VALUE, devs[k], t, -1, 0, s->mb);
        ExecView v = compile_buf_view(b);
        emit_coll(x, EXEC_MOP_ALL_REDUCE, devs[k], devs, n,
                  coll_tag(x->c->n_tasks + id * 1024 + (int)done->len, 0), &v, r,
                  EXEC_REDUCE_SUM);
      }
    }
  }
  g_array_free(done, TRUE);
}
