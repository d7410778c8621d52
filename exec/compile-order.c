/* compile-order.c — the one order of all tasks, and the programs emitted in it.
 *
 * The plan's dependencies and every device's stream order are edges; the executor adds
 * the edges the plan leaves implicit (a weight synchronization after every backward task
 * of the ops using the weights and before their updates; the statistics of cross entropy
 * over split classes before the backward pass that reads them) and steps of its own
 * (Synth, compile.h), each with its edges.  The tasks are then emitted in a topological
 * order that prefers the simulator's predicted start times, ties broken by task number. */
#include "compile.h"
#include "heap.h"

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

/* The graph being ordered: the plan's n tasks, then the executor's steps (n + k). */
typedef struct {
  Ctx *x;
  SimPlan *p;
  int n;
  GArray *edges;            /* Edge                                                     */
  GArray *synth;            /* Synth: step n + k is synth[k]                             */
  GHashTable *fwd;          /* (op, mb, shard) -> its forward task + 1                    */
  GHashTable *bwd;          /* (op, mb) -> GArray of its backward tasks                   */
  GHashTable *have_reduce;  /* (op, mb) whose partial outputs a plan task reduces         */
  GArray *ce_reduces;       /* reductions of cross-entropy statistics                     */
  GArray *syncs;            /* weight synchronizations                                    */
  GArray **owner_tasks;     /* per owner op: backward and update tasks of its weights' users */
} Order;

static void add_edge(Order *o, int from, int to)
{
  Edge e = { from, to };
  g_array_append_val(o->edges, e);
}

static gint64 *op_mb_key(int op, int mb)
{
  gint64 *key = g_new(gint64, 1);
  *key = (gint64)op * 65536 + mb;
  return key;
}

/* The plan's own edges, and the tasks by the roles the added edges look them up in. */
static void index_tasks(Order *o)
{
  Ctx *x = o->x;
  for (int i = 0; i < o->n; i++) {
    SimPlanTask t;
    sim_plan_task(o->p, i, &t);
    for (int k = 0; k < sim_plan_n_successors(o->p, i); k++)
      add_edge(o, i, sim_plan_successor(o->p, i, k));
    if (t.kind == SIM_PLAN_SYNC)
      g_array_append_val(o->syncs, i);
    if (t.kind == SIM_PLAN_COMPUTE && t.pass != SIM_PASS_FORWARD && !x->ops[t.op].is_input) {
      int owner = x->ops[t.op].owner;
      if (!o->owner_tasks[owner])
        o->owner_tasks[owner] = g_array_new(FALSE, FALSE, sizeof(int));
      g_array_append_val(o->owner_tasks[owner], i);
    }
    if (t.kind == SIM_PLAN_COMPUTE && t.pass == SIM_PASS_BACKWARD) {
      gint64 *key = op_mb_key(t.op, t.mb);
      GArray *list = g_hash_table_lookup(o->bwd, key);
      if (!list) {
        list = g_array_new(FALSE, FALSE, sizeof(int));
        g_hash_table_insert(o->bwd, key, list);
      } else {
        g_free(key);
      }
      g_array_append_val(list, i);
    } else if (t.kind == SIM_PLAN_COMPUTE && t.pass == SIM_PASS_FORWARD && !t.recompute) {
      gint64 *key = op_mb_key(t.op, t.mb);
      *key = *key * 1024 + t.shard;
      g_hash_table_insert(o->fwd, key, GINT_TO_POINTER(i + 1));
    } else if (t.kind == SIM_PLAN_REDUCE && !t.grad && t.op >= 0) {
      g_hash_table_add(o->have_reduce, op_mb_key(t.op, t.mb));
      if (x->ops[t.op].ce_split)
        g_array_append_val(o->ce_reduces, i);
    }
  }
}

/* Step @id sums gradients over @devs: the backward tasks there of @op's weights' users
 * (or of @op alone, with @only_op) precede it and their updates follow it. */
static void order_around_sum(Order *o, int id, int owner, int only_op, const int *devs,
                             int n_devs)
{
  GArray *users = o->owner_tasks[owner];
  for (guint j = 0; users && j < users->len; j++) {
    int u = g_array_index(users, int, j);
    SimPlanTask ut;
    sim_plan_task(o->p, u, &ut);
    if ((only_op >= 0 && ut.op != only_op) || rank_in(devs, n_devs, ut.device) < 0)
      continue;
    if (ut.pass == SIM_PASS_BACKWARD)
      add_edge(o, u, id);
    else
      add_edge(o, id, u);
  }
}

/* A synchronization sums complete gradients and precedes the updates that apply them:
 * every backward task, on the synchronized devices, of the ops using the weights
 * precedes it, and their updates there follow it.  The plan states this for the owner's
 * own groups; for a copy's exchange with the owner it orders only the copy's side. */
