/* summary.c — what a plan is, in the words of Megatron's plan space: the tensor-, context-,
 * pipeline-, data- and expert-parallel degrees, the micro-batches, the schedule, sequence parallelism,
 * recomputation, ZeRO-1 and the gradient buckets, and for a plan that splits its
 * operators differently (a per-operator search's), how many operators each kind of split
 * takes. */
#include "search-private.h"

#include <string.h>

void search_plan_summarize(const SimGraph *g, const SimStrategy *s, SearchPlanSummary *out)
{
  g_return_if_fail(g != NULL && s != NULL && out != NULL);
  memset(out, 0, sizeof *out);
  int chunks = 1;
  out->schedule = sim_strategy_get_schedule(s, &chunks);
  out->chunks = out->schedule == SIM_SCHEDULE_INTERLEAVED ? MAX(chunks, 1) : 1;
  out->pp = MAX(1, sim_strategy_n_stages(s) / out->chunks);
  out->microbatches = MAX(1, sim_strategy_get_microbatches(s));
  out->sequence_parallel = sim_strategy_get_sequence_parallel(s);
  out->tp_comm_overlap = sim_strategy_get_tp_comm_overlap(s);
  SimMemoryOptions mem = sim_strategy_get_memory(s);
  out->recompute = mem.recompute;
  out->zero1 = mem.zero1;
  out->zero = mem.zero3 ? 3 : mem.zero2 ? 2 : mem.zero1 ? 1 : 0;
  out->offload = mem.offload;
  out->bucket_bytes = sim_strategy_get_sync(s).bucket_bytes;
  out->tp = out->dp = out->ep = 1;
  out->cp = MAX(1, sim_strategy_get_context_parallel(s));
  int n_ops = sim_graph_n_ops(g);
  int *data = g_new(int, MAX(n_ops, 1)), *tensor = g_new(int, MAX(n_ops, 1));
  for (int op = 0; op < n_ops; op++) {
    const int *deg = sim_strategy_op_degrees(s, op);
    int d = 1, t = 1, r = 1, a = 1;
    for (int k = 0; deg && k < sim_graph_op_n_dims(g, op); k++) {
      switch (sim_graph_op_dim_role(g, op, k)) {
      case SIM_ROLE_SAMPLE:
        d *= deg[k];
        break;
      case SIM_ROLE_PARAMETER:
        t *= deg[k];
        break;
      case SIM_ROLE_REDUCTION:
        r *= deg[k];
        break;
      default:
        a *= deg[k];
        break;
      }
    }
    data[op] = d;
    /* The context ranks' split of the positions is not tensor parallelism. */
    tensor[op] = t * r * (out->cp > 1 && a % out->cp == 0 ? a / out->cp : a);
    out->dp = MAX(out->dp, d);
    out->n_ops++;
    if (d > 1)
      out->ops_data++;
    if (t > 1)
      out->ops_parameter++;
    if (r > 1)
      out->ops_reduction++;
    if (a > 1)
      out->ops_attribute++;
    if (d * t * r * a == 1)
      out->ops_unsplit++;
  }
  /* The tensor-parallel degree of the other operators, for the experts' own layout. */
  int tp_rest = 1;
  for (int op = 0; op < n_ops; op++)
    if (sim_graph_op_type(g, op) != SIM_OP_MOE)
      tp_rest = MAX(tp_rest, tensor[op]);
  /* Expert parallelism: a mixture-of-experts operator over fewer sample groups than the
   * replicas, its experts split over the rest; or laid out in Megatron-Core's expert
   * groups of its own degrees: its sample groups times its expert and width splits make
   * the replicas times the tensor-parallel ranks, ep x etp a multiple of tp (expert tensor
   * parallelism other than tp). */
  int etp = 0;
  for (int op = 0; op < n_ops; op++) {
    const int *deg = sim_strategy_op_degrees(s, op);
    int x = -1, f = -1;
    for (int k = 0; deg && k < sim_graph_op_n_dims(g, op); k++) {
      if (!strcmp(sim_graph_op_dim_name(g, op, k), "x"))
        x = k;
      else if (!strcmp(sim_graph_op_dim_name(g, op, k), "f"))
        f = k;
    }
    if (sim_graph_op_type(g, op) != SIM_OP_MOE || x < 0)
      continue;
    int fd = f >= 0 ? deg[f] : 1;
    if (fd != tp_rest && (int64_t)data[op] * deg[x] * fd == (int64_t)out->dp * tp_rest &&
        (deg[x] * fd) % tp_rest == 0) {
      out->ep = MAX(out->ep, deg[x]);
      etp = etp == 0 || etp == fd ? fd : -1;
      data[op] = out->dp;
      tensor[op] = tp_rest;
      continue;
    }
    if (data[op] >= out->dp || out->dp % data[op] != 0 || deg[x] % (out->dp / data[op]) != 0)
      continue;
    int ep = out->dp / data[op];
    out->ep = MAX(out->ep, ep);
    data[op] = out->dp;
    tensor[op] /= ep;
  }
  for (int op = 0; op < n_ops; op++)
    out->tp = MAX(out->tp, tensor[op]);
  out->etp = etp > 0 ? etp : out->tp;
  /* Megatron-style: every operator split over the replicas alike, and over the tensor-
   * parallel ranks or not at all. */
  out->uniform = TRUE;
  for (int op = 0; op < n_ops; op++)
    if (data[op] != out->dp || (tensor[op] != 1 && tensor[op] != out->tp))
      out->uniform = FALSE;
  if (etp < 0)
    out->uniform = FALSE; /* experts split in different ways */
  g_free(data);
  g_free(tensor);
  int64_t batch = sim_graph_batch_size(g);
  int64_t per = (int64_t)out->dp * out->microbatches;
  out->microbatch_size = batch > 0 && batch % per == 0 ? batch / per : 0;
}

