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
} CliExecOptions;

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
