/* test-inputs.c — the parasol program on hostile input: files nested too deep, too large,
 * not files at all or holding NUL bytes; numbers beyond what the program holds; outputs
 * that cannot be written; batch lines that ask for help.  Each must end with a clear
 * message and its exit status (2), never a crash, a hang or a lost result.  Runs the built
 * program (PARASOL_BIN). */
#include <criterion/criterion.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  int status, signal;
  char *out, *err;
} Run;

/* Runs "sh -c SCRIPT" with $P the program and $D a fresh folder (removed after). */
static Run run_sh(const char *dir, const char *script)
{
  const char *bin = g_getenv("PARASOL_BIN");
  cr_assert_not_null(bin, "PARASOL_BIN is not set");
  g_auto(GStrv) env = g_get_environ();
  env = g_environ_setenv(env, "P", bin, TRUE);
  env = g_environ_setenv(env, "D", dir, TRUE);
  const char *argv[] = { "/bin/sh", "-c", script, NULL };
  Run r = { 0 };
  int wait = 0;
  GError *error = NULL;
  cr_assert(g_spawn_sync(NULL, (char **)argv, env, G_SPAWN_DEFAULT, NULL, NULL, &r.out, &r.err,
                         &wait, &error),
            "%s", error ? error->message : "");
  r.status = WIFEXITED(wait) ? WEXITSTATUS(wait) : -1;
  r.signal = WIFSIGNALED(wait) ? WTERMSIG(wait) : 0;
  return r;
}

static void run_clear(Run *r)
{
  g_free(r->out);
  g_free(r->err);
}

/* Exit status 2, no signal, and @expect in the message. */
static void expect_refused(Run r, const char *expect)
{
  cr_expect_eq(r.signal, 0, "killed by signal %d", r.signal);
  cr_expect_eq(r.status, 2, "exit status %d, stderr: %s", r.status, r.err);
  cr_expect(strstr(r.err, expect) != NULL, "expected \"%s\" in: %s", expect, r.err);
  run_clear(&r);
}

static char *tmp_dir(void)
{
  GError *error = NULL;
  char *d = g_dir_make_tmp("parasol-inputs-XXXXXX", &error);
  cr_assert_not_null(d, "%s", error ? error->message : "");
  return d;
}

static void rm_dir(char *d)
{
  g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", d);
  cr_assert_eq(system(cmd), 0);
  g_free(d);
}

static void write_file(const char *dir, const char *name, const char *text, gssize len)
{
  g_autofree char *path = g_build_filename(dir, name, NULL);
  cr_assert(g_file_set_contents(path, text, len, NULL));
}

/* '[' x @depth then ']' x @depth. */
static char *nested(int depth)
{
  GString *s = g_string_new(NULL);
  for (int i = 0; i < depth; i++)
    g_string_append_c(s, '[');
  for (int i = 0; i < depth; i++)
    g_string_append_c(s, ']');
  return g_string_free(s, FALSE);
}

#define MLP "--model mlp --param layers=1,hidden=64,input=32,classes=16,batch=8 " \
            "--machine dgx-a100:1"

/* 1: json-glib's parser recurses once a level; 100,000 levels overflowed its stack. */
Test(inputs, deep_json_is_refused_by_every_reader)
{
  char *d = tmp_dir();
  g_autofree char *deep = nested(100000);
  write_file(d, "deep.json", deep, -1);
  const char *want = "nested deeper than 256 levels";
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy $D/deep.json"),
                 "deep.json:1:257: nested deeper than 256 levels of arrays and objects");
  expect_refused(run_sh(d, "$P simulate --model $D/deep.json --machine dgx-a100:1"),
                 "nested deeper than 256 levels");
  expect_refused(run_sh(d, "$P simulate " MLP " --machine $D/deep.json"),
                 "nested deeper than 256 levels");
  expect_refused(run_sh(d, "$P simulate " MLP " --profile $D/deep.json"), want);
  expect_refused(run_sh(d, "$P simulate " MLP " --calibration $D/deep.json"), want);
  expect_refused(run_sh(d, "$P profile show $D/deep.json"), want);
  expect_refused(run_sh(d, "$P model show $D/deep.json"), "nested deeper than 256 levels");
  expect_refused(run_sh(d, "$P machine show $D/deep.json"), "nested deeper than 256 levels");
  /* In a batch the line fails and the next one still runs. */
  write_file(d, "batch.txt",
             MLP " --strategy DIR/deep.json\n" MLP "\n", -1);
  Run r = run_sh(d, "sed \"s|DIR|$D|\" $D/batch.txt > $D/b.txt && $P simulate --batch $D/b.txt");
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect(strstr(r.out, "{\"line\":1,\"error\":") && strstr(r.out, "nested deeper"), "%s",
            r.out);
  cr_expect(strstr(r.out, "{\"line\": 2, \"iteration_time_s\":"), "%s", r.out);
  run_clear(&r);
  /* 256 levels are read (and then refused for what they hold, not for their depth). */
  g_autofree char *ok = nested(256);
  write_file(d, "ok.json", ok, -1);
  r = run_sh(d, "$P simulate " MLP " --strategy $D/ok.json");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "expected a JSON object") && !strstr(r.err, "nested"), "%s", r.err);
  run_clear(&r);
  rm_dir(d);
}

