/* inproc-tests.h — the few Criterion macros the GPU tests use, run one after another in
 * one process.
 *
 * Criterion runs every test in a child process that it spawns and talks to over a
 * socket; some sandboxed GPU machines refuse that ("Could not spawn test instance").
 * tests/test-gpu.c compiled with PARASOL_INPROC_TESTS uses these instead: a failed
 * assertion ends its test and marks it failed, a failed expectation marks it failed and
 * goes on, a skip ends it as skipped.  A crash ends the whole run, which names the test
 * that was running. */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  const char *suite;
  const char *name;
  void (*fn)(void);
} InprocTest;

enum { INPROC_MAX_TESTS = 256 };

static InprocTest inproc_tests[INPROC_MAX_TESTS];
static int inproc_n_tests;
static jmp_buf inproc_jump;
static int inproc_failed;

__attribute__((unused)) static void inproc_register(const char *suite, const char *name,
                                                    void (*fn)(void))
{
  if (inproc_n_tests < INPROC_MAX_TESTS)
    inproc_tests[inproc_n_tests++] = (InprocTest){ suite, name, fn };
}

/* Prints a failed check with its message; a fatal one leaves the test. */
__attribute__((unused)) static void inproc_report(int fatal, const char *file, int line,
                                                  const char *expr, const char *fmt, ...)
{
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("%s:%d: Assertion failed: %s%s%s\n", file, line, expr, msg[0] ? ": " : "", msg);
  fflush(stdout);
  inproc_failed = 1;
  if (fatal)
    longjmp(inproc_jump, 1);
}

__attribute__((unused)) static void inproc_skip(const char *fmt, ...)
{
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("skipped: %s\n", msg);
  longjmp(inproc_jump, 2);
}

#define Test(suite, name)                                                                  \
  static void inproc_##suite##_##name(void);                                               \
  __attribute__((constructor)) static void inproc_register_##suite##_##name(void)          \
  {                                                                                        \
    inproc_register(#suite, #name, inproc_##suite##_##name);                               \
  }                                                                                        \
  static void inproc_##suite##_##name(void)

/* Every macro appends an empty string, so that a check without a message still has a
 * format; a message's own arguments are followed by one unused "". */
#define INPROC_CHECK(fatal, cond, expr, ...)                                               \
  do {                                                                                     \
    if (!(cond))                                                                           \
      inproc_report(fatal, __FILE__, __LINE__, expr, __VA_ARGS__);                         \
  } while (0)
#define INPROC_ONE(fatal, cond, ...) INPROC_CHECK(fatal, cond, #cond, __VA_ARGS__)
#define INPROC_BIN(fatal, op, a, b, ...)                                                   \
  INPROC_CHECK(fatal, (a)op(b), #a " " #op " " #b, __VA_ARGS__)

#define cr_assert(...) INPROC_ONE(1, __VA_ARGS__, "")
#define cr_expect(...) INPROC_ONE(0, __VA_ARGS__, "")
#define INPROC_NOT_NULL(p, ...) INPROC_CHECK(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_not_null(...) INPROC_NOT_NULL(__VA_ARGS__, "")
#define cr_assert_eq(...) INPROC_BIN(1, ==, __VA_ARGS__, "")
#define cr_assert_geq(...) INPROC_BIN(1, >=, __VA_ARGS__, "")
#define cr_assert_gt(...) INPROC_BIN(1, >, __VA_ARGS__, "")
#define cr_expect_eq(...) INPROC_BIN(0, ==, __VA_ARGS__, "")
#define cr_expect_gt(...) INPROC_BIN(0, >, __VA_ARGS__, "")
#define cr_expect_leq(...) INPROC_BIN(0, <=, __VA_ARGS__, "")
#define cr_skip_test(...) inproc_skip(__VA_ARGS__)

/* Runs the tests whose "suite::name" contains @filter (all when NULL), in the order of
 * the file; the summary line has Criterion's wording.  Returns the exit status. */
__attribute__((unused)) static int inproc_run_all(const char *filter)
{
  volatile int passed = 0, failed = 0, skipped = 0;
  for (volatile int k = 0; k < inproc_n_tests; k++) {
    const InprocTest *t = &inproc_tests[k];
    char full[256];
    snprintf(full, sizeof full, "%s::%s", t->suite, t->name);
    if (filter && !strstr(full, filter))
      continue;
    printf("[RUN ] %s\n", full);
    fflush(stdout);
    inproc_failed = 0;
    int how = setjmp(inproc_jump);
    if (how == 0)
      t->fn();
    if (how == 2) {
      skipped++;
      printf("[SKIP] %s\n", full);
    } else if (inproc_failed) {
      failed++;
      printf("[FAIL] %s\n", full);
    } else {
      passed++;
      printf("[PASS] %s\n", full);
    }
    fflush(stdout);
  }
  printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: 0 | Skipped: %d\n",
         passed + failed, passed, failed, skipped);
  return failed > 0;
}
