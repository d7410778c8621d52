/* test-engine.c — the event engine, the network and the collectives against closed forms.
 *
 * The machine: 8 GPUs on one NVSwitch, each with 100 GB/s per direction to the switch
 * and 1 us latency per link, so a GPU-to-GPU route has 2 links, 100 GB/s and 2 us.
 * Collectives run at full link bandwidth (efficiency 1) and 3 us per step, so that the
 * expectations below are plain arithmetic.
 *
 * About 1,100 lines: one program per module (tests/meson.build); the engine, the
 * network and the collectives share the machine above. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "taskgraph.h"
#include "collective.h"
#include "network.h"
#include "engine.h"

static const char *machine_json =
  "{ \"format\": \"parasol-machine\", \"version\": 1, \"name\": \"test-switch\","
  "  \"node\": { \"gpu\": \"a100-80gb\", \"gpus\": 8,"
  "    \"fabric\": { \"type\": \"nvswitch\", \"bandwidth_GBps\": 100, \"latency_us\": 1 },"
  "    \"pcie\": { \"bandwidth_GBps\": 16, \"latency_us\": 1, \"sockets\": 1, \"switches\": 1 } },"
  "  \"count\": 1 }";

static SimMachine *machine;
static const double B = 100e9, L = 2e-6;
static const SimCollParams cp = { .bandwidth_efficiency = 1.0, .step_latency = 3e-6 };

static void setup(void)
{
  GError *error = NULL;
  machine = sim_machine_from_json(machine_json, "test-switch.json", 0, &error);
  cr_assert_not_null(machine, "%s", error ? error->message : "");
  cr_assert_float_eq(sim_machine_bandwidth(machine, 0, 1), B, 1);
  cr_assert_float_eq(sim_machine_latency(machine, 0, 1), L, 1e-12);
}

static void teardown(void)
{
  sim_machine_free(machine);
}

TestSuite(engine, .init = setup, .fini = teardown);

static double run(SimTaskGraph *tg, SimTimeline *tl)
{
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(machine, NULL);
  sim_engine_run(e, tg, tl);
  sim_engine_free(e);
  cr_assert_not(tl->deadlock);
  return tl->makespan;
}

Test(engine, one_transfer_over_one_route)
{
  /* 1 GB from GPU 0 to GPU 1: 2 us of latency + 1e9 / 100e9 s = 10.002 ms. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e9, -1, 0);
  sim_taskgraph_add(tg, b, &f);
  SimTimeline tl = { 0 };
  cr_assert_float_eq(run(tg, &tl), 2e-6 + 1e-2, 1e-12);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, two_transfers_share_a_link)
{
  /* 0->1 and 0->2 share GPU 0's uplink: 50 GB/s each, so 1 GB takes 20 ms + 2 us; a third
   * transfer 3->4 shares nothing and takes 10 ms + 2 us. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask f1 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e9, -1, 0);
  SimTask f2 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 2, 1e9, -1, 0);
  SimTask f3 = sim_task_flow(SIM_CLASS_TRANSFER, 3, 4, 1e9, -1, 0);
  SimTaskRef r1 = sim_taskgraph_add(tg, b, &f1);
  SimTaskRef r2 = sim_taskgraph_add(tg, b, &f2);
  SimTaskRef r3 = sim_taskgraph_add(tg, b, &f3);
  SimTimeline tl = { 0 };
  run(tg, &tl);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r1)], 2e-6 + 2e-2, 1e-12);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r2)], 2e-6 + 2e-2, 1e-12);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r3)], 2e-6 + 1e-2, 1e-12);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, a_flow_speeds_up_when_its_neighbour_ends)
{
  /* 0->1 with 1 GB and 0->2 with 0.5 GB share GPU 0's uplink at 50 GB/s each.  The small
   * one ends after 2 us + 0.5e9/50e9 = 10.002 ms; the big one has then 0.5 GB left, which
   * it sends alone at 100 GB/s in 5 ms more: 15.002 ms. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask f1 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e9, -1, 0);
  SimTask f2 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 2, 0.5e9, -1, 0);
  SimTaskRef r1 = sim_taskgraph_add(tg, b, &f1);
  SimTaskRef r2 = sim_taskgraph_add(tg, b, &f2);
  SimTimeline tl = { 0 };
  run(tg, &tl);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r2)], 2e-6 + 1e-2, 1e-12);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r1)], 2e-6 + 1.5e-2, 1e-12);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, a_flow_slows_down_when_a_neighbour_joins)
{
  /* 0->1 with 1 GB starts at once and sends alone at 100 GB/s from 2 us.  0->2 with 0.25 GB
   * waits for a 5 ms kernel on GPU 3 and joins GPU 0's uplink at 5.002 ms, when the big
   * one has 0.5 GB left: both run at 50 GB/s, the small one ends 5 ms later (10.002 ms),
   * the big one has then 0.25 GB left, which it sends alone in 2.5 ms: 12.502 ms.  Its
   * end moves later when the neighbour joins, then earlier when it leaves. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask f1 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e9, -1, 0);
  SimTask k = sim_task_compute(SIM_CLASS_FORWARD, 3, -1, 0, 0, 5e-3);
  SimTask f2 = sim_task_flow(SIM_CLASS_TRANSFER, 0, 2, 0.25e9, -1, 0);
  SimTaskRef r1 = sim_taskgraph_add(tg, b, &f1);
  SimTaskRef rk = sim_taskgraph_add(tg, b, &k);
  SimTaskRef r2 = sim_taskgraph_add(tg, b, &f2);
  sim_taskgraph_stream_add(tg, b, 3, 1, rk.index);
  sim_taskgraph_depend(tg, b, rk, r2);
  SimTimeline tl = { 0 };
  run(tg, &tl);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r2)], 5e-3 + 2e-6 + 5e-3, 1e-12);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, r1)], 2e-6 + 1.25e-2, 1e-12);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, compute_stream_runs_in_order_and_overlaps_communication)
{
  /* GPU 0 runs A (1 ms) then B (2 ms) in stream order even though B is declared first;
   * a 1 GB flow 0->1 after A overlaps B: it ends at 1 ms + 10.002 ms. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask tb = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 0, 2e-3);
  SimTask ta = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 0, 1e-3);
  SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e9, -1, 0);
  SimTaskRef rb = sim_taskgraph_add(tg, b, &tb);
  SimTaskRef ra = sim_taskgraph_add(tg, b, &ta);
  SimTaskRef rf = sim_taskgraph_add(tg, b, &f);
  sim_taskgraph_stream_add(tg, b, 0, 2, rb.index);
  sim_taskgraph_stream_add(tg, b, 0, 1, ra.index);
  sim_taskgraph_depend(tg, b, ra, rf);
  SimTimeline tl = { 0 };
  run(tg, &tl);
  cr_assert_float_eq(tl.start[sim_taskgraph_id(tg, ra)], 0, 1e-15);
  cr_assert_float_eq(tl.start[sim_taskgraph_id(tg, rb)], 1e-3, 1e-15);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, rb)], 3e-3, 1e-15);
  cr_assert_float_eq(tl.end[sim_taskgraph_id(tg, rf)], 1e-3 + 2e-6 + 1e-2, 1e-12);
  cr_assert_float_eq(tl.makespan, 1e-3 + 2e-6 + 1e-2, 1e-12);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

/* Assembles and runs @tg (which it frees) with the host times and blocking sends of @o. */
static SimTimeline run_with(SimTaskGraph *tg, const SimOptions *o)
{
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(machine, NULL);
  sim_engine_set_host_times(e, o);
  SimTimeline tl = { 0 };
  sim_engine_run(e, tg, &tl);
  cr_assert_not(tl.deadlock);
  sim_engine_free(e);
  sim_taskgraph_free(tg);
  return tl;
}

/* One GPU runs forward mb 0, forward mb 1, backward mb 0, backward mb 1 (1, 1, 2, 2 ms;
 * 1, 1, 2, 2 kernels) in stream order, with the host issuing each kernel in @kernel
 * seconds and spending @step seconds before the first kernel of each step. */