/* 7: devices, folders and files over the size limit are refused before they are read. */
Test(inputs, what_is_not_a_file_or_too_large_is_refused)
{
  char *d = tmp_dir();
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy /dev/zero"),
                 "/dev/zero: a character device; expected a file");
  expect_refused(run_sh(d, "$P simulate --model /dev/zero --machine dgx-a100:1"),
                 "/dev/zero: a character device");
  expect_refused(run_sh(d, "$P simulate " MLP " --machine /dev/zero"),
                 "/dev/zero: a character device");
  expect_refused(run_sh(d, "$P profile show /dev/zero"), "/dev/zero: a character device");
  expect_refused(run_sh(d, "$P simulate --batch /dev/zero"), "/dev/zero: a character device");
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy $D"), "a directory; expected a file");
  /* A pipe is read to its end (here at once: nobody writes to it). */
  expect_refused(run_sh(d, "mkfifo $D/fifo && $P simulate " MLP " --strategy $D/fifo"),
                 "fifo");
  /* 16 MiB and a byte, as a sparse file. */
  expect_refused(run_sh(d, "truncate -s 16777217 $D/big.json && "
                           "$P simulate " MLP " --machine $D/big.json"),
                 "16.0 MiB is larger than the 16 MiB that parasol reads from one file");
  expect_refused(run_sh(d, "head -c 16777217 /dev/zero | tr '\\0' ' ' | "
                           "$P simulate --batch -"),
                 "--batch -: more than the 16 MiB");
  rm_dir(d);
}

/* 4: a NUL byte is named with its line, in JSON files and in batches alike. */
Test(inputs, nul_bytes_are_named_with_their_line)
{
  char *d = tmp_dir();
  write_file(d, "nul.json", "{\"format\": \"parasol-strategy\",\n\"version\": 1\0}\n", 44);
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy $D/nul.json"),
                 "nul.json: line 2: a NUL byte (expected text)");
  write_file(d, "batch.txt", "--dp 1\n--dp 1\0\n--dp 1\n", 22);
  Run r = run_sh(d, "$P simulate " MLP " --batch $D/batch.txt");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "batch.txt: line 2: a NUL byte"), "%s", r.err);
  cr_expect_str_empty(r.out, "nothing is simulated: %s", r.out);
  run_clear(&r);
  expect_refused(run_sh(d, "printf -- '--dp 1\\n\\0\\n' | $P simulate --batch -"),
                 "<stdin>: line 2: a NUL byte");
  rm_dir(d);
}

/* 4: help in a batch line is an error for that line, not help text among the results. */
Test(inputs, help_in_a_batch_line_is_an_error_for_that_line)
{
  char *d = tmp_dir();
  write_file(d, "batch.txt",
             MLP "\n--help\n-h\n--help-all\n--help-plan\n" MLP "\n", -1);
  Run r = run_sh(d, "$P simulate --batch $D/batch.txt");
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect(!strstr(r.out, "Usage:"), "%s", r.out);
  for (int line = 2; line <= 5; line++) {
    g_autofree char *want = g_strdup_printf("{\"line\":%d,\"error\":\"help options", line);
    cr_expect(strstr(r.out, want), "line %d: %s", line, r.out);
  }
  cr_expect(strstr(r.out, "{\"line\": 1, \"iteration_time_s\":"), "%s", r.out);
  cr_expect(strstr(r.out, "{\"line\": 6, \"iteration_time_s\":"), "%s", r.out);
  run_clear(&r);
  rm_dir(d);
}

