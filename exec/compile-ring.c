/* compile-ring.c — ring attention under context parallelism.
 *
 * A recorded plan of a context-parallel strategy gives each self-attention shard the keys
 * and values of its own positions only (sim/lower.c, ring_attention()): the shards that
 * split the positions of the same samples and heads form a ring, and the executor runs it
 * as ring attention does (Liu et al. 2023; Megatron-Core's context parallelism).  Forward,
 * each member projects its own keys and values into a block, then in n steps computes its
 * queries against the block it holds (online softmax: running maxima, sums and partial
 * outputs) while the block moves on to the next member; backward, the blocks travel again
 * with their gradients dK and dV, to which every member adds its queries' share, and after
 * n passes each block is back with the member that computed it, which takes the
 * projections' backward from it.
 *
 * One executor step (a SYNTH_RING, compile-order.c) carries out the pass of every member
 * of a ring at one point of the order, as a collective is: the members' plan tasks are
 * then empty, their timestamps bracketing the ring.  The blocks pass as point-to-point
 * sends and receives between the members' devices, between two alternating buffers
 * (EXEC_BUF_RING) per member and micro-batch.
 *
 * Where a member's positions split in two equal chunks the ring runs Megatron's
 * load-balanced layout (Megatron-LM's get_batch_on_this_cp_rank; TransformerEngine's
 * AttnFuncWithCPAndKVP2P): the sequence is cut into 2 n chunks and member r computes
 * chunks r and 2 n - 1 - r, so that under a causal mask every member meets the same
 * number of (query, key) pairs.  The plan gives member r chunks 2 r and 2 r + 1 (its
 * contiguous positions), so the ring step first moves each chunk's input rows to the
 * member that computes it, into a rows buffer of that member (EXEC_BUF_RING, index
 * 2 shards + 4 sh + ROWS_*), whose first half is its lower chunk; the outputs come back
 * the same way after RING_END, the output gradients go out before the backward and the
 * input gradients come back after it.  Megatron permutes the tokens once when it loads
 * them; the plan here keeps every other op on contiguous positions, so the executor
 * moves the attention's rows instead, which computes the same values. */
#include "compile.h"

static int64_t op_attr(const SimGraph *g, int op, const char *name, int64_t def)
{
  g_autoptr(SimAttrs) at = sim_graph_op_attrs(g, op);
  int64_t v = def;
  return sim_attrs_get_int(at, name, &v) ? v : def;
}

static const int64_t *shard_lo(const OpInfo *o, int sh)
{
  return o->lo + (size_t)sh * EXEC_MAX_ITER;
}

static const int64_t *shard_hi(const OpInfo *o, int sh)
{
  return o->hi + (size_t)sh * EXEC_MAX_ITER;
}

/* Whether shards @a and @b split only the positions (dimension 1) of the same copy. */
static gboolean same_ring(const OpInfo *o, int a, int b)
{
  if (o->copy[a] != o->copy[b])
    return FALSE;
  for (int d = 0; d < o->nd; d++)
    if (d != 1 && (shard_lo(o, a)[d] != shard_lo(o, b)[d] || shard_hi(o, a)[d] != shard_hi(o, b)[d]))
      return FALSE;
  return TRUE;
}

