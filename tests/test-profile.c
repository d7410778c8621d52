/* test-profile.c — the profile database, its lookups, the profile cost model, calibration,
 * shard enumeration and the CPU measurement path. */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

#include "parasol-profile.h"

#define assert_rel(got, want, tol)                                                        \
  cr_assert(fabs((got) - (want)) <= (tol) * fabs(want), "%.12g != %.12g (tolerance %g)", \
            (double)(got), (double)(want), (double)(tol))

/* x [b, 16] -> linear to 32 features: iteration dimensions b (sample), n = 32
 * (parameter) and k = 16 (reduction). */
static SimGraph *one_linear(int64_t batch, SimDType dt)
{
  SimGraph *g = sim_graph_new("one-linear");
  int x = sim_graph_input(g, "x", dt, 2, (int64_t[]){ batch, 16 });
  sim_graph_linear(g, "fc", x, 32, FALSE, SIM_UNARY_IDENTITY);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

/* A small classifier: x [8, 32] -> linear 64 + relu -> linear 10 -> cross entropy. */
static SimGraph *tiny_mlp(void)
{
  SimGraph *g = sim_graph_new("tiny-mlp");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP32, 2, (int64_t[]){ 8, 32 });
  int y = sim_graph_input(g, "labels", SIM_DTYPE_INT64, 1, (int64_t[]){ 8 });
  int h = sim_graph_linear(g, "fc1", x, 64, TRUE, SIM_UNARY_RELU);
  int o = sim_graph_linear(g, "fc2", h, 10, TRUE, SIM_UNARY_IDENTITY);
  sim_graph_cross_entropy(g, "loss", o, y);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

static ProfileOpEntry op_entry(const char *gpu, const char *key, SimPass pass, double t)
{
  return (ProfileOpEntry){ .gpu = gpu, .key = key, .pass = pass, .median = t, .min = t,
                           .max = t, .repetitions = 1 };
}

/* ---------------------------------------------------------------------------------- */
/* The database and its files                                                          */

Test(db, round_trip)
{
  g_autoptr(ProfileDb) db = profile_db_new();
  profile_db_set_description(db, "test database");
  profile_db_add_source(db, "a \"quoted\" source");
  profile_db_set_device_note(db, "h200", "driver", "580.159");
  SimKernel k[2] = {
    { .kind = SIM_KERNEL_GEMM, .dtype = SIM_DTYPE_FP16, .batch = 1, .m = 8192, .n = 3072,
      .k = 768, .steps = 1, .flops = 38654705664.0, .bytes = 66060288.0 },
    { .kind = SIM_KERNEL_MEMORY, .dtype = SIM_DTYPE_FP16, .batch = 1, .steps = 1,
      .flops = 25165824.0, .bytes = 100663296.0 },
  };
  ProfileOpEntry e = {
    .gpu = "h200", .key = "linear|x=[8,1024,768]|w=[768,3072]|fp16|bias=false|activation=gelu",
    .pass = SIM_PASS_FORWARD, .median = 6.25e-05, .min = 6.1e-05, .max = 7.0e-05,
    .repetitions = 10, .flops = 38679871488.0, .bytes = 166723584.0, .n_kernels = 2,
    .kernels = k,
  };
  profile_db_add_op(db, &e);
  ProfileOpEntry b = op_entry("h200", "softmax|x=[8,16]|y=[8,16]|fp16", SIM_PASS_BACKWARD, 3e-6);
  profile_db_add_op(db, &b);
  ProfileCollEntry c = { .gpu = "a100-80gb", .kind = PROFILE_COLL_ALLREDUCE, .n_gpus = 8,
                         .bytes = 1048576, .median = 9.279e-05, .min = 9.2e-05, .max = 9.3e-05,
                         .repetitions = 2, .source = "vtrain" };
  profile_db_add_collective(db, &c);

  g_autofree char *text = profile_db_to_json(db);
  g_autoptr(GError) error = NULL;
  g_autoptr(ProfileDb) back = profile_db_from_json(text, "t.json", &error);
  cr_assert_not_null(back, "%s", error ? error->message : "");
  cr_assert_str_eq(profile_db_get_description(back), "test database");
  cr_assert_eq(profile_db_n_sources(back), 1);
  cr_assert_str_eq(profile_db_source(back, 0), "a \"quoted\" source");
  cr_assert_str_eq(profile_db_get_device_note(back, "h200", "driver"), "580.159");
  cr_assert_eq(profile_db_n_ops(back), 2);
  const ProfileOpEntry *r = profile_db_find_op(back, "h200", e.key, SIM_PASS_FORWARD);
  cr_assert_not_null(r);
  assert_rel(r->median, 6.25e-05, 1e-12);
  assert_rel(r->min, 6.1e-05, 1e-12);
  assert_rel(r->max, 7.0e-05, 1e-12);
  cr_assert_eq(r->repetitions, 10);
  cr_assert_eq(r->flops, e.flops);
  cr_assert_eq(r->bytes, e.bytes);
  cr_assert_eq(r->n_kernels, 2);
  cr_assert_eq(r->kernels[0].kind, SIM_KERNEL_GEMM);
  cr_assert_eq(r->kernels[0].m, 8192);
  cr_assert_eq(r->kernels[0].n, 3072);
  cr_assert_eq(r->kernels[0].k, 768);
  cr_assert_eq(r->kernels[0].flops, k[0].flops);
  cr_assert_eq(r->kernels[1].kind, SIM_KERNEL_MEMORY);
  cr_assert_eq(r->kernels[1].bytes, k[1].bytes);
  cr_assert_eq(profile_db_n_collectives(back), 1);
  const ProfileCollEntry *rc = profile_db_collective(back, 0);
  cr_assert_str_eq(rc->gpu, "a100-80gb");
  cr_assert_eq(rc->kind, PROFILE_COLL_ALLREDUCE);
  cr_assert_eq(rc->n_gpus, 8);
  cr_assert_eq(rc->bytes, 1048576);
  assert_rel(rc->median, 9.279e-05, 1e-12);
  cr_assert_str_eq(rc->source, "vtrain");
  /* Writing what was read gives the same text: files diff by entry. */
  g_autofree char *again = profile_db_to_json(back);
  cr_assert_str_eq(again, text);
}

Test(db, save_load_directory_and_merge)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-profile-XXXXXX", NULL);
  cr_assert_not_null(dir);
  g_autofree char *sub = g_build_filename(dir, "h200", NULL);
  cr_assert_eq(g_mkdir(sub, 0700), 0);
  g_autoptr(ProfileDb) a = profile_db_new();
  ProfileOpEntry e1 = op_entry("h200", "k1", SIM_PASS_FORWARD, 1e-3);
  ProfileOpEntry e2 = op_entry("h200", "k2", SIM_PASS_FORWARD, 2e-3);
  profile_db_add_op(a, &e1);
  profile_db_add_op(a, &e2);
  g_autoptr(ProfileDb) b = profile_db_new();
  ProfileOpEntry e1b = op_entry("h200", "k1", SIM_PASS_FORWARD, 5e-3);
  profile_db_add_op(b, &e1b);
  g_autofree char *pa = g_build_filename(sub, "a.json", NULL);
  g_autofree char *pb = g_build_filename(sub, "b.json", NULL);
  g_autoptr(GError) error = NULL;
  cr_assert(profile_db_save(a, pa, &error));
  cr_assert(profile_db_save(b, pb, &error));
  /* The directory's files merge in name order: b.json's k1 replaces a.json's. */
  g_autoptr(ProfileDb) all = profile_db_load(dir, &error);
  cr_assert_not_null(all, "%s", error ? error->message : "");
  cr_assert_eq(profile_db_n_ops(all), 2);
  assert_rel(profile_db_find_op(all, "h200", "k1", SIM_PASS_FORWARD)->median, 5e-3, 1e-12);
  assert_rel(profile_db_find_op(all, "h200", "k2", SIM_PASS_FORWARD)->median, 2e-3, 1e-12);
  g_remove(pa);
  g_remove(pb);
  g_rmdir(sub);
  g_rmdir(dir);
}

