/* compare.c — checking a run against a reference run of the same graph: the one-device
 * strategy that a parallel plan must reproduce. */
#include "exec-private.h"

#include <math.h>
#include <string.h>

/* max |a - b| / max(max |b|, @floor); NaN anywhere counts as infinitely wrong. */
static double rel_error(const float *a, const float *b, int64_t n, double floor)
{
  double diff = 0, ref = 0;
  for (int64_t k = 0; k < n; k++) {
    if (isnan(a[k]) || isnan(b[k]))
      return INFINITY;
    diff = MAX(diff, fabs((double)a[k] - (double)b[k]));
    ref = MAX(ref, fabs((double)b[k]));
  }
  if (diff == 0)
    return 0;
  ref = MAX(ref, floor);
  return ref > 0 ? diff / ref : INFINITY;
}

static double max_abs(const float *b, int64_t n)
{
  double m = 0;
  for (int64_t k = 0; k < n; k++)
    m = MAX(m, fabs((double)b[k]));
  return m;
}

gboolean exec_run_compare(ExecRun *run, ExecRun *reference, ExecDiff *out, GError **error)
{
  const SimGraph *g = sim_plan_get_graph(exec_run_get_plan(run));
  const SimGraph *gr = sim_plan_get_graph(exec_run_get_plan(reference));
  memset(out, 0, sizeof *out);
  if (sim_graph_n_ops(g) != sim_graph_n_ops(gr)) {
    g_set_error(error, EXEC_ERROR, EXEC_ERROR_MISMATCH,
                "the runs are of different graphs (%d and %d operators)", sim_graph_n_ops(g),
                sim_graph_n_ops(gr));
    return FALSE;
  }
  double la = exec_run_loss(run), lb = exec_run_loss(reference);
  out->loss = isnan(la) || isnan(lb) ? INFINITY
              : la == lb              ? 0
                                      : fabs(la - lb) / MAX(fabs(lb), 1e-30);
  /* Gradients that are exactly zero in theory (a bias before batch norm, attention's key
   * bias: softmax ignores a constant added to a row) are rounding noise in both runs;
   * they are measured against a hundredth of the model's largest gradient instead. */
  double gmax = 0;
  for (int pass = 0; pass < 2; pass++) {
    double worst = -1;
    for (int op = 0; op < sim_graph_n_ops(g); op++) {
      /* An op's own weights: all of them, or those beside the ones it shares. */
      int owner = sim_graph_op_weight_owner(g, op);
      int first = owner == op ? 0 : sim_graph_op_n_weights(g, owner);
      for (int i = first; i < sim_graph_op_n_weights(g, op); i++) {
        SimShape s = sim_graph_op_weight_shape(g, op, i);
        int64_t n = sim_shape_numel(&s);
        g_autofree float *a = g_new(float, MAX(n, 1));
        g_autofree float *b = g_new(float, MAX(n, 1));
        for (int grad = pass == 0; grad < 2; grad++) {
          gboolean ok = grad ? exec_run_read_grad(run, op, i, a, error) &&
                                 exec_run_read_grad(reference, op, i, b, error)
                             : exec_run_read_weight(run, op, i, a, error) &&
                                 exec_run_read_weight(reference, op, i, b, error);
          if (!ok)
            return FALSE;
          if (pass == 0) {
            gmax = MAX(gmax, max_abs(b, n));
            continue;
          }
          double e = rel_error(a, b, n, grad ? 1e-2 * gmax : 0);
          if (grad)
            out->grads = MAX(out->grads, e);
          else
            out->weights = MAX(out->weights, e);
          if (e > worst) {
            worst = e;
            g_snprintf(out->worst, sizeof out->worst, "%s of op '%s' #%d",
                       grad ? "gradient" : "weight", sim_graph_op_name(g, op), i);
          }
        }
      }
    }
  }
  return TRUE;
}

SimStrategy *exec_reference_strategy(const SimPlan *plan, const SimMachine *m, GError **error)
{
  const SimGraph *g = sim_plan_get_graph(plan);
  const SimStrategy *s = sim_plan_get_strategy(plan);
  g_autoptr(SimStrategy) ref = sim_strategy_new(g, m);
  sim_strategy_set_microbatches(ref, sim_plan_microbatches(plan));
  int chunks;
  SimSchedule sched = sim_strategy_get_schedule(s, &chunks);
  sim_strategy_set_schedule(ref, sched == SIM_SCHEDULE_INTERLEAVED ? SIM_SCHEDULE_1F1B : sched, 1);
  SimMemoryOptions mo = sim_strategy_get_memory(s);
  mo.recompute = SIM_RECOMPUTE_NONE;
  mo.zero1 = mo.zero2 = mo.zero3 = FALSE;
  sim_strategy_set_memory(ref, &mo);
  if (!sim_strategy_validate(ref, g, m, error))
    return NULL;
  return g_steal_pointer(&ref);
}