static SimTimeline host_bound(double kernel, double step)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTaskClass cls[4] = { SIM_CLASS_FORWARD, SIM_CLASS_FORWARD, SIM_CLASS_BACKWARD,
                          SIM_CLASS_BACKWARD };
  int mb[4] = { 0, 1, 0, 1 };
  for (int i = 0; i < 4; i++) {
    SimTask t = sim_task_compute(cls[i], 0, -1, 0, mb[i], i < 2 ? 1e-3 : 2e-3);
    t.n_kernels = i < 2 ? 1 : 2;
    SimTaskRef r = sim_taskgraph_add(tg, b, &t);
    sim_taskgraph_stream_add(tg, b, 0, (uint64_t)i, r.index);
  }
  SimOptions o = sim_options_default();
  o.host_kernel_time = kernel;
  o.host_step_time = step;
  return run_with(tg, &o);
}

Test(engine, host_issue_and_step_times)
{
  /* The host runs ahead: with 0.1 ms per kernel it issues the kernels at 0.1, 0.2, 0.4
   * and 0.6 ms, so only the first waits: 0.1 ms + 6 ms of work. */
  SimTimeline tl = host_bound(1e-4, 0);
  cr_assert_float_eq(tl.makespan, 6.1e-3, 1e-12);
  sim_timeline_clear(&tl);
  /* 5 ms between steps, each step its own: issued at 5.1, 10.2, 15.4 and 20.6 ms, the
   * host bounds every task: 20.6 + 2 = 22.6 ms. */
  tl = host_bound(1e-4, 5e-3);
  double start[4] = { 5.1e-3, 10.2e-3, 15.4e-3, 20.6e-3 };
  for (int i = 0; i < 4; i++)
    cr_assert_float_eq(tl.start[i], start[i], 1e-12, "task %d at %g", i, tl.start[i]);
  cr_assert_float_eq(tl.makespan, 22.6e-3, 1e-12);
  sim_timeline_clear(&tl);
  /* 0.5 ms between steps hides behind the device's work: issued at 0.6, 1.2, 1.9 and
   * 2.6 ms, the first task alone waits: 0.6 + 6 = 6.6 ms. */
  tl = host_bound(1e-4, 5e-4);
  cr_assert_float_eq(tl.makespan, 6.6e-3, 1e-12);
  sim_timeline_clear(&tl);
}

/* GPU 0 runs A (1 ms) and then B (1 ms); A's output, 100 MB, goes to GPU 1 (2 us + 1 ms
 * at 100 GB/s), where C (1 ms) reads it.  Host times are 0 or 10 us a kernel. */
static SimTimeline send_then_compute(gboolean blocking, double host)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTask ta = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 0, 1e-3);
  SimTask tb = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 1, 1e-3);
  SimTask tc = sim_task_compute(SIM_CLASS_FORWARD, 1, -1, 0, 0, 1e-3);
  ta.n_kernels = tb.n_kernels = tc.n_kernels = 1;
  SimTask tf = sim_task_flow(SIM_CLASS_TRANSFER, 0, 1, 1e8, -1, 0);
  SimTaskRef ra = sim_taskgraph_add(tg, b, &ta), rb = sim_taskgraph_add(tg, b, &tb);
  SimTaskRef rc = sim_taskgraph_add(tg, b, &tc), rf = sim_taskgraph_add(tg, b, &tf);
  sim_taskgraph_depend(tg, b, ra, rf);
  sim_taskgraph_depend(tg, b, rf, rc);
  sim_taskgraph_stream_add(tg, b, 0, 1, ra.index);
  sim_taskgraph_stream_add(tg, b, 0, 2, rb.index);
  sim_taskgraph_stream_add(tg, b, 1, 1, rc.index);
  SimOptions o = sim_options_default();
  o.host_kernel_time = host;
  o.blocking_sends = blocking;
  return run_with(tg, &o);
}

Test(engine, blocking_sends_hold_the_senders_stream)
{
  /* Asynchronous: B runs 1-2 ms beside the transfer (1 ms + 2 us), C 2.002-3.002 ms. */
  SimTimeline tl = send_then_compute(FALSE, 0);
  cr_assert_float_eq(tl.start[1], 1e-3, 1e-12);
  cr_assert_float_eq(tl.start[2], 2.002e-3, 1e-12);
  cr_assert_float_eq(tl.makespan, 3.002e-3, 1e-12);
  sim_timeline_clear(&tl);
  /* Blocking: B waits for the transfer's end, 2.002 ms, and ends at 3.002 ms with C. */
  tl = send_then_compute(TRUE, 0);
  cr_assert_float_eq(tl.start[1], 2.002e-3, 1e-12);
  cr_assert_float_eq(tl.end[1], 3.002e-3, 1e-12);
  cr_assert_float_eq(tl.start[2], 2.002e-3, 1e-12);
  sim_timeline_clear(&tl);
  /* With 10 us a kernel, A is issued at 10 us; the host that waited for the send issues
   * B at 2.012 + 0.010 ms: it starts at 2.022 ms, where the running-ahead host had it
   * ready at 1.010 ms. */
  tl = send_then_compute(FALSE, 1e-5);
  cr_assert_float_eq(tl.start[1], 1.01e-3, 1e-12);
  sim_timeline_clear(&tl);
  tl = send_then_compute(TRUE, 1e-5);
  cr_assert_float_eq(tl.start[1], 2.022e-3, 1e-12);
  sim_timeline_clear(&tl);
}

Test(engine, memory_peak_follows_allocations)
{
  /* A allocates 3 GB and frees 1 GB at its end, B allocates 2 GB: the peak is 3 + 2 - 1 = 4 GB
   * above the 5 GB of static memory. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  tg->static_mem[0] = 5000000000;
  int b = sim_taskgraph_block_new(tg);
  SimTask ta = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 0, 1e-3);
  ta.mem_alloc = 3000000000;
  ta.mem_free = 1000000000;
  SimTask tb = sim_task_compute(SIM_CLASS_FORWARD, 0, -1, 0, 0, 1e-3);
  tb.mem_alloc = 2000000000;
  SimTaskRef ra = sim_taskgraph_add(tg, b, &ta);
  SimTaskRef rb = sim_taskgraph_add(tg, b, &tb);
  sim_taskgraph_stream_add(tg, b, 0, 1, ra.index);
  sim_taskgraph_stream_add(tg, b, 0, 2, rb.index);
  SimTimeline tl = { 0 };
  run(tg, &tl);
  cr_assert_eq(tl.peak_mem[0], 9000000000);
  cr_assert_eq(tl.peak_mem[1], 0);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

static double ring_closed_form(int n, double S, int steps)
{
  return steps * (L + cp.step_latency) + steps * (S / n) / B;
}

static void check_collective(SimCollKind kind, SimDetail detail, int n, double S, int steps)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  SimTaskRef start, end;
  SimCollective coll = { .kind = kind, .algo = SIM_ALLREDUCE_RING, .detail = detail, .params = &cp,
                         .cls = SIM_CLASS_GRAD_SYNC, .devices = dev, .n = n, .bytes = S, .op = -1,
                         .mb = -1 };
  sim_collective_lower(tg, b, machine, &coll, &start, &end);
  SimTimeline tl = { 0 };
  double t = run(tg, &tl);
  double expect = ring_closed_form(n, S, steps);
  cr_assert_float_eq(t, expect, expect * 1e-9, "n=%d detail=%d: %g vs %g", n, detail, t, expect);
  cr_assert_float_eq(sim_collective_time(machine, kind, SIM_ALLREDUCE_RING, &cp, dev, n, S),
                     expect, expect * 1e-9);
  /* Every byte sent arrives: the flows carry steps * S / n per rank (a whole
   * collective's one flow carries it for each of its members). */
  double sent = 0;
  for (int i = 0; i < tg->n_tasks; i++)
    if (tg->task[i].kind == SIM_TASK_FLOW) {
      sent += tg->task[i].bytes * (tg->task[i].n_links ? tg->task[i].n_members : 1);
      cr_assert_geq(tl.end[i], tl.start[i]);
    }
  cr_assert_float_eq(sent, steps * S, S * 1e-9);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, ring_allreduce_closed_form)
{
  /* 2(n-1)/n * S/B + 2(n-1) * (latency + step latency), at both levels of detail:
   * for n = 8 and S = 1 GB, 14 * 5 us + 1.75 * 10 ms = 17.57 ms. */
  for (int n = 2; n <= 8; n++) {
    check_collective(SIM_COLL_ALLREDUCE, SIM_DETAIL_STEPS, n, 1e9, 2 * (n - 1));
    check_collective(SIM_COLL_ALLREDUCE, SIM_DETAIL_FLOWS, n, 1e9, 2 * (n - 1));
    check_collective(SIM_COLL_ALLREDUCE, SIM_DETAIL_COLLECTIVE, n, 1e9, 2 * (n - 1));
  }
  cr_assert_float_eq(ring_closed_form(8, 1e9, 14), 14 * 5e-6 + 1.75e-2, 1e-12);
}

