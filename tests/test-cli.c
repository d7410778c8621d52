/* test-cli.c — the parasol program on bad input: exit status 2, a message that names what
 * was wrong and where, and nothing written.  Runs the built program (PARASOL_BIN).
 *
 * About 1,200 lines: one program (tests/meson.build) for every command's bad input,
 * sharing the helpers that run the program and read what it wrote. */
#include "parasol-sim.h"

#include <criterion/criterion.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <stdlib.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
  int status;
  char *out, *err;
} Run;

/* Runs parasol with the NULL-terminated arguments after the program name. */
static Run run(const char *first, ...)
{
  const char *bin = g_getenv("PARASOL_BIN");
  cr_assert_not_null(bin, "PARASOL_BIN is not set");
  g_autoptr(GPtrArray) argv = g_ptr_array_new();
  g_ptr_array_add(argv, (char *)bin);
  va_list ap;
  va_start(ap, first);
  for (const char *a = first; a; a = va_arg(ap, const char *))
    g_ptr_array_add(argv, (char *)a);
  va_end(ap);
  g_ptr_array_add(argv, NULL);
  Run r = { 0 };
  int wait = 0;
  GError *error = NULL;
  cr_assert(g_spawn_sync(NULL, (char **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out,
                         &r.err, &wait, &error),
            "%s", error ? error->message : "");
  r.status = WIFEXITED(wait) ? WEXITSTATUS(wait) : -1;
  return r;
}

static void run_clear(Run *r)
{
  g_free(r->out);
  g_free(r->err);
}

/* Exit status 2 and @expect in the message. */
static void expect_refused(Run r, const char *expect)
{
  cr_expect_eq(r.status, 2, "exit status %d, stderr: %s", r.status, r.err);
  cr_expect(strstr(r.err, expect) != NULL, "expected \"%s\" in: %s", expect, r.err);
  run_clear(&r);
}

#define SMALL_GPT "--model", "gpt", "--param", "layers=1,hidden=64,heads=4,seq=16,vocab=1001", \
                  "--machine", "dgx-a100:1", "--global-batch", "8"

Test(cli, counts_must_be_whole_and_positive)
{
  /* 0 once meant "not given" inside and was taken silently. */
  expect_refused(run("simulate", "--dp", "0", NULL), "--dp 0: expected a whole number from 1");
  expect_refused(run("simulate", "--tp", "two", NULL), "--tp two: expected a whole number");
  expect_refused(run("simulate", "--pp", "0", NULL), "--pp 0: expected a whole number");
  expect_refused(run("simulate", "--microbatches", "0", NULL), "--microbatches 0:");
  expect_refused(run("simulate", "--microbatch-size", "0", NULL),
                 "--microbatch-size 0: expected a whole number from 1 to 2147483647");
  expect_refused(run("simulate", "--global-batch", "-5", NULL), "--global-batch -5:");
  expect_refused(run("simulate", "--dp", "99999999999", NULL), "from 1 to 2147483647");
  expect_refused(run("search", "--dp", "0", "--budget", "10evals", NULL), "--dp 0:");
  /* Device lists: one parser for the search's --devices and simulate's --trace-devices. */
  expect_refused(run("search", "--devices", "0-99", "--budget", "10evals", NULL),
                 "--devices 0-99: '0-99' is not a device or a range of devices a-b[:step] "
                 "within 0..7");
  expect_refused(run("simulate", "--trace", "unused.json", "--trace-devices", "4-2", NULL),
                 "--trace-devices 4-2: '4-2' is not a device");
  expect_refused(run("simulate", "--bucket-mb", "-1", NULL),
                 "--bucket-mb -1: expected a size in MB from 0 to 1000000");
}

/* The first number named @name in @json (the outer object's members come before the
 * report a search prints inside it). */
static double json_number(const char *json, const char *name)
{
  g_autofree char *quoted = g_strdup_printf("\"%s\"", name);
  const char *key = strstr(json, quoted);
  cr_assert_not_null(key, "no %s in: %s", name, json);
  const char *colon = strchr(key, ':');
  cr_assert_not_null(colon);
  return g_ascii_strtod(colon + 1, NULL);
}

/* "iteration_time_s" of a --json report. */
static double iteration_time(const char *json)
{
  return json_number(json, "iteration_time_s");
}

/* The tensor-parallel overlap's parameters (--tp-overlap-chunks, --tp-overlap-sms A,O). */
Test(cli, tensor_parallel_overlap_parameters_are_checked)
{
  expect_refused(run("simulate", SMALL_GPT, "--tp", "2", "--sequence-parallel",
                     "--tp-comm-overlap", "--tp-overlap-sms", "24", NULL),
                 "--tp-overlap-sms '24': expected two counts of SMs, A,O");
  expect_refused(run("simulate", SMALL_GPT, "--tp", "2", "--sequence-parallel",
                     "--tp-comm-overlap", "--tp-overlap-sms", "24,-1", NULL),
                 "--tp-overlap-sms '24,-1'");
  expect_refused(run("simulate", SMALL_GPT, "--tp", "2", "--sequence-parallel",
                     "--tp-comm-overlap", "--tp-overlap-chunks", "-3", NULL),
                 "--tp-overlap-chunks -3: expected 0 (the tensor-parallel degree) or more");
  Run ok = run("simulate", "--model", "gpt", "--param", "layers=1,hidden=64,heads=4,seq=16,vocab=1024",
               "--machine", "dgx-a100:1", "--global-batch", "8", "--tp", "2",
               "--sequence-parallel", "--tp-comm-overlap", "--tp-overlap-sms", "20,8",
               "--tp-overlap-chunks", "4", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
}

Test(cli, model_parameters_are_checked_where_they_are_given)
{
  expect_refused(run("simulate", "--coll-efficiency", "0", NULL),
                 "--coll-efficiency 0: expected a fraction in (0, 1]");
  expect_refused(run("simulate", "--memory-efficiency", "nan", NULL),
                 "--memory-efficiency nan: expected a fraction in (0, 1]");
  expect_refused(run("simulate", "--gemm-efficiency", "1.5", NULL), "--gemm-efficiency 1.5:");
  expect_refused(run("simulate", "--gemm-latency-us", "-1", NULL),
                 "--gemm-latency-us -1: expected a number, 0 or more");
  expect_refused(run("simulate", "--host-step-us", "soon", NULL), "--host-step-us soon:");
}

Test(cli, a_parameter_given_as_0_is_0_not_the_default)
{
  /* A ring step's fixed cost: 2 us unless given; 0 given is 0 (inside, -1 is "not given"). */
  Run dflt = run("simulate", SMALL_GPT, "--dp", "8", "--json", NULL);
  Run zero = run("simulate", SMALL_GPT, "--dp", "8", "--json", "--coll-latency-us", "0", NULL);
  Run big = run("simulate", SMALL_GPT, "--dp", "8", "--json", "--coll-latency-us", "1000", NULL);
  cr_assert_eq(dflt.status, 0, "%s", dflt.err);
  cr_assert_eq(zero.status, 0, "%s", zero.err);
  cr_assert_eq(big.status, 0, "%s", big.err);
  double t_dflt = iteration_time(dflt.out);
  double t_zero = iteration_time(zero.out);
  double t_big = iteration_time(big.out);
  cr_expect_lt(t_zero, t_dflt, "0 us: %g s, default: %g s", t_zero, t_dflt);
  cr_expect_gt(t_big, t_dflt);
  run_clear(&dflt);
  run_clear(&zero);
  run_clear(&big);
}

Test(cli, measurement_and_execution_numbers_are_checked)
{
  expect_refused(run("profile", "ops", "--output", "unused.json", "--repetitions", "0", NULL),
                 "--repetitions 0: expected a whole number from 1");
  expect_refused(run("profile", "ops", "--output", "unused.json", "--warmup", "-1", NULL),
                 "--warmup -1: expected a whole number from 0");
  expect_refused(run("profile", "ops", "--output", "unused.json", "--min-ms", "-2", NULL),
                 "--min-ms -2: expected milliseconds");
  expect_refused(run("profile", "collectives", "--output", "unused.json", "--repetitions", "0",
                     NULL), "--repetitions: expected 1 or more");
  expect_refused(run("exec", "--lr", "0", NULL), "--lr 0: expected a positive number");
  expect_refused(run("exec", "--adam-eps", "-1", NULL), "--adam-eps -1: expected a positive number");
  expect_refused(run("exec", "--tolerance", "nan", NULL), "--tolerance nan: expected");
  cr_expect(!g_file_test("unused.json", G_FILE_TEST_EXISTS));
}

Test(cli, framework_options_are_checked)
{
  expect_refused(run("simulate", SMALL_GPT, "--precision", "fp8", NULL),
                 "--precision fp8: the a100-80gb GPUs of machine dgx-a100:1 have no FP8");
  expect_refused(run("simulate", SMALL_GPT, "--precision", "int4", NULL),
                 "expected mixed-fp16, mixed-bf16, fp32, tf32 or fp8");
  expect_refused(run("simulate", SMALL_GPT, "--attention", "sdpa", NULL),
                 "--attention: unknown 'sdpa'; expected flash, fused, unfused or megatron");
  expect_refused(run("simulate", SMALL_GPT, "--conv-layout", "chwn", NULL),
                 "--conv-layout: unknown 'chwn'");
  expect_refused(run("simulate", "--model", "bert-large", "--param", "head=3", NULL),
                 "head is 3; expected 1 (masked-LM) or 2");
  /* TF32 and fp8 are accepted where the GPUs have them. */
  Run ok = run("simulate", SMALL_GPT, "--precision", "tf32", "--attention", "flash", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
  ok = run("simulate", "--model", "gpt", "--param", "layers=1,hidden=64,heads=4,seq=16,vocab=1000",
           "--machine", "dgx-h100", "--global-batch", "8", "--precision", "fp8", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
}

Test(cli, a_calibration_file_is_checked_and_named)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-cal-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "cal.json", NULL);
  static const struct {
    const char *text, *expect;
  } cases[] = {
    { "{", "cal.json:" },
    { "{\"format\": \"other\"}", "expected a JSON object with \"format\": \"parasol-calibration\"" },
    { "{\"format\": \"parasol-calibration\", \"parameters\": 3}", "cal.json: parameters: expected an object" },
    { "{\"format\": \"parasol-calibration\", \"parameters\": {\"gemm-efficiency\": {\"value\": 1.5}}}",
      "parameters.gemm-efficiency.value: expected a fraction in (0, 1]" },
    { "{\"format\": \"parasol-calibration\", \"parameters\": {\"warp-speed\": {\"value\": 1}}}",
      "parameters.warp-speed: 'warp-speed' is not a parameter" },
    { "{\"format\": \"parasol-calibration\", \"parameters\": {\"attention\": {\"value\": \"fast\"}}}",
      "parameters.attention.value: expected flash, fused, unfused or megatron" },
    { "{\"format\": \"parasol-calibration\", \"parameters\": {\"host-overhead-us\": {}}}",
      "parameters.host-overhead-us: expected an object with a \"value\"" },
  };
  for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
    cr_assert(g_file_set_contents(path, cases[i].text, -1, NULL));
    expect_refused(run("simulate", SMALL_GPT, "--calibration", path, NULL), cases[i].expect);
  }
  expect_refused(run("simulate", SMALL_GPT, "--calibration", "/nonexistent/cal.json", NULL),
                 "/nonexistent/cal.json");
  /* A good file's values stand for the options not given, and an option given wins. */
  cr_assert(g_file_set_contents(path,
                                "{\"format\": \"parasol-calibration\", \"parameters\": "
                                "{\"host-overhead-us\": {\"value\": 1000}}}", -1, NULL));
  Run slow = run("simulate", SMALL_GPT, "--calibration", path, "--json", NULL);
  Run fast = run("simulate", SMALL_GPT, "--calibration", path, "--host-overhead-us", "0", "--json",
                 NULL);
  Run plain = run("simulate", SMALL_GPT, "--json", NULL);
  cr_assert_eq(slow.status, 0, "%s", slow.err);
  cr_assert_eq(fast.status, 0, "%s", fast.err);
  cr_assert_str_eq(fast.out, plain.out, "--host-overhead-us 0 overrides the file");
  cr_assert_str_neq(slow.out, plain.out, "the file's 1 ms a kernel slows the iteration");
  run_clear(&slow);
  run_clear(&fast);
  run_clear(&plain);
  g_unlink(path);
  g_rmdir(dir);
}

Test(cli, unknown_names)
{
  expect_refused(run("simulate", "--model", "no-such-model", NULL), "unknown model 'no-such-model'");
  expect_refused(run("simulate", "--machine", "no-such-machine", NULL), "no-such-machine");
  expect_refused(run("simulate", SMALL_GPT, "--schedule", "zigzag", NULL),
                 "--schedule: unknown 'zigzag'");
}

Test(cli, a_malformed_strategy_file_is_named_with_its_place)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "broken.json", NULL);
  cr_assert(g_file_set_contents(path, "{\"format\": \"parasol-strategy\",\n \"ops\": [1 2]}", -1,
                                NULL));
  g_autofree char *where = g_strdup_printf("%s:2:", path);
  expect_refused(run("simulate", SMALL_GPT, "--strategy", path, NULL), where);
  /* Said once, not "path: path:2:...". */
  Run r = run("simulate", SMALL_GPT, "--strategy", path, NULL);
  cr_expect_null(strstr(r.err + strlen("parasol: ") + strlen(path), path), "%s", r.err);
  run_clear(&r);
  g_unlink(path);
  g_rmdir(dir);
}

