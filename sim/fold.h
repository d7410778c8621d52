/* fold.h — symmetry folding (fold.c), for the driver in simulate.c: which devices'
 * timelines are copies of others' (data-parallel replicas, the tensor-parallel ranks of
 * a stage), and the shadow tasks that stand for the folded devices' share of links. */
#pragma once

#include "taskgraph.h"

G_BEGIN_DECLS

/* The symmetry folding relies on, as device maps: D data-parallel replicas (replica q's
 * image of replica-0 device d0 is phi[q * nd + d0]) and, inside replica 0, the
 * tensor-parallel ranks of each stage (members[c], representative first). */
typedef struct {
  int nd;
  int D;              /* replicas folded (1: none)                                   */
  int *phi;           /* D * nd                                                      */
  int *repl;          /* per device: its replica, or -1                               */
  int *base;          /* per device: its replica-0 device                              */
  int n_classes;      /* rank classes folded (0: none)                                 */
  int *cls;           /* per replica-0 device: its class, or -1                         */
  int *pos;           /* its place in the class                                        */
  GPtrArray *members; /* int arrays                                                    */
  GArray *sizes;      /* int                                                          */
  /* Shadows added without the check of their routes (SimOptions.fold_checked): the run
   * is checked instead (simulate.c), against @watch, which add_shadows() fills with each
   * shadow after its original (SimTaskRef pairs). */
  gboolean checked;
  GArray *watch;
  /* Set by add_shadows() where the route check refused the replicas but each replica's
   * flows meet, hop by hop, the same links and sharing as replica 0's: worth folding
   * them and checking the run. */
  gboolean may_check;
  /* Whether the caller folds replicas with the run checked (SimOptions.fold_checked):
   * only then does add_shadows() ask whether they are worth it. */
  gboolean ask_check;
  /* Leave out the shadows whose links no simulated flow crosses, directly or through
   * other shadows (SimOptions.prune_shadows, brief runs; not with @checked). */
  gboolean prune;
  /* Set when the simulation is cancelled (SimOptions.cancel): the checks and the shadows
   * stop where they are, and the caller drops what they made. */
  const atomic_int *cancel;
} Fold;

void fold_clear(Fold *f);
gboolean fold_replicas(const SimGraph *g, const SimMachine *m, const SimStrategy *s, Fold *f);
gboolean fold_ranks(const SimGraph *g, const SimMachine *m, const SimStrategy *s, Fold *f);
int fold_rep(const Fold *f, int d, gboolean use_r, gboolean use_k);
gboolean add_shadows(SimTaskGraph *tg, const SimMachine *m, Fold *f, gboolean replicas,
                     gboolean ranks);

G_END_DECLS