Test(db, errors_name_the_file_and_place)
{
  g_autoptr(GError) error = NULL;
  cr_assert_null(profile_db_from_json("{\"format\": \"parasol-machine\", \"version\": 1}",
                                      "x.json", &error));
  cr_assert(strstr(error->message, "x.json: format"), "%s", error->message);
  g_clear_error(&error);
  const char *neg = "{\"format\": \"parasol-profile\", \"version\": 1, \"ops\": ["
                    "{\"gpu\": \"h200\", \"key\": \"k\", \"pass\": \"forward\", \"median\": 1},"
                    "{\"gpu\": \"h200\", \"key\": \"k\", \"pass\": \"forward\", \"median\": -1}]}";
  cr_assert_null(profile_db_from_json(neg, "y.json", &error));
  cr_assert(strstr(error->message, "y.json: ops[1].median"), "%s", error->message);
  g_clear_error(&error);
  const char *typo = "{\"format\": \"parasol-profile\", \"version\": 1, \"opz\": []}";
  cr_assert_null(profile_db_from_json(typo, "z.json", &error));
  cr_assert(strstr(error->message, "z.json: opz: unknown key; expected one of: format, version"),
            "%s", error->message);
  g_clear_error(&error);
  const char *pass = "{\"format\": \"parasol-profile\", \"version\": 1, \"ops\": ["
                     "{\"gpu\": \"h200\", \"key\": \"k\", \"pass\": \"sideways\", \"median\": 1}]}";
  cr_assert_null(profile_db_from_json(pass, "p.json", &error));
  cr_assert(strstr(error->message, "p.json: ops[0].pass"), "%s", error->message);
  g_clear_error(&error);
  cr_assert_null(profile_db_from_json("{", "s.json", &error));
  cr_assert(g_str_has_prefix(error->message, "s.json:"), "%s", error->message);
}

/* ---------------------------------------------------------------------------------- */
/* Lookups                                                                             */

/* An entry for the shard of @g's op 1 with batch extent @b whose time is @t, with the
 * shard's work as profile ops writes it. */
static void add_linear_shard(ProfileDb *db, const SimGraph *g, int64_t b, SimPass pass, double t)
{
  int64_t extent[3] = { b, 32, 16 };
  g_autofree char *key = sim_graph_op_shard_key(g, 1, extent);
  SimWork w = { 0 };
  sim_graph_op_work(g, 1, extent, pass, &w);
  ProfileOpEntry e = op_entry("dev", key, pass, t);
  e.flops = sim_work_flops(&w);
  e.bytes = sim_work_bytes(&w);
  e.n_kernels = w.n;
  e.kernels = w.k;
  profile_db_add_op(db, &e);
}