static void order_syncs(Order *o)
{
  for (guint k = 0; k < o->syncs->len; k++) {
    int i = g_array_index(o->syncs, int, k);
    SimPlanTask t;
    sim_plan_task(o->p, i, &t);
    for (int q = 0; q < t.n_ops; q++)
      order_around_sum(o, i, o->x->ops[t.ops[q]].owner, -1, t.devices, t.n_devices);
  }
}

/* An op's own weights beside the shared ones: summed over the shards holding the same
 * part before the op's updates there. */
static void add_own_weight_sums(Order *o)
{
  Ctx *x = o->x;
  ExecCompiled *c = x->c;
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *oi = &x->ops[op];
    if (oi->is_input || oi->n_shared == 0 || oi->n_w <= oi->n_shared)
      continue;
    gboolean *used = g_new0(gboolean, oi->n_shards);
    for (int sh = 0; sh < oi->n_shards; sh++) {
      if (used[sh])
        continue;
      Synth sy = { .kind = SYNTH_WEIGHTS, .op = op, .mb = -1, .shard = sh, .w0 = oi->n_shared,
                   .w1 = oi->n_w };
      sy.devices = own(c, g_new(int, oi->n_shards));
      for (int s2 = sh; s2 < oi->n_shards; s2++)
        if (!used[s2] && oi->copy[s2] == oi->copy[sh] &&
            region_equal(&oi->w_reg[s2 * oi->n_w + oi->n_shared],
                         &oi->w_reg[sh * oi->n_w + oi->n_shared])) {
          used[s2] = TRUE;
          if (rank_in(sy.devices, sy.n_devices, oi->dev[s2]) < 0)
            sy.devices[sy.n_devices++] = oi->dev[s2];
        }
      if (sy.n_devices < 2)
        continue;
      int id = o->n + (int)o->synth->len;
      g_array_append_val(o->synth, sy);
      order_around_sum(o, id, oi->owner, op, sy.devices, sy.n_devices);
    }
    g_free(used);
  }
}

/* A copy's exchange with the owner follows the owner's own synchronizations on the
 * devices it involves. */
static void order_copy_exchanges(Order *o)
{
  for (guint k = 0; k < o->syncs->len; k++) {
    int i = g_array_index(o->syncs, int, k);
    SimPlanTask ex;
    sim_plan_task(o->p, i, &ex);
    for (int q = 0; q < ex.n_ops; q++) {
      int owner = o->x->ops[ex.ops[q]].owner;
      if (owner == ex.ops[q])
        continue;
      for (guint j = 0; j < o->syncs->len; j++) {
        int i2 = g_array_index(o->syncs, int, j);
        SimPlanTask ot;
        sim_plan_task(o->p, i2, &ot);
        gboolean has_owner = FALSE, touches = FALSE;
        for (int r = 0; r < ot.n_ops && !has_owner; r++)
          has_owner = ot.ops[r] == owner;
        for (int r = 0; r < ot.n_devices && !touches; r++)
          touches = rank_in(ex.devices, ex.n_devices, ot.devices[r]) >= 0;
        if (has_owner && touches && i2 != i)
          add_edge(o, i2, i);
      }
    }
  }
}

/* Statistics combined by a reduction are read by the backward pass of the same loss. */
static void order_ce_statistics(Order *o)
{
  for (guint k = 0; k < o->ce_reduces->len; k++) {
    int i = g_array_index(o->ce_reduces, int, k);
    SimPlanTask t;
    sim_plan_task(o->p, i, &t);
    gint64 key = (gint64)t.op * 65536 + t.mb;
    GArray *list = g_hash_table_lookup(o->bwd, &key);
    for (guint q = 0; list && q < list->len; q++)
      add_edge(o, i, g_array_index(list, int, q));
  }
}

/* Partial outputs that nothing consumes and no plan task reduces: a step of the executor
 * reduces them after the forward shards and before the backward ones. */
