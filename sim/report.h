/* report.h — building a report from a finished run (report.c); the public side of
 * reports is in parasol-sim.h.  Internal to libsim. */
#pragma once

#include "engine.h"

G_BEGIN_DECLS


typedef struct {
  char *name;
  double bytes;
  double utilization;
} SimLinkUse;

struct _SimReport {
  char *model;
  char *machine_name;
  const SimMachine *machine;        /* for traces: valid while the machine lives            */
  int n_devices;
  int n_ops;
  char **op_names;            /* n_ops, for traces                                     */
  double iteration_time;
  int64_t batch;
  int64_t tokens_per_sample;
  double model_flops;         /* per iteration                                          */
  double peak_flops;          /* summed over the devices the plan uses, at the graph's
                              * compute dtype                                           */
  int n_used;                 /* devices that compute or hold memory in the plan         */
  gboolean fits;
  int64_t *peak_mem;
  int64_t *host_mem;          /* per device: its offloaded optimizer states on the host  */
  int64_t host_most, host_node_most; /* the most of one device's, of one node's together  */
  int64_t *capacity;
  double *compute, *comm, *overlap, *idle;
  int64_t n_tasks;
  double crit[SIM_CLASS_COUNT + 1]; /* the last entry: waiting                          */
  SimLinkUse *links;          /* the busiest, most used first                          */
  int n_links;
  char *folding;
  char *steady;               /* the steady state's extrapolation, in words, or NULL */
  SimDetail detail;
  int microbatches, n_stages;  /* n_stages counts model chunks (stages x chunks)      */
  int chunks;                  /* model chunks per device group (interleaved), else 1  */
  SimSchedule schedule;
  /* The timeline, when kept: */
  int64_t n_records;
  SimTask *tasks;
  int32_t *extra;             /* links and members of collectives' flows                */
  double *start, *end;
};

/* Builds a report from a finished run.  @rep_of maps every device to the simulated device
 * whose timeline stands for it (NULL: itself). */
SimReport *sim_report_build(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                            const SimTaskGraph *tg, const SimTimeline *tl, const int *rep_of,
                            const char *folding, const SimOptions *o, double model_flops);

G_END_DECLS