/* 5: numbers beyond what the program holds say so, with the range. */
Test(inputs, numbers_beyond_range_are_refused_with_the_range)
{
  char *d = tmp_dir();
  expect_refused(run_sh(d, "$P simulate " MLP " --bucket-mb 1e308"),
                 "--bucket-mb 1e308: expected a size in MB from 0 to 1000000");
  write_file(d, "mb.json",
             "{\"format\": \"parasol-strategy\", \"version\": 1,\n"
             " \"microbatches\": 9223372036854775808}", -1);
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy $D/mb.json"),
                 "mb.json:2:18: 9223372036854775808 is too large (parasol reads integers "
                 "from -9223372036854775808 to 9223372036854775807)");
  write_file(d, "inf.json", "{\"format\": \"parasol-strategy\", \"version\": 1e400}", -1);
  expect_refused(run_sh(d, "$P simulate " MLP " --strategy $D/inf.json"),
                 "1e400 is too large (parasol reads numbers of magnitude up to about 1.8e308)");
  expect_refused(run_sh(d, "$P simulate " MLP " --global-batch 9223372036854775807"),
                 "parameter 'batch' must be between 1 and 2147483647, not 9223372036854775807");
  /* Found by tests/fuzz-inputs.py under UBSan: dp x micro-batch size overflowed. */
  expect_refused(run_sh(d, "$P simulate " MLP " --microbatch-size 9223372036854775807"),
                 "--microbatch-size 9223372036854775807: expected a whole number from 1 to "
                 "2147483647");
  expect_refused(run_sh(d, "$P simulate " MLP " --microbatch-size 16"),
                 "micro-batches of 16 samples exceed the batch of 8 samples");
  expect_refused(run_sh(d, "$P simulate --model mlp --param batch=99999999999999999999"),
                 "model parameter 'batch': '99999999999999999999' is too large");
  expect_refused(run_sh(d, "$P search " MLP " --budget 1e99"),
                 "budget '1e99': too large; at most 8760h (a year) or 1000000000000 "
                 "evaluations");
  expect_refused(run_sh(d, "$P search " MLP " --budget 1e99s"), "budget '1e99s': too large");
  expect_refused(run_sh(d, "$P search " MLP " --budget inf"), "budget 'inf': too large");
  write_file(d, "m.json",
             "{\"format\": \"parasol-machine\", \"version\": 1, \"name\": \"big\",\n"
             " \"node\": {\"gpus\": 1, \"gpu\": {\"name\": \"g\", \"base\": \"a100-80gb\","
             " \"memory_GiB\": 9e9}, \"fabric\": \"nvswitch\"}}", -1);
  expect_refused(run_sh(d, "$P machine show $D/m.json"),
                 "node.gpu.memory_GiB: 9e+09 GiB is more than the 1048576 GiB a GPU may have");
  /* Found by tests/fuzz-inputs.py under UBSan: a route's picoseconds overflowed. */
  expect_refused(run_sh(d, "sed 's/\"latency_us\": 0.5/\"latency_us\": 1e15/' "
                           "$PARASOL_DATA/machines/dgx-a100.json > $D/lat.json && "
                           "$P machine show $D/lat.json"),
                 "latency_us: 1e+15 us is more than the 1000000 us (1 s) a latency may be");
  /* A million GPUs: refused at once, not simulated for minutes. */
  expect_refused(run_sh(d, "$P simulate --machine dgx-a100:131072"),
                 "131072 nodes of 8 GPUs exceed the 32768 GPUs a machine may have");
  rm_dir(d);
}

/* 6: output that cannot be written is an error, whichever command wrote it. */
Test(inputs, write_errors_end_with_a_message_and_status_2)
{
  if (access("/dev/full", W_OK) != 0)
    cr_skip_test("no /dev/full here");
  char *d = tmp_dir();
  expect_refused(run_sh(d, "$P simulate " MLP " --json > /dev/full"),
                 "cannot write the output (standard output)");
  expect_refused(run_sh(d, "$P simulate " MLP " > /dev/full"), "cannot write the output");
  write_file(d, "batch.txt", "--dp 1\n--dp 1\n", -1);
  expect_refused(run_sh(d, "$P simulate " MLP " --batch $D/batch.txt > /dev/full"),
                 "cannot write the results of line 1: No space left on device");
  expect_refused(run_sh(d, "$P models > /dev/full"), "cannot write the output");
  expect_refused(run_sh(d, "$P search " MLP " --budget 1000s --log /dev/full"),
                 "cannot write the log /dev/full: No space left on device");
  rm_dir(d);
}