Test(engine, reduce_scatter_and_all_gather_closed_form)
{
  /* Half an all-reduce each: (n-1)/n * S/B + (n-1) * (latency + step latency). */
  for (int n = 2; n <= 8; n++) {
    check_collective(SIM_COLL_REDUCE_SCATTER, SIM_DETAIL_STEPS, n, 2e8, n - 1);
    check_collective(SIM_COLL_ALLGATHER, SIM_DETAIL_FLOWS, n, 2e8, n - 1);
    check_collective(SIM_COLL_ALLGATHER, SIM_DETAIL_COLLECTIVE, n, 2e8, n - 1);
  }
}

Test(engine, a_bare_collective_times_like_one_between_join_points)
{
  /* Two producers (1 ms on GPUs 0 and 1), an all-reduce of S = 1 GB over {0, 1, 2, 3} at
   * the collective level of detail, a consumer (1 ms on GPU 2): 1 ms + 6 * (L + a) +
   * 1.5 * S / B + 1 ms = 17.03 ms, with join points around the flow (2 producers, 2 join
   * points, 1 flow, 1 consumer: 6 tasks) or without (4 tasks); with a fixed cost of 50 us
   * per collective, a delay starts it (7 and 5 tasks) and the time grows by 50 us. */
  int dev[4] = { 0, 1, 2, 3 };
  for (int base = 0; base < 2; base++)
    for (int bare = 0; bare < 2; bare++) {
      SimCollParams p = cp;
      p.base_latency = base ? 50e-6 : 0;
      SimTaskGraph *tg = sim_taskgraph_new(8);
      int b = sim_taskgraph_block_new(tg);
      SimTask c0 = sim_task_compute(SIM_CLASS_FORWARD, 0, 0, 0, 0, 1e-3);
      SimTask c1 = sim_task_compute(SIM_CLASS_FORWARD, 1, 0, 1, 0, 1e-3);
      SimTask c2 = sim_task_compute(SIM_CLASS_FORWARD, 2, 1, 0, 0, 1e-3);
      SimTaskRef r0 = sim_taskgraph_add(tg, b, &c0), r1 = sim_taskgraph_add(tg, b, &c1);
      SimTaskRef r2 = sim_taskgraph_add(tg, b, &c2);
      sim_taskgraph_stream_add(tg, b, 0, 0, r0.index);
      sim_taskgraph_stream_add(tg, b, 1, 0, r1.index);
      sim_taskgraph_stream_add(tg, b, 2, 0, r2.index);
      SimTaskRef start, end;
      SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = SIM_ALLREDUCE_RING,
                             .detail = SIM_DETAIL_COLLECTIVE, .params = &p,
                             .cls = SIM_CLASS_REDUCTION, .devices = dev, .n = 4, .bytes = 1e9,
                             .op = -1, .mb = 0 };
      (bare ? sim_collective_lower_bare : sim_collective_lower)(tg, b, machine, &coll, &start,
                                                                &end);
      sim_taskgraph_depend(tg, b, r0, start);
      sim_taskgraph_depend(tg, b, r1, start);
      sim_taskgraph_depend(tg, b, end, r2);
      SimTimeline tl = { 0 };
      double t = run(tg, &tl);
      double expect = 2e-3 + 6 * (L + cp.step_latency) + 1.5 * 1e9 / B + p.base_latency;
      cr_assert_float_eq(t, expect, expect * 1e-12, "base %d bare %d: %.9g vs %.9g", base,
                         bare, t, expect);
      cr_assert_eq(tg->n_tasks, (bare ? 4 : 6) + base, "base %d bare %d: %d tasks", base,
                   bare, tg->n_tasks);
      sim_timeline_clear(&tl);
      sim_taskgraph_free(tg);
    }
}

Test(engine, concurrent_collectives_share_links)
{
  /* Two all-reduces over {0,1} and {0,2} at once: each sends S on GPU 0's uplink, which
   * they share, so the bandwidth term doubles: 2 * (L + a) + 2 * S / B for each. */
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  int g1[2] = { 0, 1 }, g2[2] = { 0, 2 };
  SimTaskRef s1, e1, s2, e2;
  double S = 1e9;
  SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = SIM_ALLREDUCE_RING,
                         .detail = SIM_DETAIL_FLOWS, .params = &cp, .cls = SIM_CLASS_GRAD_SYNC,
                         .devices = g1, .n = 2, .bytes = S, .op = -1, .mb = -1 };
  sim_collective_lower(tg, b, machine, &coll, &s1, &e1);
  coll.devices = g2;
  sim_collective_lower(tg, b, machine, &coll, &s2, &e2);
  SimTimeline tl = { 0 };
  double t = run(tg, &tl);
  double expect = 2 * (L + cp.step_latency) + 2 * (S / 2) / (B / 2);
  cr_assert_float_eq(t, expect, expect * 1e-9);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
}

Test(engine, equal_time_events_are_deterministic)
{
  /* The same graph twice gives bit-identical timelines. */
  double first[64];
  for (int rep = 0; rep < 2; rep++) {
    SimTaskGraph *tg = sim_taskgraph_new(8);
    int b = sim_taskgraph_block_new(tg);
    for (int i = 0; i < 32; i++) {
      SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, i % 8, (i * 3 + 1) % 8, 1e6 * (1 + i % 5), -1, 0);
      if (f.device == f.peer)
        f.peer = (f.peer + 1) % 8;
      sim_taskgraph_add(tg, b, &f);
      SimTask c = sim_task_compute(SIM_CLASS_FORWARD, i % 8, -1, 0, 0, 1e-5 * (i % 3));
      SimTaskRef r = sim_taskgraph_add(tg, b, &c);
      sim_taskgraph_stream_add(tg, b, i % 8, (uint64_t)i, r.index);
    }
    SimTimeline tl = { 0 };
    run(tg, &tl);
    for (int i = 0; i < 64; i++) {
      if (rep == 0)
        first[i] = tl.end[i];
      else
        cr_assert_eq(first[i], tl.end[i]);
    }
    sim_timeline_clear(&tl);
    sim_taskgraph_free(tg);
  }
}

/* ---- all-reduces priced from a table of measurements ---- */

static SimCollTable *write_table(const char *text, char **path_out, GError **error)
{
  char *path = NULL;
  int fd = g_file_open_tmp("parasol-table-XXXXXX.csv", &path, NULL);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert(g_file_set_contents(path, text, -1, NULL));
  SimCollTable *t = sim_coll_table_load(path, error);
  if (path_out)
    *path_out = path;
  else {
    g_unlink(path);
    g_free(path);
  }
  return t;
}

static double table_allreduce(const SimCollParams *p, SimDetail detail, const int *dev, int n,
                              double S)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  SimTaskRef start, end;
  SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = SIM_ALLREDUCE_RING, .detail = detail,
                         .params = p, .cls = SIM_CLASS_REDUCTION, .devices = dev, .n = n,
                         .bytes = S, .op = -1, .mb = -1 };
  sim_collective_lower(tg, b, machine, &coll, &start, &end);
  SimTimeline tl = { 0 };
  double t = run(tg, &tl);
  sim_timeline_clear(&tl);
  sim_taskgraph_free(tg);
  return t;
}