Test(cli, a_vocabulary_tp_does_not_divide_gets_megatrons_padding_as_a_hint)
{
  /* 1,001 is not even; Megatron pads to a multiple of 128 x 2 = 256: 1,024. */
  expect_refused(run("simulate", SMALL_GPT, "--tp", "2", NULL),
                 "Megatron pads the vocabulary to a multiple of 128 x tp: --param vocab=1024");
  Run ok = run("simulate", "--model", "gpt", "--param", "layers=1,hidden=64,heads=4,seq=16,vocab=1024",
               "--machine", "dgx-a100:1", "--global-batch", "8", "--tp", "2", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
}

/* Expert parallelism on a mixture of 4 experts over 8 GPUs (dp 8): --ep 0, an ep that
 * does not divide dp or the experts, and one that does; --etp and the routing options. */
Test(cli, the_expert_parallel_degree_is_checked)
{
#define SMALL_MOE "--model", "moe", "--param", "layers=1,hidden=64,heads=4,kv_heads=2,experts=4," \
                  "expert_ffn=32,seq=16,vocab=128", "--machine", "dgx-a100:1", "--global-batch", "8"
  expect_refused(run("simulate", "--ep", "0", NULL), "--ep 0: expected a whole number from 1");
  expect_refused(run("simulate", SMALL_MOE, "--ep", "3", NULL),
                 "ep 3: the expert-parallel degree must divide dp 8");
  expect_refused(run("simulate", SMALL_MOE, "--ep", "8", NULL),
                 "ep 8 does not divide the 4 experts of op 'layer0.moe'");
  Run ok = run("simulate", SMALL_MOE, "--ep", "4", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
  /* The experts' own tensor-parallel degree: groups of ep x etp GPUs holding whole
   * tensor-parallel groups. */
  expect_refused(run("simulate", SMALL_MOE, "--tp", "2", "--ep", "2", "--etp", "3", NULL),
                 "ep 2 x etp 3 = 6: an expert group must be a multiple of tp 2 that divides "
                 "dp 4 x tp 2");
  Run etp = run("simulate", SMALL_MOE, "--tp", "2", "--ep", "4", "--etp", "1",
                "--sequence-parallel", NULL);
  cr_expect_eq(etp.status, 0, "%s", etp.err);
  run_clear(&etp);
  /* Routing: a capacity factor of 0 or more, an imbalance of 1 or more, on a mixture. */
  expect_refused(run("simulate", SMALL_MOE, "--moe-imbalance", "0.5", NULL),
                 "--moe-imbalance 0.5: expected a number of at least 1");
  expect_refused(run("simulate", SMALL_MOE, "--moe-capacity-factor", "-1", NULL),
                 "--moe-capacity-factor -1: expected a number of at least 0");
  expect_refused(run("simulate", SMALL_GPT, "--moe-imbalance", "1.2", NULL),
                 "model 'gpt' has no mixture-of-experts layer to route");
#undef SMALL_MOE
}

/* --zero2 shards the gradients as well as --zero1's optimizer states: on 8 data-parallel
 * GPUs the fullest one holds less, and the iteration is as long. */
Test(cli, zero2_holds_less_than_zero1)
{
  Run z1 = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--zero1", "--json", NULL);
  Run z2 = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--zero2", "--json", NULL);
  cr_assert_eq(z1.status, 0, "%s", z1.err);
  cr_assert_eq(z2.status, 0, "%s", z2.err);
  /* The first device's peak, in the report's list of devices. */
  const char *d1 = strstr(z1.out, "\"devices\""), *d2 = strstr(z2.out, "\"devices\"");
  cr_assert(d1 && d2);
  cr_expect_lt(json_number(d2, "peak_memory_bytes"), json_number(d1, "peak_memory_bytes"));
  cr_expect_eq(iteration_time(z2.out), iteration_time(z1.out));
  run_clear(&z1);
  run_clear(&z2);
}

/* --offload-optimizer moves the optimizer's states to the host: the fullest GPU holds less
 * (ZeRO-1 over 8 GPUs: 1.5 of its 5.5 bytes a parameter), the update crosses PCIe and
 * runs on the host, so the iteration takes longer; the saved strategy records it, and a
 * fraction outside 0..1 is refused. */
Test(cli, offload_optimizer_holds_less_and_takes_longer)
{
  Run z1 = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--zero1", "--json", NULL);
  Run off = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--zero1", "--offload-optimizer",
                "1", "--save-strategy", "offload-strategy.json", "--json", NULL);
  cr_assert_eq(z1.status, 0, "%s", z1.err);
  cr_assert_eq(off.status, 0, "%s", off.err);
  const char *d1 = strstr(z1.out, "\"devices\""), *d2 = strstr(off.out, "\"devices\"");
  cr_assert(d1 && d2);
  cr_expect_lt(json_number(d2, "peak_memory_bytes"), json_number(d1, "peak_memory_bytes"));
  cr_expect_gt(iteration_time(off.out), iteration_time(z1.out));
  g_autofree char *saved = NULL;
  cr_assert(g_file_get_contents("offload-strategy.json", &saved, NULL, NULL));
  cr_expect(strstr(saved, "\"offload_optimizer\": true"), "%s", saved);
  g_unlink("offload-strategy.json");
  run_clear(&z1);
  run_clear(&off);
  expect_refused(run("simulate", SMALL_GPT, "--offload-optimizer", "1.5", NULL),
                 "--offload-optimizer 1.5: expected a fraction from 0 to 1");
  expect_refused(run("simulate", SMALL_GPT, "--offload-overlap", NULL),
                 "--offload-overlap: needs --offload-optimizer with a fraction above 0");
}

Test(cli, the_data_parallel_degree_defaults_to_the_gpus_left)
{
  /* As Megatron derives it: 8 GPUs, tp 2, so dp 4, the same plan as --dp 4 (it once
   * defaulted to 1, leaving six GPUs idle). */
  Run derived = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--tp", "2", "--json", NULL);
  Run given = run("simulate", SMALL_GPT, "--param", "vocab=1024", "--tp", "2", "--dp", "4", "--json",
                  NULL);
  cr_assert_eq(derived.status, 0, "%s", derived.err);
  cr_assert_eq(given.status, 0, "%s", given.err);
  cr_expect_eq(iteration_time(derived.out), iteration_time(given.out));
  run_clear(&derived);
  run_clear(&given);
  expect_refused(run("simulate", SMALL_GPT, "--tp", "3", NULL),
                 "tp 3 x pp 1 = 3 GPUs do not divide the machine's 8; give --dp");
}

Test(cli, the_default_plan_takes_the_largest_micro_batch_that_fits)
{
  /* 128 sequences of 2,048 tokens a GPU in one micro-batch need about 100 GiB of the 80;
   * in two of 64 they need about 50.  Without a word on the plan, that is what is
   * simulated, and said; with the plan in flags, it is simulated as given. */
#define BIG_BATCH "--model", "gpt", "--param", \
                  "layers=2,hidden=1024,heads=16,seq=2048,vocab=1024,batch=1024", \
                  "--machine", "dgx-a100:1", "--json"
  Run dflt = run("simulate", BIG_BATCH, NULL);
  Run by_hand = run("simulate", BIG_BATCH, "--microbatch-size", "64", NULL);
  Run as_given = run("simulate", BIG_BATCH, "--dp", "8", NULL);
  cr_assert_eq(dflt.status, 0, "%s", dflt.err);
  cr_expect(strstr(dflt.err, "micro-batches of 64 (2 a step) fit"), "%s", dflt.err);
  cr_expect(strstr(dflt.out, "\"fits\" : true"), "%s", dflt.out);
  cr_expect_eq(iteration_time(dflt.out), iteration_time(by_hand.out));
  cr_expect(strstr(as_given.out, "\"fits\" : false"), "%s", as_given.out);
  /* A plan that does not fit: its report, and exit status 3 (docs/inputs.md). */
  cr_expect_eq(as_given.status, 3, "exit status %d: %s", as_given.status, as_given.err);
  cr_expect_eq(by_hand.status, 0, "%s", by_hand.err);
  run_clear(&dflt);
  run_clear(&by_hand);
  run_clear(&as_given);
}

Test(cli, a_refused_plan_leaves_the_output_file_alone)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *path = g_build_filename(dir, "kept.json", NULL);
  cr_assert(g_file_set_contents(path, "{\"kept\": true}\n", -1, NULL));
  expect_refused(run("simulate", SMALL_GPT, "--tp", "3", "--dp", "1", "--save-strategy", path,
                     NULL), "tp 3 does not divide");
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(path, &text, NULL, NULL));
  cr_expect_str_eq(text, "{\"kept\": true}\n");
  g_unlink(path);
  g_rmdir(dir);
}

