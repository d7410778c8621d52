/* exec-options.h — what `parasol exec` and `parasol validate` share: the execution
 * options (back end, steps, optimizer) and the setup of a run from a model, a machine and
 * a strategy described by the plan options of sim-options.h. */
#pragma once

#include "parasol-exec.h"
#include "sim-options.h"

typedef struct {
  char *backend;       /* "cpu" (default) or "cuda"                                  */
  int steps;
  char *optimizer;     /* overrides the strategy's: "sgd" or "adam"                   */
  double lr;           /* 0: the optimizer's default                                 */
  double adam_eps;     /* 0: 1e-8                                                     */
  gint64 seed;
  gboolean poison;     /* fill activations with NaN before each step (exec --check):   */
                       /* a correctness aid, kept out of timed runs                     */
  gboolean checking;   /* the run is compared with one device (exec --check): Adam     */
                       /* without --adam-eps then runs with CLI_CHECK_ADAM_EPS          */
  const char *load_weights; /* initial weights from this dump directory (exec_load_weight) */
} CliExecOptions;

/* Adam's epsilon for runs checked against one device when none is given.  With 1e-8 an
 * element whose gradient is rounding noise (a key bias before softmax, a unit ReLU keeps
 * dark for most samples) moves by about the learning rate in the direction of that noise,
 * which differs between strategies, so correct plans differ from one device by lr; a
 * step's response to a gradient difference is at most lr/eps times it, 1 with this. */
#define CLI_CHECK_ADAM_EPS 1e-3

void cli_exec_options_init(CliExecOptions *o, int default_steps);
void cli_exec_options_clear(CliExecOptions *o);
/* The option group (--backend, --steps, --optimizer, --lr, --adam-eps, --seed). */
GOptionGroup *cli_exec_option_group(CliExecOptions *o);

/* A model on a machine under a strategy, lowered to a plan and compiled for a back end. */
typedef struct {
  CliProblem pb;
  SimStrategy *strategy;
  SimPlan *plan;
  ExecBackend *backend;
  ExecRun *run;
  double check_eps;    /* Adam's epsilon chosen for the check (CLI_CHECK_ADAM_EPS), or 0 */
} CliExec;

/* Loads the problem, reads @strategy_file (or builds the plan options' strategy), lowers
 * it and compiles the run. */
gboolean cli_exec_setup(CliExec *e, const char *model, char **params, const char *machine,
                        const char *strategy_file, const CliPlanOptions *plan,
                        const CliExecOptions *o, GError **error);
/* A run of the one-device reference strategy of @e's plan with the same options. */
gboolean cli_exec_setup_reference(CliExec *ref, const CliExec *e, const CliExecOptions *o,
                                  GError **error);
void cli_exec_clear(CliExec *e);
/* The run options @o describes. */
ExecOptions cli_exec_run_options(const CliExecOptions *o);
/* Like cli_report_error(), with a back end's failure a failure of the work (status 1). */
int cli_exec_report_error(GError *error);
/* The devices of the machine that the plan gives work to. */
int cli_exec_devices_used(const SimPlan *p);