Test(engine, measured_allreduce_table_sets_the_time_on_an_idle_network)
{
  /* Four GPUs: 1 MB in 100 us, 3 MB in 140 us (two runs, 130 and 150), 1 GB in 40 ms. */
  GError *error = NULL;
  SimCollTable *t = write_table("# test\ngpus,bytes,seconds\n4,1000000,100e-6\n4,3000000,130e-6\n"
                                "4,3000000,150e-6\n4,1000000000,0.04\n",
                                NULL, &error);
  cr_assert_not_null(t, "%s", error ? error->message : "");
  SimCollParams p = cp;
  p.base_latency = 50e-6;
  p.allreduce_table = t;
  int dev[4] = { 0, 1, 2, 3 };
  /* Measured sizes and their linear interpolation: 2 MB takes 120 us, at every level of
   * detail, whatever the ring's own step costs would say. */
  SimDetail levels[3] = { SIM_DETAIL_STEPS, SIM_DETAIL_FLOWS, SIM_DETAIL_COLLECTIVE };
  for (int k = 0; k < 3; k++) {
    cr_assert_float_eq(table_allreduce(&p, levels[k], dev, 4, 1e6), 100e-6, 1e-12);
    cr_assert_float_eq(table_allreduce(&p, levels[k], dev, 4, 2e6), 120e-6, 1e-12);
    cr_assert_float_eq(table_allreduce(&p, levels[k], dev, 4, 3e6), 140e-6, 1e-12);
  }
  cr_assert_float_eq(sim_collective_time(machine, SIM_COLL_ALLREDUCE, SIM_ALLREDUCE_RING, &p,
                                         dev, 4, 2e6), 120e-6, 1e-12);
  /* Below the smallest size the smallest size's fixed cost holds: 100 us less its ring
   * time (6 steps of 2 us, and 6 * 250 kB at 100 GB/s = 15 us) is 73 us; 0.5 MB then
   * takes 73 us + 12 us + 7.5 us = 92.5 us. */
  cr_assert_float_eq(table_allreduce(&p, SIM_DETAIL_FLOWS, dev, 4, 5e5), 92.5e-6, 1e-12);
  /* Beyond the largest, the same: 40 ms less 12 us and 15 ms is 24.988 ms of fixed cost;
   * 2 GB adds 30 ms of transfer. */
  cr_assert_float_eq(table_allreduce(&p, SIM_DETAIL_FLOWS, dev, 4, 2e9),
                     24.988e-3 + 12e-6 + 30e-3, 1e-12);
  /* A group size the table does not hold keeps the ring model and its fixed cost. */
  double ring3 = 50e-6 + 4 * (L + cp.step_latency) + 4 * (3e6 / 3) / B;
  cr_assert_float_eq(table_allreduce(&p, SIM_DETAIL_FLOWS, dev, 3, 3e6), ring3, 1e-12);
  sim_coll_table_free(t);
}

Test(engine, bad_allreduce_tables_are_refused_with_their_place)
{
  const char *bad[][2] = {
    { "gpus,size,time\n4,1,1\n", "line 1: expected the header 'gpus,bytes,seconds'" },
    { "gpus,bytes,seconds\n4,1e6\n", "line 2: expected three numbers" },
    { "gpus,bytes,seconds\n4,1e6,abc\n", "line 2: expected three numbers" },
    { "gpus,bytes,seconds\n# two GPUs\n1,1e6,1e-4\n", "line 3: expected 2 to 64 GPUs" },
    { "gpus,bytes,seconds\n4,-5,1e-4\n", "line 2: expected 2 to 64 GPUs, a positive size" },
    { "gpus,bytes,seconds\n", "no measurements after the header" },
    { "", "empty file" },
  };
  for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
    GError *error = NULL;
    char *path = NULL;
    SimCollTable *t = write_table(bad[i][0], &path, &error);
    cr_assert_null(t, "case %zu accepted", i);
    cr_assert_not_null(strstr(error->message, bad[i][1]), "case %zu: %s", i, error->message);
    cr_assert_not_null(strstr(error->message, path), "case %zu: %s", i, error->message);
    g_clear_error(&error);
    g_unlink(path);
    g_free(path);
  }
  GError *error = NULL;
  cr_assert_null(sim_coll_table_load("/nonexistent/table.csv", &error));
  cr_assert_eq(error->code, SIM_ERROR_IO);
  g_clear_error(&error);
}

/* ---- flows run as groups against flows run one by one ---- */

/* Two all-reduces that share GPUs 2 and 3, the second released @stagger seconds after
 * the first, and a transfer between them released at twice that: the engine with its
 * groups (a collective's flows run as a whole while their links are otherwise idle, and
 * are turned back into flows when another flow arrives) must time every task as the
 * engine does flow by flow. */
static void staggered(SimTaskGraph *tg, SimDetail detail, double stagger)
{
  int b = sim_taskgraph_block_new(tg);
  int g1[4] = { 0, 1, 2, 3 }, g2[4] = { 2, 3, 4, 5 };
  SimTaskRef s1, e1, s2, e2;
  SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = SIM_ALLREDUCE_RING, .detail = detail,
                         .params = &cp, .cls = SIM_CLASS_GRAD_SYNC, .devices = g1, .n = 4,
                         .bytes = 1e9, .op = -1, .mb = -1 };
  sim_collective_lower(tg, b, machine, &coll, &s1, &e1);
  SimTask d = sim_task_delay(SIM_CLASS_GRAD_SYNC, 4, stagger);
  SimTaskRef dr = sim_taskgraph_add(tg, b, &d);
  coll.devices = g2;
  coll.bytes = 5e8;
  sim_collective_lower(tg, b, machine, &coll, &s2, &e2);
  sim_taskgraph_depend(tg, b, dr, s2);
  SimTask d2 = sim_task_delay(SIM_CLASS_TRANSFER, 6, 2 * stagger);
  SimTaskRef d2r = sim_taskgraph_add(tg, b, &d2);
  SimTask f = sim_task_flow(SIM_CLASS_TRANSFER, 6, 3, 2e8, -1, 0);
  SimTaskRef fr = sim_taskgraph_add(tg, b, &f);
  sim_taskgraph_depend(tg, b, d2r, fr);
}

static SimTimeline run_staggered(SimDetail detail, double stagger, gboolean groups)
{
  if (groups)
    g_unsetenv("PARASOL_NO_FLOW_GROUPS");
  else
    g_setenv("PARASOL_NO_FLOW_GROUPS", "1", TRUE);
  SimTaskGraph *tg = sim_taskgraph_new(8);
  staggered(tg, detail, stagger);
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(machine, NULL);
  sim_engine_set_host_kernel_time(e, 0);
  SimTimeline tl = { 0 };
  sim_engine_run(e, tg, &tl);
  /* Run twice: the second run takes the groups' schedules from the first. */
  sim_timeline_clear(&tl);
  sim_engine_run(e, tg, &tl);
  cr_assert_not(tl.deadlock);
  cr_assert_eq(tl.n_tasks_run, tg->n_tasks);
  sim_engine_free(e);
  sim_taskgraph_free(tg);
  g_unsetenv("PARASOL_NO_FLOW_GROUPS");
  return tl;
}