Test(cli, a_checked_run_with_adam_matches_one_device)
{
  /* The default run (a tiny GPT data parallel over 8 GPUs, Adam): with Adam's epsilon at
   * 1e-8 the key bias, whose exact gradient is zero, moves by the learning rate in the
   * direction of its rounding noise, which differs from one device's, and --check said
   * MISMATCH for a correct plan.  The check now runs Adam at 1e-3 and says so; an
   * epsilon given is used as given. */
  Run dflt = run("exec", "--check", NULL);
  cr_expect_eq(dflt.status, 0, "%s%s", dflt.out, dflt.err);
  cr_expect(strstr(dflt.out, "Adam's epsilon 0.001 for the check"), "%s", dflt.out);
  cr_expect(strstr(dflt.out, "match (tolerance"), "%s", dflt.out);
  Run given = run("exec", "--check", "--adam-eps", "1e-8", NULL);
  cr_expect_null(strstr(given.out, "Adam's epsilon"), "%s", given.out);
  cr_expect(strstr(given.out, "MISMATCH"), "%s", given.out);
  cr_expect_eq(given.status, 1);
  Run sgd = run("exec", "--check", "--optimizer", "sgd", NULL);
  cr_expect_eq(sgd.status, 0, "%s%s", sgd.out, sgd.err);
  cr_expect_null(strstr(sgd.out, "Adam's epsilon"), "%s", sgd.out);
  run_clear(&dflt);
  run_clear(&given);
  run_clear(&sgd);
}

Test(cli, a_search_slower_than_the_expert_plan_gives_way_to_it)
{
  /* Three evaluations leave beam far from the expert plan (GPT-3 1.3B on two A100s, whose
   * data-parallel plan does not fit): the expert plan, which the command simulates for
   * its yardstick anyway, is written and reported instead, and the output keeps the
   * search's own figures; --own keeps the search's plan. */
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *kept = g_build_filename(dir, "kept.json", NULL);
  g_autofree char *own = g_build_filename(dir, "own.json", NULL);
#define SLOW_SEARCH "search", "--model", "gpt3-1.3b", "--machine", "dgx-a100:2", "--algo", \
                    "beam", "--budget", "3evals", "--threads", "1", "--json"
  Run a = run(SLOW_SEARCH, "--out", kept, NULL);
  Run b = run(SLOW_SEARCH, "--out", own, "--own", NULL);
  /* The yardsticks do not heed --allow: a search kept from some kinds of parallelism
   * keeps its own plan. */
  Run c = run(SLOW_SEARCH, "--allow", "data,parameter,reduction", NULL);
#undef SLOW_SEARCH
  cr_assert_eq(c.status, 0, "%s", c.err);
  cr_expect(strstr(c.out, "\"kept\" : \"search\""), "%s", c.out);
  run_clear(&c);
  cr_assert_eq(a.status, 0, "%s", a.err);
  cr_assert_eq(b.status, 0, "%s", b.err);
  cr_expect(strstr(a.out, "\"kept\" : \"expert\""), "%s", a.out);
  cr_expect(strstr(a.err, "the expert plan is faster than the search's best"), "%s", a.err);
  cr_expect(strstr(b.out, "\"kept\" : \"search\""), "%s", b.out);
  double expert = json_number(a.out, "expert_s");
  double search = json_number(a.out, "search_iteration_time_s");
  cr_expect_eq(iteration_time(a.out), expert);
  cr_expect_gt(search, expert * 1.05, "search %g s, expert %g s", search, expert);
  cr_expect_eq(json_number(b.out, "search_iteration_time_s"), search);
  cr_expect_eq(iteration_time(b.out), search);
  cr_expect_eq(json_number(b.out, "expert_s"), expert);
  /* Each file is the plan its output reports. */
  const char *files[] = { kept, own };
  const double times[] = { expert, search };
  for (int i = 0; i < 2; i++) {
    Run s = run("simulate", "--model", "gpt3-1.3b", "--machine", "dgx-a100:2", "--strategy",
                files[i], "--json", NULL);
    cr_assert_eq(s.status, 0, "%s", s.err);
    double t = iteration_time(s.out);
    cr_expect_float_eq(t, times[i], 1e-9 * times[i], "%s: %g s, reported %g s", files[i], t,
                       times[i]);
    run_clear(&s);
  }
  run_clear(&a);
  run_clear(&b);
  g_unlink(kept);
  g_unlink(own);
  g_rmdir(dir);
}