Test(lookup, exact)
{
  g_autoptr(SimGraph) g = one_linear(64, SIM_DTYPE_FP16);
  g_autoptr(ProfileDb) db = profile_db_new();
  add_linear_shard(db, g, 64, SIM_PASS_FORWARD, 7e-6);
  ProfileLookup how;
  assert_rel(profile_db_lookup_op(db, "dev", g, 1, NULL, SIM_PASS_FORWARD, &how), 7e-6, 1e-12);
  cr_assert_eq(how, PROFILE_LOOKUP_EXACT);
  /* Another device, or another pass, is not the same entry. */
  cr_assert_lt(profile_db_lookup_op(db, "other", g, 1, NULL, SIM_PASS_FORWARD, &how), 0);
  cr_assert_eq(how, PROFILE_LOOKUP_NONE);
  cr_assert_lt(profile_db_lookup_op(db, "dev", g, 1, NULL, SIM_PASS_BACKWARD, &how), 0);
}

Test(lookup, interpolates_along_the_batch)
{
  g_autoptr(SimGraph) g = one_linear(64, SIM_DTYPE_FP16);
  g_autoptr(ProfileDb) db = profile_db_new();
  /* b = 4 took 1 ms and b = 16 took 4 ms (FLOPs grow 4x); b = 8 lies a third of the way
   * in FLOPs: 1 + 3 * (8 - 4) / (16 - 4) = 2 ms. */
  add_linear_shard(db, g, 4, SIM_PASS_FORWARD, 1e-3);
  add_linear_shard(db, g, 16, SIM_PASS_FORWARD, 4e-3);
  add_linear_shard(db, g, 2, SIM_PASS_FORWARD, 0.9e-3);
  ProfileLookup how;
  int64_t q[3] = { 8, 32, 16 };
  assert_rel(profile_db_lookup_op(db, "dev", g, 1, q, SIM_PASS_FORWARD, &how), 2e-3, 1e-9);
  cr_assert_eq(how, PROFILE_LOOKUP_INTERPOLATED);
  /* The nearest pair brackets b = 3: 0.9 + 0.1 * (3 - 2) / (4 - 2) = 0.95 ms. */
  int64_t q3[3] = { 3, 32, 16 };
  assert_rel(profile_db_lookup_op(db, "dev", g, 1, q3, SIM_PASS_FORWARD, &how), 0.95e-3, 1e-9);
  /* Nothing is extrapolated: b = 32 lies above every entry. */
  int64_t q32[3] = { 32, 32, 16 };
  cr_assert_lt(profile_db_lookup_op(db, "dev", g, 1, q32, SIM_PASS_FORWARD, &how), 0);
  cr_assert_eq(how, PROFILE_LOOKUP_NONE);
  /* A shard that also differs in n (a tensor-parallel split) lies on no segment. */
  int64_t qn[3] = { 8, 16, 16 };
  cr_assert_lt(profile_db_lookup_op(db, "dev", g, 1, qn, SIM_PASS_FORWARD, &how), 0);
}

Test(lookup, needs_the_same_family)
{
  /* The same shapes in fp32 are another family than the fp16 entries. */
  g_autoptr(SimGraph) g16 = one_linear(64, SIM_DTYPE_FP16);
  g_autoptr(SimGraph) g32 = one_linear(64, SIM_DTYPE_FP32);
  g_autoptr(ProfileDb) db = profile_db_new();
  add_linear_shard(db, g16, 4, SIM_PASS_FORWARD, 1e-3);
  add_linear_shard(db, g16, 16, SIM_PASS_FORWARD, 4e-3);
  int64_t q[3] = { 8, 32, 16 };
  cr_assert_lt(profile_db_lookup_op(db, "dev", g32, 1, q, SIM_PASS_FORWARD, NULL), 0);
}

Test(lookup, collectives)
{
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileCollEntry a = { .gpu = "g", .kind = PROFILE_COLL_ALLGATHER, .n_gpus = 4, .bytes = 1e6,
                         .median = 10e-6, .min = 10e-6, .max = 10e-6, .repetitions = 1 };
  ProfileCollEntry b = a;
  b.bytes = 3e6;
  b.median = b.min = b.max = 30e-6;
  profile_db_add_collective(db, &a);
  profile_db_add_collective(db, &b);
  ProfileLookup how;
  assert_rel(profile_db_lookup_collective(db, "g", PROFILE_COLL_ALLGATHER, 4, 1e6, &how), 10e-6,
             1e-12);
  cr_assert_eq(how, PROFILE_LOOKUP_EXACT);
  assert_rel(profile_db_lookup_collective(db, "g", PROFILE_COLL_ALLGATHER, 4, 2e6, &how), 20e-6,
             1e-12);
  cr_assert_eq(how, PROFILE_LOOKUP_INTERPOLATED);
  cr_assert_lt(profile_db_lookup_collective(db, "g", PROFILE_COLL_ALLGATHER, 8, 2e6, &how), 0);
  cr_assert_lt(profile_db_lookup_collective(db, "g", PROFILE_COLL_ALLREDUCE, 4, 2e6, &how), 0);
}

/* ---------------------------------------------------------------------------------- */
/* The profile cost model                                                              */

static SimDeviceSpec test_device(void)
{
  SimDeviceSpec d = {
    .name = "dev",
    .vendor_name = "test device",
    .mem_bandwidth = 1000e9,
    .mem_capacity = 16LL << 30,
    .sm_count = 100,
    .launch_overhead = 5e-6,
    .source = "tests",
  };
  d.peak_flops[SIM_DTYPE_FP32] = 20e12;
  d.peak_flops[SIM_DTYPE_FP16] = 300e12;
  return d;
}

