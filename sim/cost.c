/* cost.c — the cost-model interface: how long a kernel or an operator shard takes.
 *
 * Cost models stack.  A model that knows some operators exactly (a profile database) sits
 * on top and hands what it does not know to its fallback (the roofline model), which
 * always answers.  The stack owns its fallback: sim_cost_model_free() finalizes and frees a
 * model and then, recursively, the model it falls back to.  A model built outside libsim
 * (profile/) is allocated with g_new0(SimCostModel, 1), since sim_cost_model_free() releases
 * it with g_free(). */
#include "sim-private.h"

void sim_cost_model_free(SimCostModel *m)
{
  while (m) {
    SimCostModel *next = m->fallback;
    if (m->klass && m->klass->finalize)
      m->klass->finalize(m);
    g_free(m);
    m = next;
  }
}

double sim_cost_model_kernel_time(SimCostModel *m, const SimDeviceSpec *dev, const SimKernel *k)
{
  g_return_val_if_fail(m != NULL && m->klass != NULL && m->klass->kernel_time != NULL, -1.0);
  g_return_val_if_fail(dev != NULL && k != NULL, -1.0);
  return m->klass->kernel_time(m, dev, k);
}

/* The sum of @m's own kernel times over the work of the shard. */
static double price_kernels(SimCostModel *m, const SimDeviceSpec *dev, const SimGraph *g, int op,
                            const int64_t *extent, SimPass pass)
{
  SimWork work = { 0 };
  sim_graph_op_work(g, op, extent, pass, &work);
  double sum = 0.0;
  for (int i = 0; i < work.n; i++)
    sum += m->klass->kernel_time(m, dev, &work.k[i]);
  return sum;
}

/* The contract of SimCostModelClass.op_time: a model without op_time prices the kernels
 * of the work itself; a model whose op_time answers negative hands the whole shard to its
 * fallback (which may know the operator, or else prices the kernels), and prices the
 * kernels itself only when it has no fallback. */
double sim_cost_model_op_time(SimCostModel *m, const SimDeviceSpec *dev, const SimGraph *g,
                              int op, const int64_t *extent, SimPass pass)
{
  g_return_val_if_fail(m != NULL && m->klass != NULL && m->klass->kernel_time != NULL, -1.0);
  g_return_val_if_fail(dev != NULL && g != NULL, -1.0);
  g_return_val_if_fail(op >= 0 && op < sim_graph_n_ops(g), -1.0);

  if (m->klass->op_time) {
    double t = m->klass->op_time(m, dev, g, op, extent, pass);
    if (t >= 0.0)
      return t;
    if (m->fallback)
      return sim_cost_model_op_time(m->fallback, dev, g, op, extent, pass);
  }
  return price_kernels(m, dev, g, op, extent, pass);
}