static void add_loss_reductions(Order *o)
{
  Ctx *x = o->x;
  ExecCompiled *c = x->c;
  for (int op = 0; op < c->n_ops; op++) {
    const OpInfo *oi = &x->ops[op];
    if (oi->is_input || oi->n_out == 0 || !oi->out_partial[0])
      continue;
    int t = sim_graph_op_output(x->g, op, 0);
    if (sim_graph_tensor_n_consumers(x->g, t) > 0)
      continue;
    for (int mb = 0; mb < c->M; mb++) {
      gint64 key = (gint64)op * 65536 + mb;
      if (g_hash_table_contains(o->have_reduce, &key))
        continue;
      Synth s = { .kind = SYNTH_LOSS, .op = op, .mb = mb };
      int id = o->n + (int)o->synth->len;
      g_array_append_val(o->synth, s);
      for (int sh = 0; sh < oi->n_shards; sh++) {
        gint64 fk = key * 1024 + sh;
        int f = GPOINTER_TO_INT(g_hash_table_lookup(o->fwd, &fk)) - 1;
        if (f >= 0)
          add_edge(o, f, id);
      }
      GArray *list = g_hash_table_lookup(o->bwd, &key);
      for (guint q = 0; list && q < list->len; q++)
        add_edge(o, id, g_array_index(list, int, q));
    }
  }
}

/* Every device's stream order. */
static void order_streams(Order *o)
{
  for (int d = 0; d < o->x->c->n_devices; d++) {
    int len = sim_plan_stream_length(o->p, d);
    for (int k = 1; k < len; k++)
      add_edge(o, sim_plan_stream_task(o->p, d, k - 1), sim_plan_stream_task(o->p, d, k));
  }
}

/* Ring attention (compile-ring.c): the forward, recomputed forward or backward tasks of a
 * ring's members in one micro-batch become one step, which every predecessor of a member
 * precedes and which precedes the members' tasks (then empty), so that all members reach
 * the ring at the same point of the order, as for a collective. */
static void add_rings(Order *o)
{
  Ctx *x = o->x;
  if (!x->rings->len)
    return;
  GHashTable *index = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
  for (int i = 0; i < o->n; i++) {
    SimPlanTask t;
    sim_plan_task(o->p, i, &t);
    if (t.kind != SIM_PLAN_COMPUTE || t.pass == SIM_PASS_UPDATE || !x->ops[t.op].ring)
      continue;
    gint64 *key = op_mb_key(t.op, t.mb);
    *key = (*key * 1024 + t.shard) * 3 + (t.pass == SIM_PASS_BACKWARD ? 2 : t.recompute);
    if (g_hash_table_contains(index, key)) {
      g_free(key);
      compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s' runs as a ring, and its shard %d "
                   "has two tasks of one pass in micro-batch %d", sim_graph_op_name(x->g, t.op),
                   t.shard, t.mb);
      break;
    }
    g_hash_table_insert(index, key, GINT_TO_POINTER(i + 1));
  }
  int *step_of = g_new(int, (size_t)MAX(o->n, 1));
  for (int i = 0; i < o->n; i++)
    step_of[i] = -1;
  guint n_edges = o->edges->len;
  for (guint k = 0; k < x->rings->len && !x->failed; k++) {
    const Ring *r = &g_array_index(x->rings, Ring, k);
    for (int mb = 0; mb < x->c->M; mb++)
      for (int kind = 0; kind < 3; kind++) {
        int *tasks = own(x->c, g_new(int, r->n));
        int found = 0;
        for (int m = 0; m < r->n; m++) {
          gint64 key = ((gint64)r->op * 65536 + mb) * 1024 + r->members[m];
          key = key * 3 + kind;
          tasks[m] = GPOINTER_TO_INT(g_hash_table_lookup(index, &key)) - 1;
          found += tasks[m] >= 0;
        }
        if (found == 0)
          continue;
        if (found != r->n) {
          compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s' runs as a ring of %d shards, "
                       "and only %d of them have a %s task in micro-batch %d",
                       sim_graph_op_name(x->g, r->op), r->n, found,
                       kind == 2 ? "backward" : kind ? "recomputation" : "forward", mb);
          break;
        }
        Synth sy = { .kind = SYNTH_RING, .op = r->op, .mb = mb, .ring = (int)k,
                     .pass = kind == 2 ? SIM_PASS_BACKWARD : SIM_PASS_FORWARD,
                     .recompute = kind == 1, .tasks = tasks };
        int id = o->n + (int)o->synth->len;
        g_array_append_val(o->synth, sy);
        for (int m = 0; m < r->n; m++) {
          step_of[tasks[m]] = id;
          add_edge(o, id, tasks[m]);
        }
      }
  }
  for (guint k = 0; k < n_edges; k++) {
    Edge e = g_array_index(o->edges, Edge, k);
    if (e.to < o->n && step_of[e.to] >= 0)
      add_edge(o, e.from, step_of[e.to]);
  }
  g_free(step_of);
  g_hash_table_destroy(index);
}