gboolean compile_find_rings(Ctx *x)
{
  const SimGraph *g = x->g;
  x->rings = g_array_new(FALSE, FALSE, sizeof(Ring));
  for (int op = 0; op < x->c->n_ops && !x->failed; op++) {
    OpInfo *o = &x->ops[op];
    if (o->is_input || o->type != SIM_OP_ATTENTION || o->n_in != 3)
      continue;
    int t = sim_graph_op_input(g, op, 0);
    if (sim_graph_op_input(g, op, 1) != t || sim_graph_op_input(g, op, 2) != t)
      continue;
    int64_t S = sim_graph_tensor_shape(g, t).dims[1];
    int rings = 0;
    for (int sh = 0; sh < o->n_shards; sh++) {
      const SimRegion *k = &o->in_reg[sh * o->n_in + 1];
      int64_t lo = shard_lo(o, sh)[1], hi = shard_hi(o, sh)[1];
      rings += hi - lo < S && k->lo[1] == lo && k->hi[1] == hi;
    }
    if (rings == 0)
      continue;
    if (rings != o->n_shards)
      return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s': %d of its %d shards read "
                          "only their own keys and values (a ring), the others more",
                          sim_graph_op_name(g, op), rings, o->n_shards);
    o->ring = g_new(int, o->n_shards);
    o->ring_pos = g_new(int, o->n_shards);
    for (int sh = 0; sh < o->n_shards; sh++)
      o->ring[sh] = -1;
    for (int sh = 0; sh < o->n_shards; sh++) {
      if (o->ring[sh] >= 0)
        continue;
      Ring r = { .op = op, .members = own(x->c, g_new(int, o->n_shards)) };
      for (int s2 = sh; s2 < o->n_shards; s2++)
        if (o->ring[s2] < 0 && same_ring(o, sh, s2))
          r.members[r.n++] = s2;
      /* In the order of their positions. */
      for (int a = 1; a < r.n; a++)
        for (int b = a; b > 0 && shard_lo(o, r.members[b - 1])[1] > shard_lo(o, r.members[b])[1];
             b--) {
          int tmp = r.members[b];
          r.members[b] = r.members[b - 1];
          r.members[b - 1] = tmp;
        }
      int64_t chunk = shard_hi(o, sh)[1] - shard_lo(o, sh)[1];
      for (int k = 0; k < r.n; k++) {
        int m = r.members[k];
        if (shard_lo(o, m)[1] != k * chunk || shard_hi(o, m)[1] != (k + 1) * chunk)
          return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s': the shards of a ring "
                              "split its %" G_GINT64_FORMAT " positions into unequal chunks",
                              sim_graph_op_name(g, op), S);
        for (int j = 0; j < k; j++)
          if (o->dev[r.members[j]] == o->dev[m])
            return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s': two shards of a "
                                "ring on device %d", sim_graph_op_name(g, op), o->dev[m]);
        o->ring[m] = (int)x->rings->len;
        o->ring_pos[m] = k;
      }
      r.half = chunk % 2 == 0 ? chunk / 2 : 0;
      if (r.n * chunk != S)
        return compile_fail(x, EXEC_ERROR_UNSUPPORTED, "attention '%s': a ring of %d shards "
                            "covers %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT " positions",
                            sim_graph_op_name(g, op), r.n, r.n * chunk, S);
      g_array_append_val(x->rings, r);
    }
  }
  return !x->failed;
}

/* The box of a member's blocks: [planes, samples, positions, key-value heads, head_dim]. */
static SimRegion block_box(Ctx *x, const OpInfo *o, int op, int sh)
{
  SimRegion r = { .ndim = 5 };
  r.hi[0] = EXEC_RING_PLANES;
  for (int d = 0; d < 3; d++)
    r.hi[d + 1] = shard_hi(o, sh)[d] - shard_lo(o, sh)[d];
  r.hi[4] = op_attr(x->g, op, "head_dim", 1);
  return r;
}

/* The rows buffers of the two-chunk layout: the attention's input, output, output
 * gradient and input gradient rows of the chunks a member computes. */
enum { ROWS_X, ROWS_Y, ROWS_DY, ROWS_DX, ROWS_KINDS };

static int rows_index(const OpInfo *o, int sh, int kind)
{
  return 2 * o->n_shards + ROWS_KINDS * sh + kind;
}

/* The region of the input (@kind ROWS_X, ROWS_DX) or the output a member's rows cover. */
static const SimRegion *rows_region(const OpInfo *o, int sh, int kind)
{
  return kind == ROWS_X || kind == ROWS_DX ? &o->in_reg[sh * o->n_in] : &o->out_reg[sh * o->n_out];
}

