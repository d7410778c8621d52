/* simulate.c — the library from C: builds a model of the zoo, loads a machine, plans data
 * parallelism over all its GPUs, simulates one training iteration and prints the report's
 * headline figures.
 *
 *   cc simulate.c $(pkg-config --cflags --libs parasol) -o simulate
 *   ./simulate [MODEL [MACHINE]]        (default: resnet-50 on dgx-a100)
 *
 * MODEL is a zoo name or a graph file, MACHINE a library name or a machine file (with :N
 * for N nodes).  Exit status 0, or 2 with a message on bad input. */
#include <parasol/parasol.h>

#include <stdio.h>

int main(int argc, char **argv)
{
  const char *model = argc > 1 ? argv[1] : "resnet-50";
  const char *machine = argc > 2 ? argv[2] : "dgx-a100";
  GError *error = NULL;
  SimGraph *g = NULL;
  SimMachine *m = NULL;
  SimStrategy *s = NULL;
  SimCostModel *cost = NULL;
  SimReport *r = NULL;
  int status = 2;

  /* A zoo model comes in fp16, as `parasol simulate` trains it by default (--precision
   * mixed-fp16: activations and weights in fp16, master weights and optimizer state in
   * fp32); sim_graph_set_float_dtype() chooses another. */
  g = sim_model_load(model, NULL, &error);
  if (!g)
    goto out;
  m = sim_machine_load(machine, &error);
  if (!m)
    goto out;
  /* `parasol simulate`'s default plan (cli/sim-options.c): every GPU a data-parallel
   * replica, one micro-batch, gradients all-reduced in 25 MB buckets (PyTorch DDP's)
   * during the backward pass. */
  SimMegatronOptions mo = sim_megatron_options_default();
  mo.dp = sim_machine_n_devices(m);
  mo.microbatches = 1;
  mo.sync.bucket_bytes = 25000000;
  s = sim_strategy_megatron(g, m, &mo, &error);
  if (!s)
    goto out;
  SimRooflineParams rp = sim_roofline_params_default();
  cost = sim_cost_model_new_roofline(&rp);
  SimOptions o = sim_options_default();
  r = sim_simulate(g, m, s, cost, &o, &error);
  if (!r)
    goto out;
  printf("parasol %s: %s on %s (%d GPUs), data parallel\n", PARASOL_VERSION_STRING,
         sim_graph_get_name(g), sim_machine_get_name(m), sim_machine_n_devices(m));
  printf("iteration %.3f ms, %.1f samples/s, peak memory %.2f GiB, %s\n",
         sim_report_iteration_time(r) * 1e3, sim_report_throughput(r),
         (double)sim_report_max_peak_memory(r) / (1 << 30),
         sim_report_fits(r) ? "fits" : "OUT OF MEMORY");
  status = 0;
out:
  if (error) {
    fprintf(stderr, "simulate: %s\n", error->message);
    g_error_free(error);
  }
  if (r)
    sim_report_free(r);
  if (cost)
    sim_cost_model_free(cost);
  if (s)
    sim_strategy_free(s);
  if (m)
    sim_machine_free(m);
  if (g)
    sim_graph_free(g);
  return status;
}
