/* zoo.h — what the model builders of the zoo share with its registry (zoo.c).
 *
 * A zoo model is a name, a one-line description, a table of integer parameters with
 * their defaults and a builder.  The registry resolves the caller's parameters against
 * the table (unknown names and non-positive values are refused there, once for every
 * model), and the builder reads the resolved values with sim_zoo_arg().  Builders use
 * the public graph builders of parasol-sim.h, whose errors are sticky, so a builder is
 * a straight sequence of calls; the registry reports the first error afterwards. */
#pragma once

#include "../sim-private.h"

G_BEGIN_DECLS

/* The most parameters one model takes. */
#define SIM_ZOO_MAX_PARAMS 16

typedef struct _SimZooModel SimZooModel;

/* The resolved parameters of one build: the model's defaults overridden by the caller's. */
typedef struct {
  const SimZooModel *model;
  int64_t values[SIM_ZOO_MAX_PARAMS];
} SimZooArgs;

/* Builds the graph of @model (its name names the graph) from @args.  Returns NULL with
 * @error set when a combination of parameters is impossible (hidden % heads, say);
 * errors of the graph builders stay sticky in the returned graph. */
typedef SimGraph *(*SimZooBuildFunc)(const SimZooModel *model, const SimZooArgs *args,
                                     GError **error);

struct _SimZooModel {
  const char *name;
  const char *description;
  const SimModelParam *params;       /* terminated by an entry with a NULL name          */
  SimZooBuildFunc build;
};

/* The value of parameter @name, which the model's table must declare. */
int64_t sim_zoo_arg(const SimZooArgs *args, const char *name);
/* sim_zoo_arg() as an int: the registry keeps every value within INT_MAX. */
int sim_zoo_arg_int(const SimZooArgs *args, const char *name);

/* Fails with SIM_ERROR_INVALID unless parameter @a is a multiple of parameter @b. */
gboolean sim_zoo_check_divisible(const SimZooArgs *args, const char *a, const char *b,
                                 GError **error);

/* A buffer for an operator name made with printf formatting; names are copied by the
 * graph, so one buffer serves a whole builder. */
typedef struct {
  char s[96];
} SimZooName;
const char *sim_zoo_name(SimZooName *buf, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* sim_graph_split() into any number of parts: the split operator takes at most
 * SIM_MAX_DIMS sizes, so a larger split becomes a tree of splits, each part a slice of
 * the input as before.  @outs receives the @n parts (-1 after a builder error); returns
 * the first part. */
int sim_zoo_split(SimGraph *g, const char *name, int x, int axis, int n, const int64_t *sizes,
                  int *outs);

/* For attributes the sim_graph_* builders do not take (attention dropout, embedding
 * bags): setters and sim_graph_add_op() that behave like the builders, doing nothing
 * after an error and keeping the first error in the graph.  sim_zoo_add_op() returns
 * the op's first output tensor, or -1. */
void sim_zoo_attr_int(SimGraph *g, SimAttrs *attrs, const char *name, int64_t v);
void sim_zoo_attr_float(SimGraph *g, SimAttrs *attrs, const char *name, double v);
int sim_zoo_add_op(SimGraph *g, SimOpType type, const char *name, int n_inputs,
                   const int *inputs, const SimAttrs *attrs);

/* Makes the op that produced @t use the weights of the op that produced @owner (a tied
 * embedding, a chunk of an unrolled LSTM layer), keeping the first error in the graph. */
void sim_zoo_share(SimGraph *g, int t, int owner);

/* The shape of tensor @t, or an empty shape when @t is -1 (a sticky builder error). */
SimShape sim_zoo_shape(const SimGraph *g, int t);

/* The families of models, each terminated by an entry with a NULL name. */
extern const SimZooModel sim_zoo_mlp_models[];
extern const SimZooModel sim_zoo_cnn_models[];
extern const SimZooModel sim_zoo_rnn_models[];
extern const SimZooModel sim_zoo_transformer_models[];
extern const SimZooModel sim_zoo_llm_models[];
extern const SimZooModel sim_zoo_recsys_models[];
extern const SimZooModel sim_zoo_candle_models[];

/* Whether the graph is still being built: false after an error, which every later
 * builder call would only repeat.  Loops over a size a user gives (layers, tables,
 * towers) test it, so that a mistyped size fails at once instead of after billions of
 * empty calls. */
static inline gboolean sim_zoo_going(const SimGraph *g)
{
  return g->sticky_error == NULL;
}

G_END_DECLS