Test(engine, flow_groups_time_tasks_as_single_flows_do)
{
  /* The first all-reduce alone: 6 steps of 250 MB at 100 GB/s and 5 us, 15.03 ms.  The
   * staggers put the second one and the transfer at its start, in its middle and after
   * its end. */
  double staggers[] = { 0, 1e-3, 4e-3, 9.5e-3, 2e-2 };
  SimDetail levels[2] = { SIM_DETAIL_FLOWS, SIM_DETAIL_COLLECTIVE };
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < G_N_ELEMENTS(staggers); i++) {
      SimTimeline a = run_staggered(levels[k], staggers[i], TRUE);
      SimTimeline b = run_staggered(levels[k], staggers[i], FALSE);
      cr_assert_float_eq(a.makespan, b.makespan, b.makespan * 1e-9, "detail %d stagger %g: %.9g vs %.9g",
                         levels[k], staggers[i], a.makespan, b.makespan);
      for (int t = 0; t < a.n_tasks_run; t++) {
        cr_assert_float_eq(a.start[t], b.start[t], b.makespan * 1e-9, "task %d", t);
        cr_assert_float_eq(a.end[t], b.end[t], b.makespan * 1e-9, "task %d: %.9g vs %.9g", t,
                           a.end[t], b.end[t]);
      }
      for (int l = 0; l < sim_machine_n_links(machine); l++)
        cr_assert_float_eq(a.link_bytes[l], b.link_bytes[l], 1);
      sim_timeline_clear(&a);
      sim_timeline_clear(&b);
    }
}

/* ---- trees, hierarchical and multi-node rings ---- */

static double run_algo_with(SimMachine *m, const SimCollParams *params, SimAllreduceAlgo algo,
                            SimDetail detail, const int *dev, int n, double S)
{
  SimTaskGraph *tg = sim_taskgraph_new(sim_machine_n_devices(m));
  int b = sim_taskgraph_block_new(tg);
  SimTaskRef start, end;
  SimCollective coll = { .kind = SIM_COLL_ALLREDUCE, .algo = algo, .detail = detail,
                         .params = params, .cls = SIM_CLASS_GRAD_SYNC, .devices = dev, .n = n,
                         .bytes = S, .op = -1, .mb = -1 };
  sim_collective_lower(tg, b, m, &coll, &start, &end);
  sim_taskgraph_assemble(tg);
  SimEngine *e = sim_engine_new(m, params);
  SimTimeline tl = { 0 };
  sim_engine_run(e, tg, &tl);
  cr_assert_not(tl.deadlock);
  double t = tl.makespan;
  sim_timeline_clear(&tl);
  sim_engine_free(e);
  sim_taskgraph_free(tg);
  return t;
}

/* Simulated under @params at every level of detail, and the closed form
 * sim_collective_time(), against @expect. */
static void check_algo_with(SimMachine *m, const SimCollParams *params, SimAllreduceAlgo algo,
                            const int *dev, int n, double S, double expect)
{
  SimDetail levels[3] = { SIM_DETAIL_STEPS, SIM_DETAIL_FLOWS, SIM_DETAIL_COLLECTIVE };
  for (int k = 0; k < 3; k++) {
    double t = run_algo_with(m, params, algo, levels[k], dev, n, S);
    cr_assert_float_eq(t, expect, expect * 1e-9, "%s, detail %d: %.9g vs %.9g",
                       sim_allreduce_algo_name(algo), levels[k], t, expect);
  }
  double c = sim_collective_time(m, SIM_COLL_ALLREDUCE, algo, params, dev, n, S);
  cr_assert_float_eq(c, expect, expect * 1e-9, "%s closed form: %.9g vs %.9g",
                     sim_allreduce_algo_name(algo), c, expect);
}

static void check_algo(SimMachine *m, SimAllreduceAlgo algo, const int *dev, int n, double S,
                       double expect)
{
  check_algo_with(m, &cp, algo, dev, n, S, expect);
}

Test(engine, tree_allreduce_inside_a_node_closed_form)
{
  /* Eight GPUs of one node: two binary trees over the ranks, the second numbered from
   * the other end, each carrying S/2 over every edge both ways.  The deepest rank is 3
   * edges from its root (7 -> 3 -> 1 -> 0), 3 * (2 + 3) us each way: 30 us.  The busiest
   * uplinks (GPUs 1, 2, 5, 6) send on 4 tree edges, one up and two down in one tree and
   * one up in the other: 4 * S/2 = 2 S at 100 GB/s.  For S = 1 GB: 30 us + 20 ms (a ring
   * takes 17.57 ms: inside a node NCCL prefers rings). */
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  check_algo(machine, SIM_ALLREDUCE_TREE, dev, 8, 1e9, 30e-6 + 20e-3);
}

/* Two nodes of four GPUs: NVSwitch inside (routes of 100 GB/s and 2 us), one 200 Gb/s NIC
 * per GPU on a PCIe switch of 1 TB/s (so that routes between nodes, 6 links of 1 us, are
 * bound by the NICs' 25 GB/s), one network switch. */
static const char *two_nodes_json =
  "{ \"format\": \"parasol-machine\", \"version\": 1, \"name\": \"test-two-nodes\","
  "  \"node\": { \"gpu\": \"a100-80gb\", \"gpus\": 4,"
  "    \"fabric\": { \"type\": \"nvswitch\", \"bandwidth_GBps\": 100, \"latency_us\": 1 },"
  "    \"pcie\": { \"bandwidth_GBps\": 1000, \"latency_us\": 1, \"sockets\": 1, \"switches\": 1 },"
  "    \"nics\": { \"count\": 4, \"bandwidth_Gbps\": 200, \"switches\": [0, 0, 0, 0] } },"
  "  \"count\": 2, \"network\": { \"type\": \"single-switch\", \"latency_us\": 1 } }";

static SimMachine *two_nodes(void)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_from_json(two_nodes_json, "test-two-nodes.json", 0, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  cr_assert_float_eq(sim_machine_bandwidth(m, 0, 1), 100e9, 1);
  cr_assert_float_eq(sim_machine_latency(m, 0, 1), 2e-6, 1e-12);
  cr_assert_float_eq(sim_machine_bandwidth(m, 0, 4), 25e9, 1);
  cr_assert_float_eq(sim_machine_latency(m, 0, 4), 6e-6, 1e-12);
  return m;
}

Test(engine, multi_node_ring_runs_one_channel_per_local_rank)
{
  /* A ring over both nodes runs 4 channels of S/4, channel c leaving each node from GPU
   * (c + 3) % 4 and so through its own NIC.  Each hop carries 14 steps of S/32 = 7S/16;
   * the NICs bind: 7S/16 at 25 GB/s = 17.5 ms for S = 1 GB (one channel through one NIC
   * would take four times as long), after 14 steps of 6 + 3 us = 126 us. */
  SimMachine *m = two_nodes();
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  check_algo(m, SIM_ALLREDUCE_RING, dev, 8, 1e9, 126e-6 + 17.5e-3);
  sim_machine_free(m);
}

Test(engine, network_links_run_at_their_own_efficiency)
{
  /* The ring above with NVSwitch and PCIe at 0.8 of their bandwidth and the NICs and the
   * network at half of theirs.  A GPU's NVSwitch uplink carries three channels' hops
   * inside its node, 3 * 7S/16 at 80 GB/s = 16.41 ms; its NIC one channel's, 7S/16 at
   * 12.5 GB/s = 35 ms, which binds.  Without an efficiency of their own the NICs run at
   * 0.8 too: 7S/16 at 20 GB/s = 21.875 ms, still above the uplinks. */
  SimMachine *m = two_nodes();
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  SimCollParams p = cp;
  p.bandwidth_efficiency = 0.8;
  p.net_efficiency = 0.5;
  check_algo_with(m, &p, SIM_ALLREDUCE_RING, dev, 8, 1e9, 126e-6 + 35e-3);
  p.net_efficiency = 0;
  check_algo_with(m, &p, SIM_ALLREDUCE_RING, dev, 8, 1e9, 126e-6 + 21.875e-3);
  /* Inside one node only NVSwitch counts, whatever the network's efficiency: 2 * 3/4 * S
   * at 80 GB/s = 18.75 ms after 6 steps of 2 + 3 us. */
  p.net_efficiency = 0.5;
  check_algo_with(m, &p, SIM_ALLREDUCE_RING, dev, 4, 1e9, 30e-6 + 18.75e-3);
  sim_machine_free(m);
}

