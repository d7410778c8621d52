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
 *   GATHER_PARAMS all-gathers the weights after a sharded update, or under ZeRO-3 before
 *   every micro-batch's forward and backward (each device then keeps only its part of the
 *   weights between steps, the rest poisoned, and only its part of the gradients after
 *   each reduce-scatter, the rest zeroed).
 */
#include "compile.h"

#include <math.h>

gboolean compile_fail(Ctx *x, int code, const char *fmt, ...)
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
      return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' has %d iteration dimensions",
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
        return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' (%s) computes on integer tensor "
                            "'%s': the executor's kernels compute on floating-point data",
                            sim_graph_op_name(g, op), sim_op_type_name(o->type),
                            sim_graph_tensor_name(g, sim_graph_op_input(g, op, i)));
    }
    /* A function applied to a partial sum is not the function of the sum. */
    if (o->n_out > 0 && o->out_partial[0] && sim_graph_op_fused_nonlinear(g, op))
      return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' (%s) splits a dimension its output "
                          "does not depend on and applies a fused activation to the partial sums: "
                          "the result would differ from the activation of their sum",
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
        return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "tensor '%s' is divided into micro-batches "
                            "along different dimensions by op '%s' and its neighbours (a reshape "
                            "or transpose that moves the samples)", sim_graph_tensor_name(g, t),
                            sim_graph_op_name(g, op));
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
          SimRegion mine = compile_map_to_owner(x, o, i, &o->w_reg[sh * o->n_w + i]);
          exact = sim_region_contains(&ow->w_reg[osh * ow->n_w + i], &mine);
          for (guint k = first; k < x->sharers->len && exact; k++) {
            const SharerItem *other = &g_array_index(x->sharers, SharerItem, k);
            if (other->shard % ow->n_shards != osh)
              continue;
            SimRegion theirs =
              compile_map_to_owner(x, o, i, &o->w_reg[other->shard * o->n_w + i]), in;
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
        compile_fail(x, EXEC_ERROR_UNSUPPORTED, "op '%s' keeps %d cop%s of op '%s''s weights on "
                     "devices without the owner, which has %d shard%s: the executor sums each "
                     "copy's gradients with one owner shard, so the copies paired with each owner "
                     "shard must hold disjoint pieces that make up its part",
                     sim_graph_op_name(x->g, op), n_copies, n_copies == 1 ? "y" : "ies",
                     sim_graph_op_name(x->g, o->owner), ow->n_shards, ow->n_shards == 1 ? "" : "s");
        return;
      }
      continue;
    }
    SimMemoryOptions mo = sim_strategy_get_memory(c->s);
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
      gr.zero3 = gr.sharded = mo.zero1 && mo.zero3 && gr.n_devices > 1;
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
    ExecView v = compile_buf_view(b);
    double scale;
    switch (b->kind) {
    case EXEC_BUF_VALUE:
      if (c->o.poison && b->dtype == SIM_DTYPE_FP32 && !x->ten[b->tensor].from_input)
        compile_emit_fill(x, b->device, &v, &b->box, NAN);
      break;
    case EXEC_BUF_GRAD:
      compile_emit_fill(x, b->device, &v, &b->box,
                        is_loss(c, b->tensor, &scale) ? (float)scale : 0.0f);
      break;
    case EXEC_BUF_WGRAD:
      compile_emit_fill(x, b->device, &v, &b->box, 0.0f);
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
  if (!x.failed && describe_ops(&x) && describe_tensors(&x) && compile_find_rings(&x)) {
    compile_plan_boxes(&x);
    if (!x.failed)
      compile_find_aliases(&x);
    if (!x.failed)
      compile_alloc_buffers(&x);
    if (!x.failed)
      compile_ring_buffers(&x);
    if (!x.failed)
      compile_init_weights(&x);
    x.saved = g_new0(gpointer, MAX(x.n_saved, 1));
    own(c, x.saved);
    find_groups(&x);
    find_losses(&x);
    if (!x.failed)
      emit_prologue(&x);
    if (!x.failed)
      compile_build_programs(&x);
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
    g_free(oi->ring);
    g_free(oi->ring_pos);
  }
  g_free(x.ops);
  if (x.rings)
    g_array_free(x.rings, TRUE);
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