Test(cli, a_searched_plan_simulates_to_the_time_the_search_reported, .timeout = 120)
{
  /* Per-operator plans found by MCMC and beam search on machines whose GPUs share links
   * (NVLink meshes, PCIe switches, NICs), written with --out and simulated again: the
   * program predicts the very time the search reported, folded or not, and at the other
   * levels of detail folding changes nothing either.  The plans of the last two fold
   * (their replicas are alike), the others do not. */
  const char *cases[][3] = {
    { "alexnet", "dgx1-v100:2", "mcmc" },     { "transformer", "pcie-4gpu:2", "beam" },
    { "rnnlm", "flexflow-p100", "mcmc" },      { "candle-uno", "dgx-a100:2", "mcmc" },
    { "inception-v3", "dgx1-v100:2", "beam" }, { "resnet-50", "dgx1-v100:2", "mcmc" },
    { "bert-base", "pcie-4gpu:2", "mcmc" },
  };
  int folded = 0;
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename(dir, "plan.json", NULL);
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    const char *model = cases[i][0], *machine = cases[i][1];
    Run s = run("search", "--model", model, "--machine", machine, "--algo", cases[i][2],
                "--budget", "200evals", "--threads", "1", "--own", "--json", "--quiet", "--out",
                plan, NULL);
    cr_assert_eq(s.status, 0, "%s on %s: %s", model, machine, s.err);
    double found = json_number(s.out, "search_iteration_time_s");
    run_clear(&s);
    const char *details[] = { "flows", "collective", "steps" };
    for (int d = 0; d < 3; d++) {
      double t[2];
      for (int unfolded = 0; unfolded < 2; unfolded++) {
        Run r = run("simulate", "--model", model, "--machine", machine, "--strategy", plan,
                    "--detail", details[d], "--json", unfolded ? "--no-fold" : NULL, NULL);
        cr_assert_eq(r.status, 0, "%s on %s: %s", model, machine, r.err);
        t[unfolded] = iteration_time(r.out);
        folded += !unfolded && d == 0 && !strstr(r.out, "\"folding\" : \"none\"");
        run_clear(&r);
      }
      cr_expect_eq(t[0], t[1], "%s on %s, %s: folded %.17g s, unfolded %.17g s", model,
                   machine, details[d], t[0], t[1]);
      if (d == 0)
        cr_expect_eq(t[0], found, "%s on %s: simulated %.17g s, the search reported %.17g s",
                     model, machine, t[0], found);
    }
  }
  cr_expect_eq(folded, 2, "%d of the plans folded", folded);
  g_unlink(plan);
  g_rmdir(dir);
}

Test(cli, model_show_saves_the_graph_a_strategy_files_rewrites_make)
{
  /* Merging three 1x1 convolutions of an Inception module into one convolution and a
   * split: one operator fewer, the same parameters and FLOPs; the saved graph file reads
   * back as the same graph.  A file that is missing, or a rewrite that does not apply, is
   * refused with its name. */
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename(dir, "plan.json", NULL);
  g_autofree char *bad = g_build_filename(dir, "bad.json", NULL);
  g_autofree char *graph = g_build_filename(dir, "graph.json", NULL);
  g_autofree char *missing = g_build_filename(dir, "missing.json", NULL);
  cr_assert(g_file_set_contents(plan,
      "{\"format\": \"parasol-strategy\", \"version\": 1, \"rewrites\": [\"merge-convs:"
      "Mixed_6c.branch1x1.conv,Mixed_6c.branch7x7_1.conv,Mixed_6c.branch7x7dbl_1.conv\"]}",
      -1, NULL));
  cr_assert(g_file_set_contents(bad,
      "{\"format\": \"parasol-strategy\", \"version\": 1, \"rewrites\": "
      "[\"merge-convs:nosuch,op\"]}", -1, NULL));
  Run a = run("model", "show", "inception-v3", "--json", NULL);
  Run b = run("model", "show", "inception-v3", "--rewrites", plan, "--save", graph, "--json",
              NULL);
  cr_assert_eq(a.status, 0, "%s", a.err);
  cr_assert_eq(b.status, 0, "%s", b.err);
  Run c = run("model", "show", graph, "--json", NULL);
  cr_assert_eq(c.status, 0, "%s", c.err);
  cr_expect_eq(json_number(b.out, "ops"), json_number(a.out, "ops") - 1);
  cr_expect_eq(json_number(c.out, "ops"), json_number(b.out, "ops"));
  const char *same[] = { "parameters", "forward_flops", "backward_flops" };
  for (size_t i = 0; i < G_N_ELEMENTS(same); i++) {
    cr_expect_eq(json_number(b.out, same[i]), json_number(a.out, same[i]), "%s", same[i]);
    cr_expect_eq(json_number(c.out, same[i]), json_number(a.out, same[i]), "%s", same[i]);
  }
  run_clear(&a);
  run_clear(&b);
  run_clear(&c);
  expect_refused(run("model", "show", "inception-v3", "--rewrites", missing, NULL),
                 "missing.json");
  expect_refused(run("model", "show", "inception-v3", "--rewrites", bad, NULL),
                 "'merge-convs:nosuch,op': model 'inception-v3' has no operator 'nosuch'");
  g_unlink(plan);
  g_unlink(bad);
  g_unlink(graph);
  g_rmdir(dir);
}

Test(cli, an_interleaved_plan_reports_its_stages_and_chunks)
{
  /* 2 pipeline stages of 2 model chunks each: 4 chunks of 2 layers, on 2 device groups.
   * The report names both (it once printed "4 stages"). */
#define FOUR_LAYERS "--model", "gpt", "--param", "layers=8,hidden=64,heads=4,seq=16,vocab=1024", \
                    "--machine", "dgx-a100:1", "--global-batch", "16", "--pp", "2", "--dp", "4", \
                    "--microbatches", "4"
  Run text = run("simulate", FOUR_LAYERS, "--schedule", "interleaved:2", NULL);
  cr_assert_eq(text.status, 0, "%s", text.err);
  cr_expect(strstr(text.out, "2 stages of 2 model chunks each, 4 micro-batches, interleaved"),
            "%s", text.out);
  Run json = run("simulate", FOUR_LAYERS, "--schedule", "interleaved:2", "--json", NULL);
  cr_assert_eq(json.status, 0, "%s", json.err);
  cr_expect_eq(json_number(json.out, "stages"), 2);
  cr_expect_eq(json_number(json.out, "chunks_per_stage"), 2);
  /* 1F1B: the stages alone. */
  Run plain = run("simulate", FOUR_LAYERS, "--json", NULL);
  cr_assert_eq(plain.status, 0, "%s", plain.err);
  cr_expect_eq(json_number(plain.out, "stages"), 2);
  cr_expect_eq(json_number(plain.out, "chunks_per_stage"), 1);
  run_clear(&text);
  run_clear(&json);
  run_clear(&plain);
#undef FOUR_LAYERS
}

/* exec --dump writes a folder that --load-weights reads back; a missing or misshapen
 * weight file is refused, named, with the shape expected. */
Test(cli, exec_load_weights_reads_a_dump_and_names_a_bad_file)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-dump-XXXXXX", NULL);
  cr_assert_not_null(dir);
  g_autofree char *dump = g_build_filename(dir, "dump", NULL);
  Run r = run("exec", "--steps", "1", "--dump", dump, NULL);
  cr_assert_eq(r.status, 0, "stderr: %s", r.err);
  run_clear(&r);
  g_autofree char *manifest = g_build_filename(dump, "manifest.json", NULL);
  cr_assert(g_file_test(manifest, G_FILE_TEST_EXISTS));
  r = run("exec", "--steps", "1", "--load-weights", dump, NULL);
  cr_expect_eq(r.status, 0, "stderr: %s", r.err);
  run_clear(&r);
  /* The position embedding's table (16 x 64) where the token embedding's (128 x 64) goes. */
  g_autofree char *embed = g_build_filename(dump, "init", "embed.0.npy", NULL);
  g_autofree char *pos = g_build_filename(dump, "init", "embed.pos.0.npy", NULL);
  cr_assert_eq(g_rename(pos, embed), 0);
  expect_refused(run("exec", "--steps", "1", "--load-weights", dump, NULL),
                 "embed.0.npy: expected shape (128, 64)");
  g_autofree char *missing = g_build_filename(dir, "none", NULL);
  expect_refused(run("exec", "--steps", "1", "--load-weights", missing, NULL),
                 "init/embed.0.npy: no such file");
  g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* A budget in seconds bounds the whole command, whatever the algorithm: the expert plans
 * of megatron-1.7b on 32 A100 (72 of them) and the searches past them take far longer than
 * the 2 seconds given, and the command still returns within the budget plus 5% and a
 * generous allowance for starting the process; what did not fit is reported as not
 * done. */
Test(cli, a_budget_in_seconds_bounds_the_whole_command, .timeout = 240)
{
  const double budget = 2.0, slack = 1.5;
  g_autofree char *names = NULL;
  {
    Run l = run("search", "--list", NULL);
    cr_assert_eq(l.status, 0, "%s", l.err);
    names = g_steal_pointer(&l.out);
    run_clear(&l);
  }
  int checked = 0;
  g_auto(GStrv) lines = g_strsplit(names, "\n", -1);
  for (char **it = lines; *it; it++) {
    if (!g_ascii_isalpha(**it))
      continue;
    g_autofree char *algo = g_strndup(*it, strcspn(*it, " "));
    if (!strcmp(algo, "exhaustive"))
      continue; /* it refuses problems this large at once */
    gint64 t0 = g_get_monotonic_time();
    Run r = run("search", "--model", "megatron-1.7b", "--machine", "dgx-a100:4", "--algo", algo,
                "--budget", "2s", "--json", "--quiet", NULL);
    double wall = (double)(g_get_monotonic_time() - t0) / 1e6;
    cr_expect(r.status == 0 || r.status == 1, "%s: exit status %d: %s", algo, r.status, r.err);
    cr_expect_lt(wall, budget * 1.05 + slack, "%s: %.2f s for a budget of %.0f s", algo, wall,
                 budget);
    if (r.status == 0) {
      /* The sweep over the expert plans was cut short, and says so. */
      double plans = json_number(r.out, "expert_plans");
      double simulated = json_number(r.out, "expert_plans_simulated");
      cr_expect(plans == 0 || simulated == plans || strstr(r.err, "expert plans: "),
                "%s: %s", algo, r.err);
      cr_expect(strstr(r.out, "\"plan\" : {"), "%s", r.out);
    }
    checked++;
    run_clear(&r);
  }
  cr_expect_geq(checked, 8, "%d algorithms", checked);
}