void compile_ring_buffers(Ctx *x)
{
  for (guint k = 0; k < x->rings->len && !x->failed; k++) {
    const Ring *r = &g_array_index(x->rings, Ring, k);
    const OpInfo *o = &x->ops[r->op];
    for (int i = 0; i < r->n; i++) {
      int sh = r->members[i];
      SimRegion box = block_box(x, o, r->op, sh);
      for (int mb = 0; mb < x->c->M; mb++) {
        for (int b = 0; b < 2; b++)
          compile_buf_alloc(x, EXEC_BUF_RING, o->dev[sh], -1, r->op, 2 * sh + b, mb,
                            SIM_DTYPE_FP32, &box);
        for (int kind = 0; kind < ROWS_KINDS && r->half; kind++)
          compile_buf_alloc(x, EXEC_BUF_RING, o->dev[sh], -1, r->op, rows_index(o, sh, kind), mb,
                            SIM_DTYPE_FP32, rows_region(o, sh, kind));
      }
    }
  }
}

static ExecView rows_view(Ctx *x, const Ring *r, int k, int mb, int kind)
{
  const OpInfo *o = &x->ops[r->op];
  int sh = r->members[k];
  return compile_buf_view(compile_find_buf(x, EXEC_BUF_RING, o->dev[sh], -1, r->op,
                                           rows_index(o, sh, kind), mb));
}

/* The member that computes chunk @c of the two-chunk layout, and the half of its rows
 * that holds it. */
static int chunk_member(const Ring *r, int c, int *half)
{
  *half = c >= r->n;
  return c < r->n ? c : 2 * r->n - 1 - c;
}

/* Moves the rows of every chunk between the plan's views @plain (member c / 2 holds chunk
 * c, its positions as they are) and the rows buffers @kind of the two-chunk layout; to
 * that layout or, with @back, from it (adding with @accumulate).  One global order of
 * the transfers, so that blocking sends cannot wait on each other in a cycle. */
static void exchange_rows(Ctx *x, int id, const Ring *r, int mb, int kind, const ExecView *plain,
                          gboolean back, gboolean accumulate)
{
  const OpInfo *o = &x->ops[r->op];
  int n = r->n;
  int64_t C = r->half;
  for (int c = 0; c < 2 * n; c++) {
    int hh, k = chunk_member(r, c, &hh), p = c / 2;
    int sk = r->members[k], sp = r->members[p];
    /* The rows view, its box moved so that the chunk's positions land in half hh. */
    if (!plain[p].buffer)
      continue;
    ExecView rv = rows_view(x, r, k, mb, kind);
    rv.box.lo[1] = (c - hh) * C;
    rv.box.hi[1] = rv.box.lo[1] + 2 * C;
    SimRegion reg = *rows_region(o, sp, kind);
    reg.lo[1] = c * C;
    reg.hi[1] = (c + 1) * C;
    int from = back ? o->dev[sk] : o->dev[sp], to = back ? o->dev[sp] : o->dev[sk];
    ExecView src = back ? rv : plain[p], dst = back ? plain[p] : rv;
    if (from == to) {
      ExecMop m = { .kind = EXEC_MOP_COPY, .a = dst, .b = src, .region = reg,
                    .accumulate = back && accumulate };
      compile_emit_mop(x, from, &m);
      continue;
    }
    int64_t tag = coll_tag(x->c->n_tasks + id * 1024, (n + 1) * n + kind * 2 * n + c);
    ExecMop s = { .kind = EXEC_MOP_SEND, .peer = to, .a = src, .region = reg };
    s.group.tag = tag;
    compile_emit_mop(x, from, &s);
    ExecMop rc = { .kind = EXEC_MOP_RECV, .peer = from, .a = dst, .region = reg,
                   .accumulate = back && accumulate };
    rc.group.tag = tag;
    compile_emit_mop(x, to, &rc);
  }
}

static ExecView block_view(Ctx *x, int op, int sh, int mb, int b)
{
  return compile_buf_view(compile_find_buf(x, EXEC_BUF_RING, x->ops[op].dev[sh], -1, op,
                                           2 * sh + b, mb));
}