char *search_plan_summary_text(const SearchPlanSummary *p)
{
  g_return_val_if_fail(p != NULL, NULL);
  GString *t = g_string_new(NULL);
  g_string_append_printf(t, "TP %d, ", p->tp);
  if (p->cp > 1)
    g_string_append_printf(t, "CP %d, ", p->cp);
  g_string_append_printf(t, "PP %d, DP %d, ", p->pp, p->dp);
  if (p->ep > 1)
    g_string_append_printf(t, "EP %d, ", p->ep);
  if (p->etp > 0 && p->etp != p->tp)
    g_string_append_printf(t, "ETP %d, ", p->etp);
  g_string_append_printf(t, "%d micro-batch%s", p->microbatches,
                         p->microbatches == 1 ? "" : "es");
  if (p->microbatch_size > 0)
    g_string_append_printf(t, " of %" G_GINT64_FORMAT, p->microbatch_size);
  g_string_append_printf(t, ", %s", sim_schedule_name(p->schedule));
  if (p->schedule == SIM_SCHEDULE_INTERLEAVED)
    g_string_append_printf(t, ":%d", p->chunks);
  if (p->sequence_parallel)
    g_string_append(t, p->tp_comm_overlap ? ", SP with TP overlap" : ", SP");
  if (p->recompute != SIM_RECOMPUTE_NONE)
    g_string_append_printf(t, ", recompute %s", sim_recompute_name(p->recompute));
  if (p->zero > 1)
    g_string_append_printf(t, ", ZeRO-%d", p->zero);
  else if (p->zero1)
    g_string_append(t, ", ZeRO-1");
  if (p->offload >= 1)
    g_string_append(t, ", optimizer offloaded");
  else if (p->offload > 0)
    g_string_append_printf(t, ", %.0f%% of the optimizer offloaded", 100 * p->offload);
  if (p->bucket_bytes > 0)
    g_string_append_printf(t, ", buckets %.0f MiB", (double)p->bucket_bytes / 1048576.0);
  else
    g_string_append(t, ", no buckets");
  if (!p->uniform)
    g_string_append_printf(t, "; per operator (%d): %d split over samples, %d over "
                           "parameters, %d over reductions, %d over other dimensions, "
                           "%d unsplit", p->n_ops, p->ops_data, p->ops_parameter,
                           p->ops_reduction, p->ops_attribute, p->ops_unsplit);
  return g_string_free(t, FALSE);
}