/* 2: outputs are checked before the work, which would otherwise be lost at its end (the
 * budget of 1000 s would run out the test's time were the search started). */
Test(inputs, outputs_are_checked_before_the_search)
{
  char *d = tmp_dir();
  expect_refused(run_sh(d, "$P search " MLP " --budget 1000s --out $D"),
                 "a directory; expected a file to write");
  expect_refused(run_sh(d, "$P search " MLP " --budget 1000s --out /proc/plan.json"),
                 "cannot write /proc/plan.json");
  expect_refused(run_sh(d, "mkdir $D/p.png && $P search " MLP " --budget 1000s --plot $D/p.png"),
                 "p.png: a directory");
  if (geteuid() != 0) {
    /* A folder that takes no new file (root writes anywhere, so only others can try). */
    expect_refused(run_sh(d, "mkdir $D/ro && chmod 555 $D/ro && "
                             "$P search " MLP " --budget 1000s --out $D/ro/plan.json"),
                   "cannot write");
  }
  /* compare: an earlier run's CSV stays whole when this run fails. */
  write_file(d, "c.csv", "earlier,run\n", -1);
  expect_refused(run_sh(d, "$P compare " MLP " --algos mcmc --budget 5evals --out $D/c "
                           "--opt nosuch=1"),
                 "none of the algorithms has that option");
  g_autofree char *path = g_build_filename(d, "c.csv", NULL);
  g_autofree char *text = NULL;
  cr_assert(g_file_get_contents(path, &text, NULL, NULL));
  cr_expect_str_eq(text, "earlier,run\n");
  expect_refused(run_sh(d, "mkdir $D/x.gp && $P compare " MLP " --algos mcmc --budget 5evals "
                           "--out $D/x"),
                 "x.gp: a directory");
  /* No temporary is left behind. */
  Run r = run_sh(d, "ls $D");
  cr_expect_str_eq(r.out, "c.csv\np.png\nx.gp\n");
  run_clear(&r);
  rm_dir(d);
}

/* Found by tests/fuzz-inputs.py: a calibration whose format or table file is no string. */
Test(inputs, a_calibration_whose_format_is_no_string_is_refused)
{
  char *d = tmp_dir();
  write_file(d, "cal.json", "{\"format\": true, \"parameters\": {}}", -1);
  expect_refused(run_sh(d, "$P simulate " MLP " --calibration $D/cal.json"),
                 "expected a JSON object with \"format\": \"parasol-calibration\"");
  write_file(d, "cal2.json", "{\"format\": [1], \"parameters\": {}}", -1);
  Run r = run_sh(d, "$P simulate " MLP " --calibration $D/cal2.json");
  cr_expect(!strstr(r.err, "CRITICAL"), "%s", r.err);
  expect_refused(r, "expected a JSON object with \"format\": \"parasol-calibration\"");
  write_file(d, "cal3.json", "{\"format\": \"parasol-calibration\", \"parameters\": {}, "
             "\"tables\": {\"allreduce-table\": {\"file\": {}}}}", -1);
  r = run_sh(d, "$P simulate " MLP " --calibration $D/cal3.json");
  cr_expect(!strstr(r.err, "CRITICAL"), "%s", r.err);
  expect_refused(r, "expected {\"allreduce-table\": {\"file\": NAME}}");
  rm_dir(d);
}

/* 8: a misspelt top-level key of a graph is named, not ignored. */
Test(inputs, a_graph_with_an_unknown_key_is_refused)
{
  char *d = tmp_dir();
  write_file(d, "g.json",
             "{\"format\": \"parasol-graph\", \"version\": 1, \"name\": \"t\", "
             "\"tokens_per_sampel\": 4, \"ops\": [{\"name\": \"x\", \"type\": \"input\", "
             "\"inputs\": [], \"attrs\": {\"shape\": [8, 16]}}]}", -1);
  expect_refused(run_sh(d, "$P model show $D/g.json"),
                 "g.json: tokens_per_sampel: unknown key; expected one of: format, version, name, "
                 "tokens_per_sample, ops");
  rm_dir(d);
}