/* Planes [p0, p1) of a block. */
static SimRegion planes(const ExecView *v, int p0, int p1)
{
  SimRegion r = v->box;
  r.lo[0] = p0;
  r.hi[0] = p1;
  return r;
}

/* Member @k's kernel of @phase, holding block @v computed by member @owner. */
static void emit_kernel(Ctx *x, const Ring *r, int k, int mb, ExecKernelPhase phase,
                        const ExecView *v, int owner)
{
  const OpInfo *o = &x->ops[r->op];
  int sh = r->members[k], n = r->n;
  ExecKernelArgs *a = compile_kernel_args(x, r->op, sh, mb, phase);
  ExecView *rv = own(x->c, g_new(ExecView, 1));
  *rv = *v;
  a->ring = rv;
  a->ring_lo = shard_lo(o, r->members[owner])[1];
  if (r->half) {
    /* The two-chunk layout: the attention reads and writes the member's rows buffers. */
    int64_t C = r->half;
    a->ring_half = C;
    a->ring_lo = owner * C;
    a->ring_lo2 = (2 * n - 1 - owner) * C;
    a->ring_q_lo = k * C;
    a->ring_q_lo2 = (2 * n - 1 - k) * C;
    ExecView *in = own(x->c, g_new(ExecView, o->n_in));
    ExecView *ing = own(x->c, g_new(ExecView, o->n_in));
    ExecView *out = own(x->c, g_new(ExecView, o->n_out));
    ExecView *outg = own(x->c, g_new(ExecView, o->n_out));
    for (int i = 0; i < o->n_in; i++) {
      in[i] = rows_view(x, r, k, mb, ROWS_X);
      ing[i] = a->in_grad[i].buffer ? rows_view(x, r, k, mb, ROWS_DX) : a->in_grad[i];
    }
    memcpy(out, a->out, sizeof *out * (size_t)o->n_out);
    memcpy(outg, a->out_grad, sizeof *outg * (size_t)o->n_out);
    out[0] = rows_view(x, r, k, mb, ROWS_Y);
    outg[0] = rows_view(x, r, k, mb, ROWS_DY);
    a->in = in;
    a->in_grad = ing;
    a->out = out;
    a->out_grad = outg;
    a->accumulate = FALSE;
  }
  ExecMop m = { .kind = EXEC_MOP_KERNEL, .kernel = a };
  compile_emit_mop(x, o->dev[sh], &m);
}

/* Each member's plan view of the attention's input (@kind ROWS_X), input gradient, output
 * or output gradient, and (@accumulate) whether its output adds into partial sums. */
static ExecView *plain_views(Ctx *x, const Ring *r, int mb, int kind, gboolean *accumulate)
{
  ExecView *v = own(x->c, g_new(ExecView, r->n));
  for (int k = 0; k < r->n; k++) {
    ExecKernelArgs *a = compile_kernel_args(x, r->op, r->members[k], mb, EXEC_KERNEL_RING_END);
    v[k] = kind == ROWS_X ? a->in[0] : kind == ROWS_DX ? a->in_grad[0]
           : kind == ROWS_Y ? a->out[0] : a->out_grad[0];
    if (accumulate)
      *accumulate = a->accumulate;
  }
  return v;
}

/* Member @k passes planes [p0, p1) of its block @b to the next member, which receives
 * them into its block @b2; pass @pass of the ring step @id. */