Test(engine, multi_node_tree_follows_nccl_closed_form)
{
  /* NCCL's trees over two nodes: in each of 4 channels (channel c's chains start at GPU
   * c) a node's GPUs form a chain to their head, and the heads join the trees over nodes
   * (node 0 the root of one tree, node 1 of the other).  Every edge carries S/8 each way
   * in each tree.  The deepest rank is 3 chain edges (2 + 3 us each) and 1 network edge
   * (6 + 3 us) from its root: 24 us, paid up and down, 48 us.  A GPU's NVSwitch uplink
   * carries 2 edges of each tree as a chain's middle (twice), 1 as its head and 1 as its
   * tail: 12 * S/8 = 1.5 S at 100 GB/s; a NIC carries one channel's 2 edges, S/4 at
   * 25 GB/s, less.  For S = 1 GB: 48 us + 15 ms, where the ring took 17.626 ms. */
  SimMachine *m = two_nodes();
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  check_algo(m, SIM_ALLREDUCE_TREE, dev, 8, 1e9, 48e-6 + 15e-3);
  sim_machine_free(m);
}

Test(engine, hierarchical_allreduce_of_one_rank_per_node_closed_form)
{
  /* GPUs 0 and 4, one on each node: nothing to reduce-scatter or all-gather inside a node
   * (rings of one rank, no step), a ring of 2 across the nodes: 2 steps of S/2 over a
   * 25 GB/s route of 6 us, 2 * (6 + 3) us + S / 25 GB/s = 40.018 ms for S = 1 GB, at every
   * level of detail (per-step transfers used to leave the empty rings' ends unset). */
  SimMachine *m = two_nodes();
  int dev[2] = { 0, 4 };
  check_algo(m, SIM_ALLREDUCE_HIERARCHICAL, dev, 2, 1e9, 18e-6 + 40e-3);
  sim_machine_free(m);
}

Test(engine, hierarchical_allreduce_closed_form)
{
  /* Reduce-scatter inside each node (3 steps of S/4: 3 * 5 us + 0.75 S at 100 GB/s), an
   * all-reduce of each quarter across the nodes (4 rings of 2, one per NIC: 2 steps of
   * S/8, 2 * 9 us + S/4 at 25 GB/s), an all-gather like the first phase: for S = 1 GB,
   * 2 * (15 us + 7.5 ms) + 18 us + 10 ms = 25.048 ms. */
  SimMachine *m = two_nodes();
  int dev[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
  check_algo(m, SIM_ALLREDUCE_HIERARCHICAL, dev, 8, 1e9, 2 * (15e-6 + 7.5e-3) + 18e-6 + 10e-3);
  sim_machine_free(m);
}

/* ---- Shared tasks ---------------------------------------------------------------------- */

/* Fills a graph of @n_blocks blocks with random tasks (compute tasks on streams, pair
 * flows, collective flows whose links sit in the block's extra array) and random edges,
 * block by block in the order @fill (created in slot order first), laid out in the order
 * @order.  @interleave adds one more task to the first block filled after all others,
 * @clear empties the second block filled and fills it again: both end the sharing. */
static SimTaskGraph *random_blocks(gboolean share, int n_blocks, const int *fill,
                                   const int *order, gboolean interleave, gboolean clear,
                                   guint32 seed)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  if (share)
    sim_taskgraph_share_tasks(tg);
  for (int i = 0; i < n_blocks; i++)
    sim_taskgraph_block_new(tg);
  tg->order = g_array_new(FALSE, FALSE, sizeof(int));
  g_array_append_vals(tg->order, order, (guint)n_blocks);
  GRand *rng = g_rand_new_with_seed(seed);
  int *len = g_new0(int, n_blocks);
  for (int pass = 0; pass < (clear ? 2 : 1); pass++)
    for (int k = 0; k < n_blocks; k++) {
      int b = fill[k];
      if (pass == 1 && k != 1)
        continue;
      if (pass == 1)
        sim_taskgraph_block_clear(tg, b);
      /* Refilled with as many tasks: later blocks' edges name them. */
      int n = pass == 1 ? len[b] : g_rand_int_range(rng, 1, 40);
      if (k % 3 == 0)
        sim_taskgraph_block_reserve(tg, b, n, n, n);
      for (int i = 0; i < n; i++) {
        int kind = g_rand_int_range(rng, 0, 3), d = g_rand_int_range(rng, 0, 8);
        if (kind == 0) {
          SimTask t = sim_task_compute(SIM_CLASS_FORWARD, d, b, 0, i, 1e-6 * (i + 1));
          SimTaskRef r = sim_taskgraph_add(tg, b, &t);
          /* Stream order as edge order (blocks by filling, tasks by index): no cycles. */
          sim_taskgraph_stream_add(tg, b, d, (uint64_t)(k * 1000 + i), r.index);
        } else if (kind == 1) {
          SimTask t = sim_task_flow(SIM_CLASS_TRANSFER, d, (d + 1) % 8, 1e6 * (i + 1), b, i);
          sim_taskgraph_add(tg, b, &t);
        } else {
          int members[3] = { d, (d + 2) % 8, (d + 5) % 8 };
          sim_taskgraph_add_ring_flow(tg, b, SIM_CLASS_GRAD_SYNC, machine, members, 3,
                                      1e6 * (i + 1), 1e-6, b, i, -1);
        }
      }
      len[b] = n;
      /* Edges inside the block and towards blocks filled before. */
      for (int e = 0; e < n; e++) {
        int from_k = g_rand_int_range(rng, 0, k + 1), to_i = g_rand_int_range(rng, 0, n);
        int fb = fill[from_k];
        if (fb == b && g_rand_int_range(rng, 0, 2) == 0)
          continue;
        SimTaskRef from = { fb, g_rand_int_range(rng, 0, len[fb]) }, to = { b, to_i };
        if (fb == b && from.index >= to.index)
          continue;
        sim_taskgraph_depend(tg, b, from, to);
      }
    }
  if (interleave) {
    SimTask t = sim_task_flow(SIM_CLASS_TRANSFER, 3, 4, 5e5, fill[0], -1);
    sim_taskgraph_add(tg, fill[0], &t);
  }
  g_free(len);
  g_rand_free(rng);
  sim_taskgraph_assemble(tg);
  return tg;
}

/* The flat graph of @a and of @b, task by task, successor by successor. */
static void assert_same_flat(const SimTaskGraph *a, const SimTaskGraph *b, const char *what)
{
  cr_assert_eq(a->n_tasks, b->n_tasks, "%s", what);
  cr_assert_eq(memcmp(a->task, b->task, sizeof(SimTask) * (size_t)a->n_tasks), 0, "%s: tasks",
               what);
  cr_assert_eq(a->n_succ_total, b->n_succ_total, "%s", what);
  cr_assert_eq(memcmp(a->succ, b->succ, sizeof(int32_t) * (size_t)a->n_succ_total), 0, "%s",
               what);
  cr_assert_eq(memcmp(a->n_pred, b->n_pred, sizeof(int32_t) * (size_t)a->n_tasks), 0, "%s",
               what);
  cr_assert_eq(memcmp(a->stream_off, b->stream_off, sizeof(int32_t) * 9), 0, "%s", what);
  cr_assert_eq(memcmp(a->stream, b->stream, sizeof(int32_t) * (size_t)a->stream_off[8]), 0,
               "%s", what);
  size_t n_extra = 0;
  for (int t = 0; t < a->n_tasks; t++)
    if (a->task[t].kind == SIM_TASK_FLOW && a->task[t].n_links)
      n_extra = MAX(n_extra, (size_t)a->task[t].links_off + a->task[t].n_links +
                               a->task[t].n_members);
  cr_assert_eq(memcmp(a->extra, b->extra, sizeof(int32_t) * n_extra), 0, "%s", what);
}

/* A graph whose blocks keep their tasks in one shared mapping assembles to the same flat
 * graph as one whose blocks keep their own arrays: blocks filled in any order and laid
 * out in any other (tasks moving both ways in the mapping), a block given a task after
 * others were filled, a block cleared and filled again.  And its run is the same. */