/* Starts parasol with @argv (after the program name) writing its output to @out and
 * @err. */
static pid_t spawn(const char *out, const char *err, const char *const *args)
{
  const char *bin = g_getenv("PARASOL_BIN");
  cr_assert_not_null(bin, "PARASOL_BIN is not set");
  g_autoptr(GPtrArray) argv = g_ptr_array_new();
  g_ptr_array_add(argv, (char *)bin);
  for (const char *const *a = args; *a; a++)
    g_ptr_array_add(argv, (char *)*a);
  g_ptr_array_add(argv, NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0)
      _exit(127);
    dup2(o, STDOUT_FILENO);
    dup2(e, STDERR_FILENO);
    execv(bin, (char **)argv->pdata);
    _exit(127);
  }
  return pid;
}

/* The lines of @path (0 if it cannot be read). */
static int count_lines(const char *path)
{
  g_autofree char *text = NULL;
  if (!g_file_get_contents(path, &text, NULL, NULL))
    return 0;
  int n = 0;
  for (const char *c = text; *c; c++)
    n += *c == '\n';
  return n;
}

/* SIGTERM, like Ctrl-C, stops a search with a budget of ten minutes once it has found a
 * plan: the command writes that plan, which simulates to the time it reports, closes the
 * log with a last row, and exits with status 0; a second signal during its wrap-up
 * changes nothing. */
static void a_signal_keeps_the_plan(int first, int second)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename(dir, "plan.json", NULL);
  g_autofree char *log = g_build_filename(dir, "log.csv", NULL);
  g_autofree char *out = g_build_filename(dir, "out.json", NULL);
  g_autofree char *err = g_build_filename(dir, "err.txt", NULL);
  const char *args[] = { "search", "--model", "megatron-1.7b", "--machine", "dgx-a100:4",
                         "--algo", "mcmc", "--budget", "10m", "--json", "--quiet", "--out",
                         plan, "--log", log, NULL };
  pid_t pid = spawn(out, err, args);
  /* Until the log has its first improvement (the header, then a row). */
  for (int i = 0; i < 1200 && count_lines(log) < 2; i++)
    g_usleep(50000);
  cr_assert_geq(count_lines(log), 2, "no improvement logged in a minute");
  int rows = count_lines(log);
  gint64 t0 = g_get_monotonic_time();
  kill(pid, first);
  if (second) {
    g_usleep(20000);
    kill(pid, second);
  }
  int wait = 0;
  cr_assert_eq(waitpid(pid, &wait, 0), pid);
  double wall = (double)(g_get_monotonic_time() - t0) / 1e6;
  g_autofree char *o = NULL, *e = NULL;
  g_file_get_contents(out, &o, NULL, NULL);
  g_file_get_contents(err, &e, NULL, NULL);
  cr_assert(WIFEXITED(wait), "killed by signal %d; stderr: %s", WTERMSIG(wait), e);
  cr_expect_eq(WEXITSTATUS(wait), 0, "exit status %d: %s", WEXITSTATUS(wait), e);
  cr_expect_lt(wall, 60, "%.1f s after the signal", wall);
  cr_expect(strstr(e, first == SIGTERM ? "terminated (SIGTERM)" : "interrupted"), "%s", e);
  cr_expect(strstr(o, first == SIGTERM ? "\"signal\" : \"SIGTERM\"" : "\"signal\" : \"SIGINT\""),
            "%s", o);
  /* The log's last row, written as the search stopped. */
  cr_expect_geq(count_lines(log), rows + 1);
  /* The plan written is the one reported. */
  Run s = run("simulate", "--model", "megatron-1.7b", "--machine", "dgx-a100:4", "--strategy",
              plan, "--json", NULL);
  cr_assert_eq(s.status, 0, "%s", s.err);
  double t = iteration_time(s.out), reported = iteration_time(o);
  cr_expect_float_eq(t, reported, 1e-9 * reported, "simulated %.17g s, reported %.17g s", t,
                     reported);
  run_clear(&s);
  const char *files[] = { plan, log, out, err };
  for (size_t i = 0; i < G_N_ELEMENTS(files); i++)
    g_unlink(files[i]);
  g_rmdir(dir);
}

Test(cli, sigterm_stops_a_search_and_keeps_its_plan, .timeout = 180)
{
  a_signal_keeps_the_plan(SIGTERM, 0);
}

Test(cli, a_second_signal_during_the_wrap_up_still_leaves_the_plan, .timeout = 180)
{
  a_signal_keeps_the_plan(SIGINT, SIGTERM);
}

Test(cli, a_plan_found_with_graph_rewrites_runs_in_simulate_and_exec)
{
  /* The substitution search merges q, k and v into one linear (a data-parallel inner
   * search on one GPU of 8 finds it faster) and records the rewrite in the plan, whose
   * operators name the rewritten graph's: simulate and exec replay the rewrite before
   * they read the plan (search_strategy_load()).  exec once read it against the model as
   * given and refused the merged operator. */
  static const char graph[] =
    "{\"format\": \"parasol-graph\", \"version\": 1, \"name\": \"rewritable\", \"ops\": [\n"
    " {\"name\": \"x\", \"type\": \"input\", \"inputs\": [], \"attrs\": {\"shape\": [16, 32], \"dtype\": \"fp32\"}},\n"
    " {\"name\": \"fc1\", \"type\": \"linear\", \"inputs\": [\"x\"], \"attrs\": {\"out_features\": 64, \"bias\": true}},\n"
    " {\"name\": \"relu1\", \"type\": \"unary\", \"inputs\": [\"fc1\"], \"attrs\": {\"kind\": \"relu\"}},\n"
    " {\"name\": \"q\", \"type\": \"linear\", \"inputs\": [\"relu1\"], \"attrs\": {\"out_features\": 32, \"bias\": false}},\n"
    " {\"name\": \"k\", \"type\": \"linear\", \"inputs\": [\"relu1\"], \"attrs\": {\"out_features\": 32, \"bias\": false}},\n"
    " {\"name\": \"v\", \"type\": \"linear\", \"inputs\": [\"relu1\"], \"attrs\": {\"out_features\": 32, \"bias\": false}},\n"
    " {\"name\": \"qk\", \"type\": \"binary\", \"inputs\": [\"q\", \"k\"], \"attrs\": {\"kind\": \"mul\"}},\n"
    " {\"name\": \"qkv\", \"type\": \"binary\", \"inputs\": [\"qk\", \"v\"], \"attrs\": {\"kind\": \"add\"}},\n"
    " {\"name\": \"labels\", \"type\": \"input\", \"inputs\": [], \"attrs\": {\"shape\": [16], \"dtype\": \"int32\"}},\n"
    " {\"name\": \"loss\", \"type\": \"cross_entropy\", \"inputs\": [\"qkv\", \"labels\"]}\n"
    "]}\n";
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *model = g_build_filename(dir, "rewritable.json", NULL);
  g_autofree char *plan = g_build_filename(dir, "plan.json", NULL);
  cr_assert(g_file_set_contents(model, graph, -1, NULL));
  Run s = run("search", "--model", model, "--machine", "dgx-a100:1", "--algo", "subst",
              "--opt", "inner=data-parallel", "--opt", "graphs=6", "--opt", "alpha=1.5",
              "--budget", "300evals", "--threads", "1", "--own", "--quiet", "--out", plan, NULL);
  cr_assert_eq(s.status, 0, "%s%s", s.out, s.err);
  cr_assert(strstr(s.out, "rewrites            merge-linears:q,k,v"), "%s", s.out);
  Run sim = run("simulate", "--model", model, "--machine", "dgx-a100:1", "--strategy", plan,
                NULL);
  cr_expect_eq(sim.status, 0, "%s%s", sim.out, sim.err);
  Run ex = run("exec", "--model", model, "--machine", "dgx-a100:1", "--strategy", plan,
               "--steps", "2", "--check", NULL);
  cr_expect_eq(ex.status, 0, "%s%s", ex.out, ex.err);
  cr_expect(strstr(ex.out, "match (tolerance"), "%s", ex.out);
  /* The model as given has no merged operator: read without the rewrite, the plan is
   * refused by name. */
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(plan, &text, NULL, NULL));
  g_auto(GStrv) parts = g_strsplit(text, "\"merge-linears:q,k,v\"", -1);
  cr_assert_eq(g_strv_length(parts), 2, "%s", text);
  g_autofree char *plain = g_strjoinv("", parts);
  cr_assert(g_file_set_contents(plan, plain, -1, NULL));
  expect_refused(run("exec", "--model", model, "--machine", "dgx-a100:1", "--strategy", plan,
                     NULL), "ops.q+k+v: no such operator in model 'rewritable'");
  /* A rewrite this parasol does not know is named with the file. */
  g_autofree char *unknown = g_strjoinv("\"no-such\"", parts);
  cr_assert(g_file_set_contents(plan, unknown, -1, NULL));
  g_autofree char *where = g_strdup_printf("%s:rewrites: rewrite 'no-such': expected KIND:OPERATORS", plan);
  expect_refused(run("simulate", "--model", model, "--machine", "dgx-a100:1", "--strategy",
                     plan, NULL), where);
  run_clear(&s);
  run_clear(&sim);
  run_clear(&ex);
  g_unlink(plan);
  g_unlink(model);
  g_rmdir(dir);
}