static void emit_pass(Ctx *x, int id, const Ring *r, int mb, int k, int b, int b2, int pass,
                      int p0, int p1)
{
  const OpInfo *o = &x->ops[r->op];
  int sh = r->members[k], next = r->members[(k + 1) % r->n];
  int64_t tag = coll_tag(x->c->n_tasks + id * 1024, pass * r->n + k);
  ExecView from = block_view(x, r->op, sh, mb, b), to = block_view(x, r->op, next, mb, b2);
  SimRegion reg = planes(&from, p0, p1);
  ExecMop s = { .kind = EXEC_MOP_SEND, .peer = o->dev[next], .a = from, .region = reg };
  s.group.tag = tag;
  compile_emit_mop(x, o->dev[sh], &s);
  ExecMop rc = { .kind = EXEC_MOP_RECV, .peer = o->dev[sh], .a = to, .region = reg };
  rc.group.tag = tag;
  compile_emit_mop(x, o->dev[next], &rc);
}

void compile_emit_ring(Ctx *x, int id, const Synth *s)
{
  const Ring *r = &g_array_index(x->rings, Ring, s->ring);
  const OpInfo *o = &x->ops[r->op];
  int op = r->op, mb = s->mb, n = r->n;
  gboolean fwd = s->pass == SIM_PASS_FORWARD;
  for (int k = 0; k < n; k++) {
    int sh = r->members[k];
    compile_emit_time(x, o->dev[sh], s->tasks[k], TRUE);
    if (fwd)
      compile_prepare_forward(x, op, sh, mb, s->recompute);
    else
      compile_prepare_backward(x, op, sh, mb);
  }
  if (r->half) {
    exchange_rows(x, id, r, mb, ROWS_X, plain_views(x, r, mb, ROWS_X, NULL), FALSE, FALSE);
    if (!fwd) {
      exchange_rows(x, id, r, mb, ROWS_DY, plain_views(x, r, mb, ROWS_DY, NULL), FALSE, FALSE);
      for (int k = 0; k < n; k++) {
        ExecView dx = rows_view(x, r, k, mb, ROWS_DX);
        compile_emit_fill(x, o->dev[r->members[k]], &dx, &dx.box, 0.0f);
      }
    }
  }
  for (int k = 0; k < n; k++) {
    ExecView b0 = block_view(x, op, r->members[k], mb, 0);
    emit_kernel(x, r, k, mb, fwd ? EXEC_KERNEL_RING_BEGIN : EXEC_KERNEL_RING_BACKWARD_BEGIN,
                &b0, k);
  }
  /* Step j: member k holds the block of member k - j in block buffer j % 2.  Forward the
   * blocks move n - 1 times (keys and values); backward n times (keys, values and their
   * gradients, the last pass the gradients alone), back to their owners. */
  for (int j = 0; j < n; j++) {
    int b = j % 2;
    for (int k = 0; k < n; k++) {
      ExecView v = block_view(x, op, r->members[k], mb, b);
      emit_kernel(x, r, k, mb, fwd ? EXEC_KERNEL_RING_STEP : EXEC_KERNEL_RING_BACKWARD_STEP, &v,
                  (k - j + n) % n);
    }
    if (fwd && j == n - 1)
      break;
    for (int k = 0; k < n; k++)
      emit_pass(x, id, r, mb, k, b, 1 - b, j, fwd || j < n - 1 ? EXEC_RING_K : EXEC_RING_DK,
                fwd ? EXEC_RING_DK : EXEC_RING_PLANES);
  }
  for (int k = 0; k < n; k++) {
    ExecView v = block_view(x, op, r->members[k], mb, fwd ? (n - 1) % 2 : n % 2);
    emit_kernel(x, r, k, mb, fwd ? EXEC_KERNEL_RING_END : EXEC_KERNEL_RING_BACKWARD_END, &v, k);
  }
  if (r->half) {
    /* Outputs into the plan's partial sums where it keeps them; input gradients always
     * add to what the device's other consumers contribute. */
    gboolean acc = FALSE;
    ExecView *plain = plain_views(x, r, mb, fwd ? ROWS_Y : ROWS_DX, &acc);
    exchange_rows(x, id, r, mb, fwd ? ROWS_Y : ROWS_DX, plain, TRUE, fwd ? acc : TRUE);
  }
  for (int k = 0; k < n; k++)
    compile_emit_time(x, o->dev[r->members[k]], s->tasks[k], FALSE);
}