Test(engine, shared_tasks_assemble_as_separate_blocks_do)
{
  enum { NB = 9 };
  GRand *rng = g_rand_new_with_seed(5);
  for (int trial = 0; trial < 24; trial++) {
    int fill[NB], order[NB];
    for (int i = 0; i < NB; i++)
      fill[i] = order[i] = i;
    for (int i = NB - 1; i > 0; i--) {
      int j = g_rand_int_range(rng, 0, i + 1), t = fill[i];
      fill[i] = fill[j];
      fill[j] = t;
      j = g_rand_int_range(rng, 0, i + 1);
      t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    gboolean interleave = trial % 4 == 1, clear = trial % 4 == 2;
    g_autofree char *what = g_strdup_printf("trial %d", trial);
    SimTaskGraph *plain = random_blocks(FALSE, NB, fill, order, interleave, clear, trial);
    SimTaskGraph *shared = random_blocks(TRUE, NB, fill, order, interleave, clear, trial);
    /* Sharing lasts exactly as long as blocks are filled one after the other. */
    cr_assert_eq(shared->task_mapped > 0, !interleave && !clear, "%s", what);
    assert_same_flat(plain, shared, what);
    SimTimeline ta = { 0 }, tb = { 0 };
    SimEngine *e = sim_engine_new(machine, NULL);
    sim_engine_run(e, plain, &ta);
    sim_engine_run(e, shared, &tb);
    sim_engine_free(e);
    cr_assert_not(ta.deadlock, "%s", what);
    cr_assert_eq(ta.n_tasks_run, plain->n_tasks, "%s", what);
    double a = ta.makespan, b = tb.makespan;
    cr_assert_eq(a, b, "%s", what);
    cr_assert_eq(memcmp(ta.end, tb.end, sizeof(double) * (size_t)plain->n_tasks), 0, "%s",
                 what);
    sim_timeline_clear(&ta);
    sim_timeline_clear(&tb);
    sim_taskgraph_release_blocks(shared);
    sim_taskgraph_free(plain);
    sim_taskgraph_free(shared);
  }
  g_rand_free(rng);
}

/* Ring flows of one block over recurring member lists (150 distinct lists, in random
 * order, as 128 replicas' tensor-parallel groups take turns) each carry their own ring:
 * after assembly, every flow's links are its members' routes in ring order and its
 * members are the ones given; the block keeps one copy of each distinct ring. */
Test(engine, repeated_rings_share_links_and_keep_their_members)
{
  SimTaskGraph *tg = sim_taskgraph_new(8);
  int b = sim_taskgraph_block_new(tg);
  GRand *rng = g_rand_new_with_seed(3);
  enum { KINDS = 150, FLOWS = 1200 };
  int lists[KINDS][4], sizes[KINDS], used[FLOWS];
  /* Distinct lists: a size of 2 to 4 and distinct devices in some order. */
  for (int k = 0; k < KINDS; k++) {
    gboolean fresh;
    do {
      sizes[k] = g_rand_int_range(rng, 2, 5);
      for (int i = 0; i < sizes[k]; i++) {
        gboolean dup;
        do {
          lists[k][i] = g_rand_int_range(rng, 0, 8);
          dup = FALSE;
          for (int j = 0; j < i; j++)
            dup |= lists[k][j] == lists[k][i];
        } while (dup);
      }
      fresh = TRUE;
      for (int j = 0; j < k && fresh; j++)
        fresh = sizes[j] != sizes[k] ||
                memcmp(lists[j], lists[k], sizeof(int) * (size_t)sizes[k]) != 0;
    } while (!fresh);
  }
  gboolean seen[KINDS] = { FALSE };
  size_t want_extra = 0;
  for (int f = 0; f < FLOWS; f++) {
    /* Mostly the lists in turn, sometimes a few recent ones or any. */
    int pick = g_rand_int_range(rng, 0, 4);
    int k = pick == 0 ? g_rand_int_range(rng, 0, 3) : pick == 1 ? g_rand_int_range(rng, 0, KINDS)
                                                                : f % KINDS;
    used[f] = k;
    if (!seen[k]) {
      seen[k] = TRUE;
      want_extra += (size_t)sizes[k];
      for (int i = 0; i < sizes[k]; i++) {
        int hops;
        sim_machine_route(machine, lists[k][i], lists[k][(i + 1) % sizes[k]], &hops);
        want_extra += (size_t)hops;
      }
    }
    sim_taskgraph_add_ring_flow(tg, b, SIM_CLASS_REDUCTION, machine, lists[k], sizes[k], 1e6,
                                1e-6, 0, f, -1);
  }
  /* One copy of each distinct ring's links and members. */
  cr_assert_eq(sim_taskgraph_block(tg, b)->extra->len, want_extra);
  sim_taskgraph_assemble(tg);
  cr_assert_eq(tg->n_tasks, FLOWS);
  for (int f = 0; f < FLOWS; f++) {
    const SimTask *t = &tg->task[f];
    int k = used[f], n = sizes[k];
    cr_assert_eq(t->n_members, n, "flow %d", f);
    const int32_t *links = sim_task_links(tg, t), *mem = sim_task_members(tg, t);
    cr_assert_eq(memcmp(mem, lists[k], sizeof(int) * (size_t)n), 0, "flow %d", f);
    int pos = 0;
    for (int i = 0; i < n; i++) {
      int hops;
      const int *r = sim_machine_route(machine, lists[k][i], lists[k][(i + 1) % n], &hops);
      for (int h = 0; h < hops; h++, pos++)
        cr_assert_eq(links[pos], r[h], "flow %d", f);
    }
    cr_assert_eq(t->n_links, pos, "flow %d", f);
  }
  g_rand_free(rng);
  sim_taskgraph_free(tg);
}

/* ---- the network's memory of rates ---- */

typedef struct {
  GArray *log;   /* (flow task, new end) as the net reports them, in order */
} RateLog;

static void log_rate(void *user, int task, double end)
{
  RateLog *r = user;
  double rec[2] = { task, end };
  g_array_append_vals(r->log, rec, 2);
}

/* Plays the same random traffic over a net, as runs of a search would: each run starts
 * flows between random GPUs of two DGX A100 nodes (or from random GPUs to GPU 0), ends
 * some and updates the rates after each step.  Returns what the net reported, in order. */
/* @by_links: each run ends with sim_net_reset_links() over the links of its flows (some
 * still under way) instead of starting with sim_net_reset(); @bytes (or NULL): each run's
 * bytes per link appended. */
static GArray *play_reset(SimNet *net, SimMachine *m, int runs, gboolean by_links, GArray *bytes)
{
  RateLog r = { g_array_new(FALSE, FALSE, sizeof(double)) };
  int n_dev = sim_machine_n_devices(m), nl = sim_machine_n_links(m);
  const int *used[400];
  int n_used[400];
  for (int run = 0; run < runs; run++) {
    GRand *rng = g_rand_new_with_seed(7 + run % 4);   /* four runs come back in turn */
    if (!by_links)
      sim_net_reset(net);
    int slot[64], task[64], n = 0, n_flows = 0;
    double now = 0;
    for (int step = 0; step < 400; step++) {
      now += 1e-6;
      if (n < 64 && (n < 2 || g_rand_int_range(rng, 0, 3) > 0)) {
        /* Every other run sends everything to GPU 0, making one component of all flows. */
        int a = g_rand_int_range(rng, 0, n_dev), b = g_rand_int_range(rng, 0, n_dev - 1);
        b += b >= a;
        if (run % 2) {
          a = 1 + g_rand_int_range(rng, 0, n_dev - 1);
          b = 0;
        }
        const SimRoute *rt = sim_machine_route_info(m, a, b);
        task[n] = step;
        slot[n] = sim_net_add(net, step, rt->links, rt->n_links, 1e6 * (1 + step % 5), now);
        used[n_flows] = rt->links;
        n_used[n_flows++] = rt->n_links;
        n++;
      } else {
        int k = g_rand_int_range(rng, 0, n);
        sim_net_remove(net, slot[k], now);
        slot[k] = slot[n - 1];
        task[k] = task[n - 1];
        n--;
      }
      sim_net_update(net, now, log_rate, &r);
    }
    if (bytes)
      g_array_append_vals(bytes, sim_net_link_bytes(net), (guint)nl);
    if (by_links)
      sim_net_reset_links(net, used, n_used, n_flows);
    g_rand_free(rng);
  }
  return r.log;
}

static GArray *play(SimNet *net, SimMachine *m, int runs)
{
  return play_reset(net, m, runs, FALSE, NULL);
}

/* A net reset over the links its flows crossed (what the engine's scratch net for groups
 * of flows does) plays the same traffic as one reset in full: the same reports, bit for
 * bit, and the same bytes per link, run after run, with flows left under way at each
 * reset. */
Test(engine, a_net_reset_over_its_flows_links_is_a_reset_net)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  SimNet *full = sim_net_new(m, NULL), *part = sim_net_new(m, NULL);
  GArray *fb = g_array_new(FALSE, FALSE, sizeof(double));
  GArray *pb = g_array_new(FALSE, FALSE, sizeof(double));
  GArray *a = play_reset(full, m, 12, FALSE, fb), *b = play_reset(part, m, 12, TRUE, pb);
  cr_assert_gt(a->len, 1000);
  cr_assert_eq(a->len, b->len);
  for (guint i = 0; i < a->len; i++)
    cr_assert(g_array_index(a, double, i) == g_array_index(b, double, i),
              "report %u differs: %.17g against %.17g", i / 2, g_array_index(a, double, i),
              g_array_index(b, double, i));
  cr_assert_eq(fb->len, pb->len);
  cr_assert_eq(memcmp(fb->data, pb->data, sizeof(double) * fb->len), 0);
  g_array_free(a, TRUE);
  g_array_free(b, TRUE);
  g_array_free(fb, TRUE);
  g_array_free(pb, TRUE);
  sim_net_free(full);
  sim_net_free(part);
  sim_machine_free(m);
}