Test(cli, generated_substitutions_are_verified_listed_and_replayed, .timeout = 300)
{
  /* The set: its size, verified and rejected counts and build time on one line. */
  Run set = run("model", "substitutions", NULL);
  cr_assert_eq(set.status, 0, "%s%s", set.out, set.err);
  unsigned total = 0, ops = 0, verified = 0, rejected = 0;
  cr_assert_eq(sscanf(set.out, "substitution set: %u rules generated over patterns of up to %u "
                               "operators%*[^,], %u verified, %u rejected",
                      &total, &ops, &verified, &rejected), 4, "%s", set.out);
  cr_assert(verified > 0 && rejected > 0 && verified + rejected == total, "%s", set.out);
  /* Unity's MLP: its towers' last layers, added, become one linear (a rewrite of the
   * generated set); the plan that carries it replays in simulate, exec and validate. */
  static const char *const params = "batch=8,layers=2,hidden=32,input=16,classes=16";
  Run show = run("model", "show", "mlp", "--param", params, "--substitutions", NULL);
  cr_assert_eq(show.status, 0, "%s", show.err);
  cr_assert(strstr(show.out, "distribute-linear:add1"), "%s", show.out);
  g_autofree char *dir = g_dir_make_tmp("parasol-cli-XXXXXX", NULL);
  g_autofree char *plan = g_build_filename(dir, "plan.json", NULL);
  Run s = run("search", "--model", "mlp", "--param", params, "--machine", "dgx-a100",
              "--algo", "subst", "--opt", "inner=data-parallel", "--opt", "graphs=4",
              "--budget", "300evals", "--threads", "1", "--own", "--quiet", "--out", plan, NULL);
  cr_assert_eq(s.status, 0, "%s%s", s.out, s.err);
  cr_assert(strstr(s.out, "rewrites            distribute-linear:add1"), "%s", s.out);
  Run sim = run("simulate", "--model", "mlp", "--param", params, "--machine", "dgx-a100",
                "--strategy", plan, NULL);
  cr_expect_eq(sim.status, 0, "%s%s", sim.out, sim.err);
  Run ex = run("exec", "--model", "mlp", "--param", params, "--machine", "dgx-a100",
               "--strategy", plan, "--steps", "2", "--check", NULL);
  cr_expect_eq(ex.status, 0, "%s%s", ex.out, ex.err);
  cr_expect(strstr(ex.out, "match (tolerance"), "%s", ex.out);
  g_autofree char *prefix = g_build_filename(dir, "validate", NULL);
  Run val = run("validate", "--model", "mlp", "--param", params, "--machine", "dgx-a100",
                "--strategy", plan, "--out", prefix, NULL);
  cr_expect_eq(val.status, 0, "%s%s", val.out, val.err);
  static const char *const written[] = { ".csv", "-tasks.csv", ".gp", ".png" };
  for (gsize i = 0; i < G_N_ELEMENTS(written); i++) {
    g_autofree char *path = g_strconcat(prefix, written[i], NULL);
    g_unlink(path);
  }
  run_clear(&set);
  run_clear(&show);
  run_clear(&s);
  run_clear(&sim);
  run_clear(&ex);
  run_clear(&val);
  g_unlink(plan);
  g_rmdir(dir);
}