Test(cost, answers_from_the_database_then_falls_back)
{
  g_autoptr(SimGraph) g = one_linear(64, SIM_DTYPE_FP16);
  SimDeviceSpec dev = test_device();
  g_autoptr(ProfileDb) db = profile_db_new();
  add_linear_shard(db, g, 64, SIM_PASS_FORWARD, 123e-6);
  g_autoptr(SimCostModel) m = profile_cost_model_new(db, NULL, NULL);
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(NULL);
  /* The forward entry answers; the backward pass, unknown, is the roofline's. */
  assert_rel(sim_cost_model_op_time(m, &dev, g, 1, NULL, SIM_PASS_FORWARD), 123e-6, 1e-12);
  double want = sim_cost_model_op_time(roof, &dev, g, 1, NULL, SIM_PASS_BACKWARD);
  assert_rel(sim_cost_model_op_time(m, &dev, g, 1, NULL, SIM_PASS_BACKWARD), want, 1e-12);
  /* Asked again, the cache answers and the counts stay per distinct query. */
  assert_rel(sim_cost_model_op_time(m, &dev, g, 1, NULL, SIM_PASS_FORWARD), 123e-6, 1e-12);
  int exact, interp, missed;
  cr_assert(profile_cost_model_stats(m, &exact, &interp, &missed));
  cr_assert_eq(exact, 1);
  cr_assert_eq(interp, 0);
  cr_assert_eq(missed, 1);
  cr_assert_not(profile_cost_model_stats(roof, NULL, NULL, NULL));
  /* Kernels are the fallback's. */
  SimWork w = { 0 };
  sim_graph_op_work(g, 1, NULL, SIM_PASS_FORWARD, &w);
  assert_rel(sim_cost_model_kernel_time(m, &dev, &w.k[0]),
             sim_cost_model_kernel_time(roof, &dev, &w.k[0]), 1e-12);
}

Test(cost, device_name_selects_the_entries)
{
  g_autoptr(SimGraph) g = one_linear(64, SIM_DTYPE_FP16);
  SimDeviceSpec dev = test_device();
  dev.name = "something-else";
  g_autoptr(ProfileDb) db = profile_db_new();
  add_linear_shard(db, g, 64, SIM_PASS_FORWARD, 123e-6);
  g_autoptr(SimCostModel) by_spec = profile_cost_model_new(db, NULL, NULL);
  g_autoptr(SimCostModel) named = profile_cost_model_new(db, "dev", NULL);
  cr_assert_neq(sim_cost_model_op_time(by_spec, &dev, g, 1, NULL, SIM_PASS_FORWARD), 123e-6);
  assert_rel(sim_cost_model_op_time(named, &dev, g, 1, NULL, SIM_PASS_FORWARD), 123e-6, 1e-12);
}