/* A net that remembers the rates of the components it solved gives every flow, run after
 * run, exactly the rate (and the engine exactly the reports, in the same order) that a
 * net solving each time gives, and it does answer from memory. */
/* A net that takes the whole network as the component to fill after it has seen a large
 * one gives the rates a net that always searches for the component gives, bit for bit,
 * also while the traffic is many small components (after an all-to-GPU-0 run, random
 * pairs; a run of 1,000 solves after any component of half the flows keeps filling them
 * together until the flows double), and with memory on. */
Test(engine, filling_the_whole_network_finds_the_components_rates)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  SimNet *search = sim_net_new(m, NULL), *usual = sim_net_new(m, NULL);
  SimNet *always = sim_net_new(m, NULL), *memo = sim_net_new(m, NULL);
  /* This traffic holds up to 64 flows: large components here are of 8 or more. */
  sim_net_set_whole_run(search, 0, 8);
  sim_net_set_whole_run(usual, SIM_NET_WHOLE_RUN, 8);
  sim_net_set_whole_run(always, 1000, 2);
  sim_net_set_whole_run(memo, SIM_NET_WHOLE_RUN, 8);
  sim_net_set_memory(memo, SIM_NET_MEMORY);
  GArray *a = play(search, m, 12), *b = play(usual, m, 12), *c = play(always, m, 12);
  GArray *d = play(memo, m, 12);
  cr_assert_gt(a->len, 1000);
  GArray *other[] = { b, c, d };
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(a->len, other[k]->len, "%u reports searching, %u (net %d)", a->len,
                 other[k]->len, k);
    for (guint i = 0; i < a->len; i++)
      cr_assert(g_array_index(a, double, i) == g_array_index(other[k], double, i),
                "net %d: report %u differs: %.17g against %.17g", k, i / 2,
                g_array_index(a, double, i), g_array_index(other[k], double, i));
  }
  cr_assert_eq(sim_net_whole_solves(search), 0);
  cr_assert_gt(sim_net_whole_solves(usual), 100);
  cr_assert_gt(sim_net_whole_solves(always), sim_net_whole_solves(usual));
  cr_assert_gt(sim_net_whole_solves(memo), 0);
  GArray *all[] = { a, b, c, d };
  for (int k = 0; k < 4; k++)
    g_array_free(all[k], TRUE);
  sim_net_free(search);
  sim_net_free(usual);
  sim_net_free(always);
  sim_net_free(memo);
  sim_machine_free(m);
}

Test(engine, remembered_rates_are_the_solved_ones)
{
  GError *error = NULL;
  SimMachine *m = sim_machine_load("dgx-a100:2", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  SimNet *plain = sim_net_new(m, NULL), *memo = sim_net_new(m, NULL);
  SimNet *small = sim_net_new(m, NULL);
  sim_net_set_memory(memo, SIM_NET_MEMORY);
  /* Room for a few components only: its halves take turns, what is found in the older
   * moves to the recent one. */
  sim_net_set_memory(small, 24 << 10);
  GArray *a = play(plain, m, 12), *b = play(memo, m, 12), *c = play(small, m, 12);
  cr_assert_eq(a->len, b->len, "%u reports solving, %u remembering", a->len, b->len);
  cr_assert_gt(a->len, 1000);
  for (guint i = 0; i < a->len; i++)
    cr_assert(g_array_index(a, double, i) == g_array_index(b, double, i),
              "report %u differs: %.17g against %.17g", i / 2, g_array_index(a, double, i),
              g_array_index(b, double, i));
  cr_assert_eq(a->len, c->len);
  cr_assert(memcmp(a->data, c->data, a->len * sizeof(double)) == 0,
            "a net with little memory reports other rates");
  cr_assert_eq(sim_net_memory_hits(plain), 0);
  cr_assert_gt(sim_net_memory_hits(small), 0);
  cr_assert_lt(sim_net_memory_hits(small), sim_net_memory_hits(memo));
  /* Eight of the twelve runs repeat an earlier one step for step. */
  cr_assert_gt(sim_net_memory_hits(memo), 8 * 200, "%" G_GINT64_FORMAT " answers from memory",
               sim_net_memory_hits(memo));
  g_array_free(a, TRUE);
  g_array_free(b, TRUE);
  g_array_free(c, TRUE);
  sim_net_free(small);
  sim_net_free(plain);
  sim_net_free(memo);
  sim_machine_free(m);
}

/* ---- numbers for keys ---- */

/* Keys numbered through a hash of their first bytes alone (their tails are zero) get the
 * numbers that the hash of every byte gives: 0, 1, 2... in the order first seen, equal
 * keys one number, through the index's growth and after it is cleared. */
Test(engine, keys_numbered_through_a_partial_hash_keep_their_numbers)
{
  typedef struct {
    int64_t a, b;
    int64_t zero[6];
  } Key;
  SimKeyIndex whole, part;
  sim_key_index_init(&whole, sizeof(Key));
  sim_key_index_init(&part, sizeof(Key));
  GRand *rng = g_rand_new_with_seed(11);
  for (int round = 0; round < 3; round++) {
    sim_key_index_clear(&whole);
    sim_key_index_clear(&part);
    for (int i = 0; i < 5000; i++) {
      Key k;
      memset(&k, 0, sizeof k);
      k.a = g_rand_int_range(rng, 0, 40 + 400 * round);
      k.b = g_rand_int_range(rng, 0, 7);
      uint64_t h = sim_hash_bytes(&k, 2 * sizeof(int64_t));
      gboolean aw, ap;
      guint nw = sim_key_index_get(&whole, &k, &aw);
      guint np = sim_key_index_get_hashed(&part, &k, h, &ap);
      cr_assert_eq(nw, np, "round %d, key %d", round, i);
      cr_assert_eq(aw, ap, "round %d, key %d", round, i);
    }
    cr_assert_eq(whole.n, part.n);
    cr_assert_gt(part.n, 64); /* the index grew */
  }
  g_rand_free(rng);
  sim_key_index_free(&whole);
  sim_key_index_free(&part);
}