/* The micro-operations of plan task @i. */
static void emit_task(Ctx *x, SimPlan *p, int i)
{
  SimPlanTask t;
  sim_plan_task(p, i, &t);
  switch (t.kind) {
  case SIM_PLAN_COMPUTE:
    /* A ring's forward and backward tasks are carried out by its step (add_rings). */
    if (x->ops[t.op].is_input || (x->ops[t.op].ring && t.pass != SIM_PASS_UPDATE))
      break;
    if (t.pass == SIM_PASS_FORWARD)
      compile_emit_forward(x, i, t.op, t.shard, t.mb, t.recompute);
    else if (t.pass == SIM_PASS_BACKWARD)
      compile_emit_backward(x, i, t.op, t.shard, t.mb);
    else
      compile_emit_update(x, i, t.op, t.shard);
    break;
  case SIM_PLAN_COPY:
    compile_emit_copy(x, i, &t);
    break;
  case SIM_PLAN_REDUCE:
    compile_emit_reduce(x, i, &t);
    break;
  case SIM_PLAN_SYNC:
    compile_emit_sync(x, i, &t, FALSE);
    break;
  case SIM_PLAN_GATHER_PARAMS:
    compile_emit_sync(x, i, &t, TRUE);
    break;
  case SIM_PLAN_TIMING:
  case SIM_PLAN_JOIN:
    break;
  }
}

/* Emits the tasks and steps in a topological order of the edges, the earliest predicted
 * start first (@rep); a step runs as soon as its inputs are ready. */
static void emit_in_order(Order *o, const SimReport *rep)
{
  Ctx *x = o->x;
  int n = o->n;
  int total = n + (int)o->synth->len;
  int *indeg = g_new0(int, total);
  int *off = g_new0(int, (size_t)total + 1);
  for (guint k = 0; k < o->edges->len; k++) {
    Edge e = g_array_index(o->edges, Edge, k);
    indeg[e.to]++;
    off[e.from + 1]++;
  }
  for (int i = 0; i < total; i++)
    off[i + 1] += off[i];
  int *adj = g_new(int, MAX(o->edges->len, 1));
  int *pos = g_memdup2(off, sizeof(int) * (size_t)total);
  for (guint k = 0; k < o->edges->len; k++) {
    Edge e = g_array_index(o->edges, Edge, k);
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
      if (j >= n && key[j] == G_MAXDOUBLE)
        key[j] = it.key;
      if (--indeg[j] == 0)
        item_heap_push(&heap, &n_heap, &cap_heap, (HeapItem){ MAX(key[j], it.key), j });
    }
    if (i >= n)
      compile_emit_synth(x, i - n, &g_array_index(o->synth, Synth, i - n));
    else
      emit_task(x, o->p, i);
  }
  if (!x->failed && emitted != total)
    compile_fail(x, EXEC_ERROR_UNSUPPORTED, "the plan's dependencies and stream orders form a "
                 "cycle (%d of %d tasks could be ordered)", emitted, total);
  g_free(heap);
  g_free(key);
  g_free(pos);
  g_free(adj);
  g_free(off);
  g_free(indeg);
}

gboolean compile_build_programs(Ctx *x)
{
  ExecCompiled *c = x->c;
  /* The simulator's start times order the tasks where dependencies leave a choice. */
  g_autoptr(GError) sim_error = NULL;
  g_autoptr(SimReport) rep = sim_plan_simulate(c->plan, &sim_error);
  if (!rep)
    return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "the plan cannot run: %s",
                        sim_error->message);

  Order o = {
    .x = x,
    .p = c->plan,
    .n = c->n_tasks,
    .edges = g_array_new(FALSE, FALSE, sizeof(Edge)),
    .synth = g_array_new(FALSE, FALSE, sizeof(Synth)),
    .fwd = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL),
    .bwd = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free,
                                 (GDestroyNotify)g_array_unref),
    .have_reduce = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL),
    .ce_reduces = g_array_new(FALSE, FALSE, sizeof(int)),
    .syncs = g_array_new(FALSE, FALSE, sizeof(int)),
    .owner_tasks = g_new0(GArray *, c->n_ops),
  };
  index_tasks(&o);
  order_syncs(&o);
  add_own_weight_sums(&o);
  order_copy_exchanges(&o);
  order_ce_statistics(&o);
  add_loss_reductions(&o);
  order_streams(&o);
  add_rings(&o);
  emit_in_order(&o, rep);

  g_array_free(o.ce_reduces, TRUE);
  g_array_free(o.syncs, TRUE);
  for (int op = 0; op < c->n_ops; op++)
    if (o.owner_tasks[op])
      g_array_free(o.owner_tasks[op], TRUE);
  g_free(o.owner_tasks);
  g_hash_table_destroy(o.have_reduce);
  g_hash_table_destroy(o.bwd);
  g_hash_table_destroy(o.fwd);
  g_array_free(o.synth, TRUE);
  g_array_free(o.edges, TRUE);
  return !x->failed;
}