/* A machine of @n devices of test_device()'s figures, called "dev". */
static SimMachine *test_machine(int n)
{
  g_autofree char *json = g_strdup_printf(
    "{\"format\": \"parasol-machine\", \"version\": 1, \"name\": \"test\","
    " \"node\": {\"gpu\": {\"name\": \"dev\", \"peak_TFLOPS\": {\"fp32\": 20, \"fp16\": 300},"
    " \"memory_bandwidth_GBps\": 1000, \"memory_GiB\": 16, \"sm_count\": 100,"
    " \"launch_overhead_us\": 5}, \"gpus\": %d,"
    " \"fabric\": {\"type\": \"nvswitch\", \"bandwidth_GBps\": 100},"
    " \"pcie\": {\"bandwidth_GBps\": 32}}}", n);
  g_autoptr(GError) error = NULL;
  SimMachine *m = sim_machine_from_json(json, "test.json", 0, &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  return m;
}

/* Fills @db with every shard of @g on @n devices, timed by the roofline model: a
 * simulation with the database must then equal one with the roofline. */
static void roofline_db(ProfileDb *db, const SimGraph *g, int n, const SimDeviceSpec *dev)
{
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(NULL);
  ProfileEnumerateOptions eo = { .n_devices = n };
  g_autoptr(ProfileShapes) shapes = profile_enumerate_shapes(g, &eo);
  for (int i = 0; i < profile_shapes_n(shapes); i++)
    for (int p = 0; p < SIM_PASS_COUNT; p++) {
      int op = profile_shapes_op(shapes, i);
      const int64_t *x = profile_shapes_extent(shapes, i);
      ProfileOpEntry e = op_entry("dev", profile_shapes_key(shapes, i), (SimPass)p,
                                  sim_cost_model_op_time(roof, dev, g, op, x, (SimPass)p));
      profile_db_add_op(db, &e);
    }
}

Test(cost, simulation_with_a_roofline_database_equals_the_roofline)
{
  g_autoptr(SimGraph) g = tiny_mlp();
  g_autoptr(SimMachine) m = test_machine(2);
  g_autoptr(ProfileDb) db = profile_db_new();
  roofline_db(db, g, 2, sim_machine_device_spec(m, 0));
  g_autoptr(GError) error = NULL;
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimOptions o = sim_options_default();
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(NULL);
  g_autoptr(SimReport) r1 = sim_simulate(g, m, s, roof, &o, &error);
  cr_assert_not_null(r1, "%s", error ? error->message : "");
  g_autoptr(SimCostModel) pm = profile_cost_model_new(db, NULL, NULL);
  g_autoptr(SimReport) r2 = sim_simulate(g, m, s, pm, &o, &error);
  cr_assert_not_null(r2, "%s", error ? error->message : "");
  assert_rel(sim_report_iteration_time(r2), sim_report_iteration_time(r1), 1e-12);
  int exact, interp, missed;
  cr_assert(profile_cost_model_stats(pm, &exact, &interp, &missed));
  cr_assert_gt(exact, 0);
  cr_assert_eq(interp, 0);
}

/* ---------------------------------------------------------------------------------- */
/* Calibration                                                                         */

/* A graph with every kernel kind the roofline has an efficiency for, in fp32, where the
 * test device's 20 TFLOP/s make the products compute bound: linear (GEMM), conv2d (conv),
 * layer norm (memory), embedding (gather) and an LSTM (recurrent). */
static SimGraph *all_kinds(void)
{
  SimGraph *g = sim_graph_new("all-kinds");
  int img = sim_graph_input(g, "img", SIM_DTYPE_FP32, 4, (int64_t[]){ 32, 64, 28, 28 });
  SimConvParams cp = sim_conv_params(128, 3, 3);
  cp.padding[0] = cp.padding[1] = 1;
  sim_graph_conv2d(g, "conv", img, &cp);
  int ids = sim_graph_input(g, "ids", SIM_DTYPE_INT64, 2, (int64_t[]){ 32, 64 });
  int e = sim_graph_embedding(g, "embed", ids, 32000, 1024);
  int n = sim_graph_layernorm(g, "ln", e);
  int h = sim_graph_linear(g, "fc", n, 4096, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_lstm(g, "lstm", h, 1024);
  cr_assert(sim_graph_check(g, NULL));
  return g;
}

Test(calibrate, recovers_known_efficiencies)
{
  g_autoptr(SimGraph) g = all_kinds();
  SimDeviceSpec dev = test_device();
  SimRooflineParams truth = sim_roofline_params_default();
  truth.gemm_efficiency = 0.62;
  truth.conv_efficiency = 0.41;
  truth.memory_efficiency = 0.7;
  truth.gather_efficiency = 0.33;
  truth.recurrent_efficiency = 0.21;
  truth.cuda_core_efficiency = 0; /* the fp32 kernels take the GEMM and conv efficiencies */
  g_autoptr(SimCostModel) roof = sim_cost_model_new_roofline(&truth);
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileEnumerateOptions eo = { .n_devices = 4 };
  g_autoptr(ProfileShapes) shapes = profile_enumerate_shapes(g, &eo);
  for (int i = 0; i < profile_shapes_n(shapes); i++)
    for (int p = 0; p < 2; p++) {
      int op = profile_shapes_op(shapes, i);
      const int64_t *x = profile_shapes_extent(shapes, i);
      SimWork w = { 0 };
      sim_graph_op_work(g, op, x, (SimPass)p, &w);
      if (!w.n)
        continue;
      ProfileOpEntry e = op_entry("dev", profile_shapes_key(shapes, i), (SimPass)p,
                                  sim_cost_model_op_time(roof, &dev, g, op, x, (SimPass)p));
      e.n_kernels = w.n;
      e.kernels = w.k;
      profile_db_add_op(db, &e);
    }
  ProfileCalibration cal;
  g_autoptr(GError) error = NULL;
  cr_assert(profile_calibrate_roofline(db, "dev", &dev, NULL, &cal, &error), "%s",
            error ? error->message : "");
  cr_assert_eq(cal.n_entries, profile_db_n_ops(db));
  for (int i = 0; i < 5; i++)
    cr_assert(cal.fitted[i], "efficiency %d not fitted", i);
  assert_rel(cal.params.gemm_efficiency, 0.62, 1e-3);
  assert_rel(cal.params.conv_efficiency, 0.41, 1e-3);
  assert_rel(cal.params.memory_efficiency, 0.7, 1e-3);
  assert_rel(cal.params.gather_efficiency, 0.33, 1e-3);
  assert_rel(cal.params.recurrent_efficiency, 0.21, 1e-3);
  cr_assert_lt(cal.mean_abs_error_after, 1e-4);
  cr_assert_gt(cal.mean_abs_error_before, 0.05);
  cr_assert(isnan(profile_calibration_residual(db, 0, &dev, &cal.params)) == 0);
}

Test(calibrate, needs_entries_with_kernels)
{
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileOpEntry e = op_entry("dev", "k", SIM_PASS_FORWARD, 1e-3);
  profile_db_add_op(db, &e);
  SimDeviceSpec dev = test_device();
  ProfileCalibration cal;
  g_autoptr(GError) error = NULL;
  cr_assert_not(profile_calibrate_roofline(db, "dev", &dev, NULL, &cal, &error));
  cr_assert_eq(error->code, PROFILE_ERROR_INVALID);
}

/* Writes NCCL tests' CSV for a ring of @n ranks on links of 100 GB/s and 1 us whose
 * steps cost 3 us more and whose bandwidth is 80% used. */
static void write_ring_csv(const char *dir, int n)
{
  GString *s = g_string_new("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n");
  for (double bytes = 1 << 20; bytes <= 1 << 28; bytes *= 2) {
    double steps = 2.0 * (n - 1);
    double t = steps * (1e-6 + 3e-6) + steps * (bytes / n) / (100e9 * 0.8);
    g_string_append_printf(s, "%.0f,%.0f,float,%.1f,1.0,%.1f,1.0\n", bytes, bytes / 4, t * 1e9,
                           t * 1e9);
  }
  g_autofree char *name = g_strdup_printf("allreduce_%dgpu.csv", n);
  g_autofree char *path = g_build_filename(dir, name, NULL);
  cr_assert(g_file_set_contents(path, s->str, -1, NULL));
  g_string_free(s, TRUE);
}

Test(calibrate, fits_the_ring_collective)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-nccl-XXXXXX", NULL);
  for (int n = 2; n <= 8; n *= 2)
    write_ring_csv(dir, n);
  g_autoptr(ProfileDb) db = profile_db_new();
  g_autoptr(GError) error = NULL;
  cr_assert(profile_db_import_nccl_tests(db, dir, "gpu", "synthetic", &error), "%s",
            error ? error->message : "");
  /* 1 MiB to 256 MiB: 9 sizes for each of 3 GPU counts. */
  cr_assert_eq(profile_db_n_collectives(db), 27);
  cr_assert_str_eq(profile_db_source(db, 0), "synthetic");
  ProfileCollFit fit;
  cr_assert(profile_db_fit_collective(db, "gpu", PROFILE_COLL_ALLREDUCE, 100e9, 1e-6, &fit,
                                      &error), "%s", error ? error->message : "");
  cr_assert_eq(fit.n_points, 27);
  /* The times were written in whole and tenth nanoseconds, a relative rounding below 1e-6. */
  assert_rel(fit.bandwidth_efficiency, 0.8, 1e-5);
  assert_rel(fit.step_latency, 3e-6, 1e-4);
  cr_assert_lt(fit.worst_error, 1e-5);
  for (int n = 2; n <= 8; n *= 2) {
    g_autofree char *name = g_strdup_printf("allreduce_%dgpu.csv", n);
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_remove(path);
  }
  g_rmdir(dir);
}

/* ---------------------------------------------------------------------------------- */
/* Enumeration                                                                         */

Test(enumerate, counts_degree_vectors)
{
  /* b = 8, n = 32, k = 16 on 4 devices: degree vectors whose product divides 4 are
   * (1,1,1), three with a single 2, three with a single 4 and three with two 2s: 10
   * shards of 10 different shapes. */
  g_autoptr(SimGraph) g = one_linear(8, SIM_DTYPE_FP16);
  ProfileEnumerateOptions eo = { .n_devices = 4 };
  g_autoptr(ProfileShapes) s = profile_enumerate_shapes(g, &eo);
  cr_assert_eq(profile_shapes_n(s), 10);
  cr_assert_eq(profile_shapes_n_configs(s), 10);
  /* The first is the whole operator. */
  cr_assert_eq(profile_shapes_op(s, 0), 1);
  g_autofree char *whole = sim_graph_op_shard_key(g, 1, NULL);
  cr_assert_str_eq(profile_shapes_key(s, 0), whole);
  /* Three devices allow only degree 1 or 3, and 3 divides none of 8, 32, 16. */
  eo.n_devices = 3;
  g_autoptr(ProfileShapes) s3 = profile_enumerate_shapes(g, &eo);
  cr_assert_eq(profile_shapes_n(s3), 1);
  eo.max_shapes = 4;
  eo.n_devices = 4;
  g_autoptr(ProfileShapes) s4 = profile_enumerate_shapes(g, &eo);
  cr_assert_eq(profile_shapes_n(s4), 4);
}

Test(enumerate, identical_layers_share_shapes)
{
  g_autoptr(SimGraph) g = sim_graph_new("two");
  int x = sim_graph_input(g, "x", SIM_DTYPE_FP16, 2, (int64_t[]){ 8, 16 });
  int h = sim_graph_linear(g, "fc1", x, 16, FALSE, SIM_UNARY_IDENTITY);
  sim_graph_linear(g, "fc2", h, 16, FALSE, SIM_UNARY_IDENTITY);
  ProfileEnumerateOptions eo = { .n_devices = 2 };
  g_autoptr(ProfileShapes) s = profile_enumerate_shapes(g, &eo);
  /* Each layer has (1,1,1), (2,1,1), (1,2,1), (1,1,2); the second layer's are the same. */
  cr_assert_eq(profile_shapes_n(s), 4);
  cr_assert_eq(profile_shapes_n_configs(s), 8);
  for (int i = 0; i < profile_shapes_n(s); i++)
    cr_assert_eq(profile_shapes_op(s, i), 1);
}

Test(enumerate, microbatches_cut_the_sample_dimension)
{
  g_autoptr(SimGraph) g = one_linear(8, SIM_DTYPE_FP16);
  /* One device: micro-batches of 8, 4 and 2 samples (3 does not divide 8). */
  int mbs[] = { 1, 2, 4, 3 };
  ProfileEnumerateOptions eo = { .n_devices = 1, .microbatches = mbs, .n_microbatches = 4 };
  g_autoptr(ProfileShapes) s = profile_enumerate_shapes(g, &eo);
  cr_assert_eq(profile_shapes_n(s), 3);
  cr_assert_eq(profile_shapes_extent(s, 1)[0], 4);
  cr_assert_eq(profile_shapes_extent(s, 2)[0], 2);
}

/* ---------------------------------------------------------------------------------- */
/* Measuring on the CPU                                                                */

Test(cpu, measures_a_tiny_model_and_simulates_with_it)
{
  g_autoptr(SimGraph) g = tiny_mlp();
  g_autoptr(SimMachine) m = test_machine(2);
  ProfileEnumerateOptions eo = { .n_devices = 2 };
  g_autoptr(ProfileShapes) shapes = profile_enumerate_shapes(g, &eo);
  cr_assert_gt(profile_shapes_n(shapes), 3);
  g_autoptr(ProfileRunner) r = profile_runner_cpu_new("dev");
  cr_assert_str_eq(profile_runner_device_name(r), "dev");
  ProfileMeasureOptions mo = profile_measure_options_default();
  mo.warmup = 1;
  mo.repetitions = 3;
  mo.update = TRUE;
  g_autoptr(ProfileDb) db = profile_db_new();
  int skipped = -1;
  g_autoptr(GError) error = NULL;
  int added = profile_measure_shapes(r, db, g, shapes, &mo, NULL, NULL, &skipped, &error);
  cr_assert_gt(added, 0, "%s", error ? error->message : "");
  cr_assert_eq(skipped, 0);
  cr_assert_eq(profile_db_n_ops(db), added);
  cr_assert_str_eq(profile_db_get_device_note(db, "dev", "runner"),
                   "cpu: the kernels of the shard's work in fp32 reference code, one thread");
  for (int i = 0; i < profile_db_n_ops(db); i++) {
    const ProfileOpEntry *e = profile_db_op(db, i);
    cr_assert_gt(e->median, 0.0, "%s", e->key);
    cr_assert(e->min <= e->median && e->median <= e->max);
    cr_assert_eq(e->repetitions, 3);
    cr_assert_gt(e->n_kernels, 0);
  }
  /* Every op with weights has an update entry for its whole shape. */
  g_autofree char *fc1 = sim_graph_op_shard_key(g, sim_graph_op_by_name(g, "fc1"), NULL);
  cr_assert_not_null(profile_db_find_op(db, "dev", fc1, SIM_PASS_UPDATE));

  /* Database -> cost model -> simulation: every compute task of the data-parallel plan
   * is priced by a measurement. */
  g_autoptr(SimStrategy) s = sim_strategy_data_parallel(g, m, 2, &error);
  cr_assert_not_null(s);
  g_autoptr(SimCostModel) pm = profile_cost_model_new(db, NULL, NULL);
  SimOptions o = sim_options_default();
  g_autoptr(SimReport) rep = sim_simulate(g, m, s, pm, &o, &error);
  cr_assert_not_null(rep, "%s", error ? error->message : "");
  cr_assert_gt(sim_report_iteration_time(rep), 0.0);
  int exact = 0, interp = 0, missed = 0;
  cr_assert(profile_cost_model_stats(pm, &exact, &interp, &missed));
  cr_assert_gt(exact, 0);
  int fc2 = sim_graph_op_by_name(g, "fc2");
  int64_t half[3] = { 4, 10, 64 };
  g_autofree char *key = sim_graph_op_shard_key(g, fc2, half);
  const ProfileOpEntry *e = profile_db_find_op(db, "dev", key, SIM_PASS_BACKWARD);
  cr_assert_not_null(e);
  SimDeviceSpec dev = test_device();
  assert_rel(sim_cost_model_op_time(pm, &dev, g, fc2, half, SIM_PASS_BACKWARD), e->median,
             1e-12);
  /* The CPU calibrates like any device. */
  ProfileCalibration cal;
  cr_assert(profile_calibrate_roofline(db, "dev", sim_machine_device_spec(m, 0), NULL, &cal,
                                       &error));
  cr_assert_leq(cal.rms_log_after, cal.rms_log_before + 1e-12);
}

/* A progress callback that asks the measurement to stop after two shapes, as Ctrl-C
 * does through ProfileMeasureOptions.stop. */
static volatile sig_atomic_t stop_flag;

static void stop_after_two(int done, int total, const char *key, gpointer user_data)
{
  *(int *)user_data = done;
  if (done == 2)
    stop_flag = 1;
}

Test(cpu, a_stopped_measurement_keeps_the_shapes_done)
{
  g_autoptr(SimGraph) g = tiny_mlp();
  ProfileEnumerateOptions eo = { .n_devices = 2 };
  g_autoptr(ProfileShapes) shapes = profile_enumerate_shapes(g, &eo);
  cr_assert_gt(profile_shapes_n(shapes), 3);
  g_autoptr(ProfileRunner) r = profile_runner_cpu_new("dev");
  ProfileMeasureOptions mo = profile_measure_options_default();
  mo.warmup = 0;
  mo.repetitions = 2;
  mo.stop = &stop_flag;
  stop_flag = 0;
  g_autoptr(ProfileDb) db = profile_db_new();
  g_autoptr(GError) error = NULL;
  int done = 0, skipped = -1;
  int added = profile_measure_shapes(r, db, g, shapes, &mo, stop_after_two, &done, &skipped,
                                     &error);
  /* Not an error: two shapes, forward and backward each, and nothing after them. */
  cr_assert_null(error, "%s", error ? error->message : "");
  cr_assert_eq(done, 2);
  cr_assert_eq(added, 4);
  cr_assert_eq(profile_db_n_ops(db), 4);
  for (int i = 0; i < 2; i++) {
    g_autofree char *key =
      sim_graph_op_shard_key(g, profile_shapes_op(shapes, i), profile_shapes_extent(shapes, i));
    cr_expect_not_null(profile_db_find_op(db, "dev", key, SIM_PASS_FORWARD), "%s", key);
  }
  /* Already stopped: nothing is measured. */
  g_autoptr(ProfileDb) none = profile_db_new();
  cr_assert_eq(profile_measure_shapes(r, none, g, shapes, &mo, NULL, NULL, NULL, &error), 0);
  cr_assert_eq(profile_db_n_ops(none), 0);
}

Test(cpu, measure_op_with_a_time_budget)
{
  g_autoptr(SimGraph) g = one_linear(8, SIM_DTYPE_FP32);
  g_autoptr(ProfileRunner) r = profile_runner_cpu_new(NULL);
  cr_assert_str_eq(profile_runner_device_name(r), "cpu");
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileMeasureOptions mo = profile_measure_options_default();
  mo.repetitions = 2;
  mo.min_seconds = 1e-3;
  mo.max_repetitions = 50;
  g_autoptr(GError) error = NULL;
  const ProfileOpEntry *e = profile_measure_op(r, db, g, 1, NULL, SIM_PASS_FORWARD, &mo, &error);
  cr_assert_not_null(e, "%s", error ? error->message : "");
  /* The budget or the cap ends the repetitions, never fewer than asked for. */
  cr_assert_geq(e->repetitions, 2);
  cr_assert_leq(e->repetitions, 50);
}

/* ---------------------------------------------------------------------------------- */
/* Names                                                                               */

Test(names, gpus_and_collectives)
{
  const struct {
    const char *vendor, *name;
  } cases[] = {
    { "NVIDIA H200", "h200" },
    { "NVIDIA A100-SXM4-80GB", "a100-80gb" },
    { "NVIDIA H100 80GB HBM3", "h100-sxm" },
    { "Tesla V100-SXM2-16GB", "v100-16gb" },
    { "NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada-generation" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree char *n = profile_gpu_name_from_vendor(cases[i].vendor);
    cr_assert_str_eq(n, cases[i].name);
  }
  for (int k = 0; k < PROFILE_COLL_COUNT; k++)
    cr_assert_eq(profile_coll_kind_from_name(profile_coll_kind_name((ProfileCollKind)k)), k);
  cr_assert_eq(profile_coll_kind_from_name("allreduce"), PROFILE_COLL_ALLREDUCE);
  cr_assert_eq(profile_coll_kind_from_name("broadcast"), -1);
}

Test(names, cuda_entry_points_fail_clearly_without_a_gpu)
{
  if (profile_have_cuda())
    cr_skip_test("this build has CUDA; the gpu suite covers it");
  g_autoptr(GError) error = NULL;
  cr_assert_null(profile_runner_cuda_new(0, NULL, &error));
  cr_assert_eq(error->code, PROFILE_ERROR_DEVICE);
  cr_assert(strstr(error->message, "without CUDA"), "%s", error->message);
}

/* ---------------------------------------------------------------------------------- */
/* The minimum measuring time, with a runner whose every run takes u = 2^-13 s (exact in
 * binary, so sums of runs are exact): measuring stops once the timed runs add up to
 * min_seconds, not before, and not more than a run later; the cap and the plain count
 * hold without it.                                                                      */

#define FAKE_RUN (1.0 / 8192)

static int fake_runs;

static const char *fake_device(ProfileRunner *self)
{
  return "fake";
}

static gboolean fake_prepare(ProfileRunner *self, const SimGraph *g, int op,
                             const int64_t *extent, GError **error)
{
  return TRUE;
}

static gboolean fake_run(ProfileRunner *self, SimPass pass, int n, double *seconds,
                         GError **error)
{
  for (int i = 0; i < n; i++)
    seconds[i] = FAKE_RUN;
  fake_runs += n;
  return TRUE;
}

static const ProfileRunnerClass fake_class = {
  .api_version = PROFILE_RUNNER_API_VERSION,
  .name = "fake",
  .device_name = fake_device,
  .prepare = fake_prepare,
  .run = fake_run,
};

static int fake_repetitions(int reps, double min_seconds, int cap)
{
  g_autoptr(SimGraph) g = one_linear(8, SIM_DTYPE_FP32);
  ProfileRunner *r = g_new0(ProfileRunner, 1);
  r->klass = &fake_class;
  g_autoptr(ProfileDb) db = profile_db_new();
  ProfileMeasureOptions mo = profile_measure_options_default();
  mo.warmup = 2;
  mo.repetitions = reps;
  mo.min_seconds = min_seconds;
  mo.max_repetitions = cap;
  g_autoptr(GError) error = NULL;
  fake_runs = 0;
  const ProfileOpEntry *e = profile_measure_op(r, db, g, 1, NULL, SIM_PASS_FORWARD, &mo, &error);
  cr_assert_not_null(e, "%s", error ? error->message : "");
  int n = e->repetitions;
  cr_assert_eq(fake_runs, n + 2, "every run but the warm-up is timed: %d runs, %d timed",
               fake_runs, n);
  cr_assert_float_eq(e->median, FAKE_RUN, 1e-15);
  profile_runner_free(r);
  return n;
}

Test(measure, minimum_time_sets_the_repetitions)
{
  /* 2^-7 s is 64 runs: at least that many, at most one more (the last batch's rounding). */
  int n = fake_repetitions(10, 64 * FAKE_RUN, 1000);
  cr_expect_geq(n * FAKE_RUN, 64 * FAKE_RUN, "%d runs time %g s, less than 2^-7 s", n,
                n * FAKE_RUN);
  cr_expect_leq(n, 65, "%d runs, where 64 reach the minimum time", n);
  /* A minimum the asked-for runs already reach adds none. */
  cr_expect_eq(fake_repetitions(10, 4 * FAKE_RUN, 1000), 10);
}

Test(measure, repetitions_without_minimum_time_and_the_cap)
{
  cr_expect_eq(fake_repetitions(10, 0, 1000), 10);
  /* The cap ends a minimum time the runs would need 8192 of to reach. */
  cr_expect_eq(fake_repetitions(10, 1.0, 300), 300);
}
