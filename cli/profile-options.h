/* profile-options.h — what the `parasol profile` subcommands share (cmd-profile.c,
 * cmd-profile-fit.c): the options of the commands that measure a model, loading that
 * model, enumerating and measuring its shards, and the exit status of a profile error. */
#pragma once

#include "cli.h"
#include "sim-options.h"
#include "parasol-profile.h"

typedef struct {
  char *model, *machine, *precision, *microbatches, *backend, *gpu, *attention;
  char **params;
  int device, warmup, repetitions, max_shapes;
  double min_ms;
  gboolean no_backward, update;
} CliProfileOptions;

/* A device that fails is a failure of the work (exit status 1); everything else is bad
 * input (2).  Frees @error. */
int cli_profile_error(GError *error);

void cli_profile_options_init(CliProfileOptions *o);
void cli_profile_options_clear(CliProfileOptions *o);
GOptionGroup *cli_profile_option_group(CliProfileOptions *o);
/* "0,2,5" into @out; the error names @what. */
gboolean cli_profile_parse_int_list(const char *text, const char *what, GArray *out,
                                    GError **error);
/* The model in the precision the options ask for. */
SimGraph *cli_profile_load_model(const CliProfileOptions *o, GError **error);
/* The distinct shards of @g the options ask to measure. */
ProfileShapes *cli_profile_enumerate(const CliProfileOptions *o, const SimGraph *g,
                                     GError **error);
/* The runner of --backend (cuda when the build has it, else cpu). */
ProfileRunner *cli_profile_make_runner(const CliProfileOptions *o, GError **error);
ProfileMeasureOptions cli_profile_measure_options(const CliProfileOptions *o);
/* Progress on stderr; @user_data, if given, is an int that keeps the number of shapes
 * done. */
void cli_profile_progress(int done, int total, const char *key, gpointer user_data);
/* The device spec the roofline predicts with: device 0 of @machine when given, else the
 * device library's entry for @gpu (@keep holds the machine). */
const SimDeviceSpec *cli_profile_spec_for(const char *machine, const char *gpu,
                                          SimMachine **keep, GError **error);

/* The subcommands of cmd-profile-fit.c. */
int cli_profile_calibrate(int argc, char **argv);
int cli_profile_compare(int argc, char **argv);
int cli_profile_perf(int argc, char **argv);