Test(cli, progress_off_a_terminal_is_a_line_every_few_seconds, .timeout = 120)
{
  /* stderr is a pipe here: no line redrawn in place (no carriage return), one line every
   * 5 s, and the closing one; --quiet none. */
  Run r = run("search", "--model", "mlp", "--algo", "mcmc", "--budget", "8s", NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_expect_null(strchr(r.err, '\r'), "%s", r.err);
  int lines = 0;
  for (const char *p = r.err; (p = strstr(p, "mcmc ")); p++)
    if (strstr(p, " evals ") && (p == r.err || p[-1] == '\n'))
      lines++;
  cr_expect(lines >= 1 && lines <= 3, "%d progress lines in: %s", lines, r.err);
  run_clear(&r);
  Run q = run("search", "--model", "mlp", "--algo", "mcmc", "--budget", "8s", "--quiet", NULL);
  cr_expect_null(strstr(q.err, " evals "), "%s", q.err);
  run_clear(&q);
}

Test(cli, compare_prints_json_and_defaults_to_a_short_budget, .timeout = 120)
{
  g_autofree char *dir = g_dir_make_tmp("parasol-cmp-XXXXXX", NULL);
  g_autofree char *prefix = g_build_filename(dir, "c", NULL);
  Run r = run("compare", "--model", "mlp", "--algos", "mcmc,dp", "--seeds", "2", "--budget",
              "25evals", "--json", "--quiet", "--out", prefix, NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  /* Two algorithms of two runs each, every run its 25 evaluations; an algorithm's best is
   * the best of its runs, and its speedup the yardstick's time over it. */
  int runs = 0;
  for (const char *p = r.out; (p = strstr(p, "\"seed\" :")); p++)
    runs++;
  cr_expect_eq(runs, 4, "%s", r.out);
  const char *mcmc = strstr(r.out, "\"algorithm\" : \"mcmc\"");
  cr_assert_not_null(mcmc, "%s", r.out);
  cr_expect_eq(json_number(mcmc, "evals"), 25);
  const char *seed2 = strstr(mcmc, "\"seed\" : 2");
  cr_assert_not_null(seed2);
  double b1 = json_number(mcmc, "best_s"), b2 = json_number(seed2, "best_s");
  const char *summary = strstr(seed2, "]");
  cr_assert_not_null(summary);
  double best = json_number(summary, "best_s");
  cr_expect_eq(best, MIN(b1, b2));
  cr_expect_float_eq(json_number(summary, "speedup_over_data_parallel"),
                     json_number(r.out, "data_parallel_s") / best, 1e-9);
  run_clear(&r);
  /* Without --budget, each run has 5 s (docs/search.md). */
  Run d = run("compare", "--model", "mlp", "--algos", "dp", "--seeds", "1", "--json", "--quiet",
              "--out", prefix, NULL);
  cr_assert_eq(d.status, 0, "%s", d.err);
  cr_expect(strstr(d.out, "\"budget\" : \"5s\"") != NULL, "%s", d.out);
  cr_expect_leq(json_number(d.out, "elapsed_s"), 5.0, "%s", d.out);
  run_clear(&d);
  static const char *const exts[] = { ".csv", ".gp", ".png" };
  for (gsize i = 0; i < G_N_ELEMENTS(exts); i++) {
    g_autofree char *f = g_strconcat(prefix, exts[i], NULL);
    g_unlink(f);
  }
  g_rmdir(dir);
}

Test(cli, a_default_vocabulary_is_padded_as_megatron_pads_it)
{
  /* gpt's 50,257 tokens: padded to a multiple of 128 x 2 = 256 for --tp 2 (50,432), said
   * on stderr, the same plan as that vocabulary given by hand; a vocabulary given is kept
   * (a_vocabulary_tp_does_not_divide_gets_megatrons_padding_as_a_hint). */
#define TINY_GPT_DEFAULT_VOCAB "--model", "gpt", "--param", "layers=1,hidden=64,heads=4,seq=16", \
                               "--machine", "dgx-a100:1", "--global-batch", "8", "--json"
  Run padded = run("simulate", TINY_GPT_DEFAULT_VOCAB, "--tp", "2", NULL);
  Run by_hand = run("simulate", TINY_GPT_DEFAULT_VOCAB, "--tp", "2", "--param", "vocab=50432", NULL);
  cr_assert_eq(padded.status, 0, "%s", padded.err);
  cr_assert_eq(by_hand.status, 0, "%s", by_hand.err);
  cr_expect(strstr(padded.err, "vocabulary of 50257 padded to 50432 (a multiple of 128 x tp 2)"),
            "%s", padded.err);
  cr_expect_null(strstr(by_hand.err, "padded"), "%s", by_hand.err);
  cr_expect_eq(iteration_time(padded.out), iteration_time(by_hand.out));
  run_clear(&padded);
  run_clear(&by_hand);
  /* Without tensor parallelism, to a multiple of 128: 50,304. */
  Run one = run("simulate", TINY_GPT_DEFAULT_VOCAB, NULL);
  cr_expect(strstr(one.err, "padded to 50304 (a multiple of 128 x tp 1)"), "%s", one.err);
  run_clear(&one);
}

Test(cli, the_library_pads_the_vocabulary_as_the_program_does)
{
  /* gpt3-1.3b's 50,257 tokens under tp 2: sim_model_params_pad_vocab() pads them to
   * 50,432, and the model built with that rule under the plan the program builds for
   * --tp 2 --pp 2 on a DGX A100 (dp 2, 8 micro-batches of the 512 samples a replica,
   * 25 MB buckets: cli/sim-options.c) predicts the program's iteration time and GPU 0's
   * peak; the JSON report says the padding. */
  g_autoptr(SimModelParams) params = sim_model_params_new();
  int64_t vocab = 0, padded = 0;
  cr_assert(sim_model_params_pad_vocab(params, "gpt3-1.3b", 2, &vocab, &padded));
  cr_expect_eq(vocab, 50257);
  cr_expect_eq(padded, 50432);
  GError *error = NULL;
  g_autoptr(SimGraph) g = sim_model_load("gpt3-1.3b", params, &error);
  cr_assert_not_null(g, "%s", error ? error->message : "");
  g_autoptr(SimMachine) m = sim_machine_load("dgx-a100", &error);
  cr_assert_not_null(m, "%s", error ? error->message : "");
  SimMegatronOptions o = sim_megatron_options_default();
  o.tp = 2;
  o.pp = 2;
  o.dp = sim_machine_n_devices(m) / (o.tp * o.pp);
  o.microbatches = 4 * o.pp;
  while (o.microbatches > 1 && (sim_graph_batch_size(g) / o.dp) % o.microbatches)
    o.microbatches--;
  o.sync.bucket_bytes = 25000000;
  g_autoptr(SimStrategy) s = sim_strategy_megatron(g, m, &o, &error);
  cr_assert_not_null(s, "%s", error ? error->message : "");
  SimCostModel *cost = sim_cost_model_new_roofline(NULL);
  g_autoptr(SimReport) r = sim_simulate(g, m, s, cost, NULL, &error);
  sim_cost_model_free(cost);
  cr_assert_not_null(r, "%s", error ? error->message : "");

  Run cli = run("simulate", "--model", "gpt3-1.3b", "--machine", "dgx-a100", "--tp", "2",
                "--pp", "2", "--json", NULL);
  cr_assert(cli.status == 0 || cli.status == 3, "%d: %s", cli.status, cli.err);
  cr_expect(strstr(cli.err, "vocabulary of 50257 padded to 50432"), "%s", cli.err);
  cr_expect(fabs(iteration_time(cli.out) - sim_report_iteration_time(r)) <=
            1e-12 * sim_report_iteration_time(r),
            "program %.9g s, library %.9g s", iteration_time(cli.out),
            sim_report_iteration_time(r));
  const char *peaks = strchr(strstr(cli.out, "\"peak_memory_bytes\""), '[');
  cr_assert_not_null(peaks, "%s", cli.out);
  cr_expect_eq(g_ascii_strtoll(peaks + 1, NULL, 10), sim_report_peak_memory(r, 0));
  const char *pad = strstr(cli.out, "\"vocab_padding\"");
  cr_assert_not_null(pad, "no vocab_padding in: %s", cli.out);
  cr_expect_eq(json_number(pad, "model_vocab"), 50257);
  cr_expect_eq(json_number(pad, "padded_vocab"), 50432);
  cr_expect_eq(json_number(pad, "tp"), 2);
  run_clear(&cli);

  /* A vocabulary given is kept, and so is one that is already a multiple, and models
   * without one have none to pad: nothing set, no "vocab_padding" in the report. */
  g_autoptr(SimModelParams) given = sim_model_params_new();
  cr_assert(sim_model_params_parse(given, "vocab=1000", NULL));
  cr_expect_not(sim_model_params_pad_vocab(given, "gpt3-1.3b", 2, NULL, NULL));
  int64_t v = 0;
  cr_expect(sim_model_params_lookup(given, "vocab", &v) && v == 1000);
  g_autoptr(SimModelParams) none = sim_model_params_new();
  cr_expect_not(sim_model_params_pad_vocab(none, "resnet-50", 2, NULL, NULL));
  cr_expect_not(sim_model_params_lookup(none, "vocab", &v));
  Run kept = run("simulate", "--model", "gpt3-1.3b", "--param", "vocab=50432,layers=2",
                 "--machine", "dgx-a100:2", "--tp", "2", "--json", NULL);
  cr_expect_null(strstr(kept.out, "vocab_padding"), "%s", kept.out);
  run_clear(&kept);
}

Test(cli, every_command_has_the_same_default_model_and_machine, .timeout = 120)
{
  /* gpt (GPT-2 small) on a DGX A100 (cli/cli.h); exec and validate run it shrunk. */
  g_autofree char *dir = g_dir_make_tmp("parasol-dflt-XXXXXX", NULL);
  g_autofree char *prefix = g_build_filename(dir, "c", NULL);
  Run sim = run("simulate", "--json", NULL);
  Run search = run("search", "--budget", "5evals", "--json", NULL);
  Run cmp = run("compare", "--algos", "data-parallel", "--seeds", "1", "--budget", "1evals",
                "--json", "--quiet", "--out", prefix, NULL);
  Run *runs[] = { &sim, &search, &cmp };
  for (gsize i = 0; i < G_N_ELEMENTS(runs); i++) {
    cr_expect_eq(runs[i]->status, 0, "%s", runs[i]->err);
    cr_expect(strstr(runs[i]->out, "\"model\" : \"gpt\""), "%s", runs[i]->out);
    cr_expect(strstr(runs[i]->out, "\"machine\" : \"dgx-a100\""), "%s", runs[i]->out);
    run_clear(runs[i]);
  }
  static const char *const exts[] = { ".csv", ".gp", ".png" };
  for (gsize i = 0; i < G_N_ELEMENTS(exts); i++) {
    g_autofree char *f = g_strconcat(prefix, exts[i], NULL);
    g_unlink(f);
  }
  g_rmdir(dir);
}

Test(cli, exec_and_validate_print_json, .timeout = 120)
{
  /* exec: the same steps as the text, each loss to the text's eight decimals; with
   * --check, the check's verdict. */
  Run text = run("exec", "--steps", "2", NULL);
  Run json = run("exec", "--steps", "2", "--json", NULL);
  Run checked = run("exec", "--steps", "1", "--check", "--json", NULL);
  cr_assert_eq(checked.status, 0, "%s", checked.err);
  cr_expect(strstr(checked.out, "\"match\" : true"), "%s", checked.out);
  cr_expect_null(strstr(json.out, "\"check\""), "%s", json.out);
  run_clear(&checked);
  cr_assert_eq(text.status, 0, "%s", text.err);
  cr_assert_eq(json.status, 0, "%s", json.err);
  const char *s2 = strstr(json.out, "\"step\" : 2");
  cr_assert_not_null(s2, "%s", json.out);
  g_autofree char *loss2 = g_strdup_printf("\n2      %14.8f", json_number(s2, "loss"));
  cr_expect(strstr(text.out, loss2), "%s in %s", loss2, text.out);
  run_clear(&text);
  run_clear(&json);
  /* validate: the object holds what its CSV holds. */
  g_autofree char *dir = g_dir_make_tmp("parasol-val-XXXXXX", NULL);
  g_autofree char *prefix = g_build_filename(dir, "v", NULL);
  Run v = run("validate", "--steps", "1", "--json", "--out", prefix, NULL);
  cr_assert_eq(v.status, 0, "%s", v.err);
  g_autofree char *csv_path = g_strconcat(prefix, ".csv", NULL);
  g_autofree char *csv = NULL;
  cr_assert(g_file_get_contents(csv_path, &csv, NULL, NULL));
  const char *row = strstr(csv, "\niteration,");
  cr_assert_not_null(row, "%s", csv);
  double pred = g_ascii_strtod(row + strlen("\niteration,"), NULL);
  cr_expect_float_eq(json_number(v.out, "iteration_predicted_s"), pred, 1e-8 * pred, "%s", v.out);
  run_clear(&v);
  static const char *const files[] = { ".csv", "-tasks.csv", ".gp", ".png" };
  for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
    g_autofree char *f = g_strconcat(prefix, files[i], NULL);
    g_unlink(f);
  }
  g_rmdir(dir);
}

Test(cli, profile_show_prints_json)
{
  /* The shipped H200 database: the object's counts are the text's. */
  const char *data = g_getenv("PARASOL_DATA");
  cr_assert_not_null(data, "PARASOL_DATA is not set");
  g_autofree char *db = g_build_filename(data, "profiles", "h200", NULL);
  Run text = run("profile", "show", db, NULL);
  Run json = run("profile", "show", "--json", db, NULL);
  cr_assert_eq(text.status, 0, "%s", text.err);
  cr_assert_eq(json.status, 0, "%s", json.err);
  g_autofree char *line = g_strdup_printf("ops          %.0f forward, %.0f backward, %.0f update",
                                          json_number(json.out, "ops_forward"),
                                          json_number(json.out, "ops_backward"),
                                          json_number(json.out, "ops_update"));
  cr_expect(strstr(text.out, line), "%s in %s", line, text.out);
  cr_expect(json_number(json.out, "ops_forward") > 0, "%s", json.out);
  run_clear(&text);
  run_clear(&json);
}

Test(cli, every_command_that_simulates_reads_a_calibration_file, .timeout = 120)
{
  /* A missing file is named by each; the shipped vTrain fit runs in each, and changes
   * what simulate predicts. */
  static const char *const commands[] = { "simulate", "search", "compare", "exec", "validate" };
  for (gsize i = 0; i < G_N_ELEMENTS(commands); i++)
    expect_refused(run(commands[i], "--calibration", "/nonexistent/cal.json", NULL),
                   "/nonexistent/cal.json");
  const char *data = g_getenv("PARASOL_DATA");
  cr_assert_not_null(data, "PARASOL_DATA is not set");
  g_autofree char *cal = g_build_filename(data, "calibration", "vtrain-a100.json", NULL);
  g_autofree char *dir = g_dir_make_tmp("parasol-cal-XXXXXX", NULL);
  g_autofree char *prefix = g_build_filename(dir, "c", NULL);
  Run fitted = run("simulate", "--calibration", cal, "--json", NULL);
  Run plain = run("simulate", "--json", NULL);
  Run search = run("search", "--calibration", cal, "--budget", "5evals", "--json", NULL);
  Run cmp = run("compare", "--calibration", cal, "--algos", "data-parallel", "--seeds", "1",
                "--budget", "1evals", "--json", "--quiet", "--out", prefix, NULL);
  Run ex = run("exec", "--calibration", cal, "--steps", "1", "--json", NULL);
  Run *runs[] = { &fitted, &plain, &search, &cmp, &ex };
  for (gsize i = 0; i < G_N_ELEMENTS(runs); i++)
    cr_expect_eq(runs[i]->status, 0, "%s", runs[i]->err);
  cr_expect_neq(iteration_time(fitted.out), iteration_time(plain.out));
  for (gsize i = 0; i < G_N_ELEMENTS(runs); i++)
    run_clear(runs[i]);
  static const char *const exts[] = { ".csv", ".gp", ".png" };
  for (gsize i = 0; i < G_N_ELEMENTS(exts); i++) {
    g_autofree char *f = g_strconcat(prefix, exts[i], NULL);
    g_unlink(f);
  }
  g_rmdir(dir);
}

Test(cli, search_and_compare_show_their_budget_in_plain_help)
{
  static const char *const commands[] = { "search", "compare" };
  for (gsize i = 0; i < G_N_ELEMENTS(commands); i++) {
    Run h = run(commands[i], "--help", NULL);
    cr_expect_eq(h.status, 0, "%s", h.err);
    cr_expect(strstr(h.out, "--budget=B") && strstr(h.out, "--seed=N"), "%s", h.out);
    run_clear(&h);
  }
}

/* --rank-timeout takes seconds from 0 (wait for ever); anything else is refused with the
 * option named and status 2, by search and compare alike.  Alone (no mpirun) a valid one
 * changes nothing. */
Test(cli, rank_timeout_is_checked, .timeout = 60)
{
  static const char *const commands[] = { "search", "compare" };
  static const char *const bad[] = { "-1", "nan", "1e9", "5x" };
  for (gsize i = 0; i < G_N_ELEMENTS(commands); i++)
    for (gsize k = 0; k < G_N_ELEMENTS(bad); k++) {
      Run r = run(commands[i], "--model", "mlp", "--param", "layers=2,hidden=64,batch=8",
                  "--machine", "dgx-a100:2", "--budget", "1evals", "--rank-timeout", bad[k],
                  NULL);
      cr_expect_eq(r.status, 2, "%s --rank-timeout %s: status %d", commands[i], bad[k],
                   r.status);
      cr_expect(strstr(r.err, "--rank-timeout"), "%s", r.err);
      run_clear(&r);
    }
  Run ok = run("search", "--model", "mlp", "--param", "layers=2,hidden=64,batch=8", "--machine",
               "dgx-a100:2", "--budget", "1evals", "--rank-timeout", "0", "-q", NULL);
  cr_expect_eq(ok.status, 0, "%s", ok.err);
  run_clear(&ok);
}

/* --json on the profile commands that print a table or write a database: `ops --list`
 * gives one object per line of its text form, `perf` one object per row of its CSV
 * (numbers as numbers, null where the roofline has no figure), `import-nccl` the count of
 * entries it wrote (nine sizes, 1 MiB to 256 MiB, of one all-reduce), and --json beside
 * --csv is refused. */
Test(cli, profile_commands_print_json, .timeout = 180)
{
  const char *mp = "layers=2,hidden=64,batch=8";
  Run t = run("profile", "ops", "--model", "mlp", "--param", mp, "--machine", "dgx-a100:1",
              "--list", NULL);
  Run j = run("profile", "ops", "--model", "mlp", "--param", mp, "--machine", "dgx-a100:1",
              "--list", "--json", NULL);
  cr_assert_eq(t.status, 0, "%s", t.err);
  cr_assert_eq(j.status, 0, "%s", j.err);
  g_autoptr(JsonNode) n = json_from_string(j.out, NULL);
  cr_assert_not_null(n, "%s", j.out);
  JsonArray *shapes = json_object_get_array_member(json_node_get_object(n), "shapes");
  g_auto(GStrv) lines = g_strsplit(g_strstrip(t.out), "\n", -1);
  cr_assert_eq(json_array_get_length(shapes), g_strv_length(lines));
  cr_assert_gt(json_array_get_length(shapes), 0);
  run_clear(&t);
  run_clear(&j);

  Run p = run("profile", "perf", "--model", "mlp", "--param", mp, "--machine", "dgx-a100:1",
              "--backend", "cpu", "--budget-ms", "1", "--json", NULL);
  cr_assert_eq(p.status, 0, "%s", p.err);
  g_autoptr(JsonNode) pn = json_from_string(p.out, NULL);
  cr_assert_not_null(pn, "%s", p.out);
  JsonArray *rows = json_node_get_array(pn);
  cr_assert_gt(json_array_get_length(rows), 0);
  for (guint i = 0; i < json_array_get_length(rows); i++) {
    JsonObject *r = json_array_get_object_element(rows, i);
    cr_assert_gt(json_object_get_double_member(r, "median_us"), 0);
    cr_assert_not_null(json_object_get_string_member(r, "op"));
    cr_assert(json_object_has_member(r, "roofline_us"));
  }
  run_clear(&p);
  expect_refused(run("profile", "perf", "--model", "mlp", "--param", mp, "--backend", "cpu",
                     "--json", "--csv", "/tmp/parasol-never.csv", NULL),
                 "--json and --csv");

  g_autofree char *dir = g_dir_make_tmp("parasol-nccl-XXXXXX", NULL);
  GString *csv = g_string_new("size(B),count,type,time(ns),busbw(GB/s)\n");
  for (double bytes = 1 << 20; bytes <= 1 << 28; bytes *= 2)
    g_string_append_printf(csv, "%.0f,%.0f,float,%.1f,1.0\n", bytes, bytes / 4, bytes / 100.0);
  g_autofree char *in = g_build_filename(dir, "allreduce_2gpu.csv", NULL);
  cr_assert(g_file_set_contents(in, csv->str, -1, NULL));
  g_string_free(csv, TRUE);
  g_autofree char *db = g_build_filename(dir, "db.json", NULL);
  Run c = run("profile", "import-nccl", dir, "--gpu", "a100-80gb", "--output", db, "--json",
              NULL);
  cr_assert_eq(c.status, 0, "%s", c.err);
  g_autoptr(JsonNode) cn = json_from_string(c.out, NULL);
  cr_assert_not_null(cn, "%s", c.out);
  cr_assert_eq(json_object_get_int_member(json_node_get_object(cn), "collective_entries"), 9);
  cr_assert_str_eq(json_object_get_string_member(json_node_get_object(cn), "output"), db);
  run_clear(&c);
  g_unlink(in);
  g_unlink(db);
  g_rmdir(dir);
}

/* search --json says how the vocabulary was padded, as simulate --json does: GPT-2's 50,257
 * to 50,304 (a multiple of 128 x TP 1) for the default model, and nothing when the
 * vocabulary is given. */
Test(cli, search_json_says_how_the_vocabulary_was_padded, .timeout = 120)
{
  Run r = run("search", "--model", "gpt", "--param", "layers=2", "--budget", "20evals", "--json",
              "-q", NULL);
  cr_assert_eq(r.status, 0, "%s", r.err);
  g_autoptr(JsonNode) n = json_from_string(r.out, NULL);
  cr_assert_not_null(n, "%s", r.out);
  JsonObject *pad = json_object_get_object_member(json_node_get_object(n), "vocab_padding");
  cr_assert_not_null(pad, "%s", r.out);
  cr_assert_eq(json_object_get_int_member(pad, "model_vocab"), 50257);
  cr_assert_eq(json_object_get_int_member(pad, "padded_vocab"), 50304);
  cr_assert_eq(json_object_get_int_member(pad, "tp"), 1);
  run_clear(&r);
  Run k = run("search", "--model", "gpt", "--param", "layers=2,vocab=50257", "--budget",
              "20evals", "--json", "-q", NULL);
  cr_assert_eq(k.status, 0, "%s", k.err);
  g_autoptr(JsonNode) kn = json_from_string(k.out, NULL);
  cr_assert_not_null(kn, "%s", k.out);
  cr_assert_not(json_object_has_member(json_node_get_object(kn), "vocab_padding"));
  run_clear(&k);
}
