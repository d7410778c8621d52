/* subst-private.h — what substitutions.c (the rewrites on a graph and the search) and
 * subst-gen.c (the generated and verified set of rewrite rules) share.  Only these two
 * files and the tests include it. */
#pragma once

#include "search-private.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* Rebuilding a graph with a replacement (substitutions.c)                             */

typedef struct SubstRebuild SubstRebuild;
/* Emits the replacement at its anchor, mapping the tensors it replaces. */
typedef gboolean (*SubstEmitFunc)(SubstRebuild *rb, GError **error);

struct SubstRebuild {
  const SimGraph *g;
  SimGraph *out;
  int *tmap;          /* old tensor -> new tensor                                  */
  int *omap;          /* old op -> new op (-1: gone)                               */
  gboolean *skip;     /* old ops the replacement stands for                        */
  int anchor;         /* the old op at whose place the replacement goes            */
  SubstEmitFunc emit;
  /* What the rewrites need. */
  int ops[8];
  int n_ops;
  int64_t ival[8];
  double fval;
  int unary;
};

int *subst_mapped_inputs(SubstRebuild *rb, int op);
void subst_copy_flags(SubstRebuild *rb, int from, int to);
void subst_map_outputs(SubstRebuild *rb, int old_op, int new_op);
int64_t subst_attr_int(const SimGraph *g, int op, const char *name);
/* The only consumer of @op's only output (reading it once), or -1. */
int subst_sole_consumer(const SimGraph *g, int op);
/* Whether @op neither uses another's weights nor lends its own. */
gboolean subst_owns_weights_alone(const SimGraph *g, int op);

/* The Q, K, V and output linears of the attention whose softmax is @sm (fuse-attention). */
gboolean subst_attention_linears(const SimGraph *g, int sm, int *linears);

/* Applies rewrite @name ("KIND:OPERATORS") to @g; a rewrite whose rule the generated set
 * did not verify is refused.  @tmap, if not NULL, receives the old tensor -> new tensor
 * map (g_free). */
SimGraph *subst_apply(const SimGraph *g, const char *name, int **tmap, GError **error);

/* ---------------------------------------------------------------------------------- */
/* The generated set (subst-gen.c)                                                     */

typedef enum {
  SUBST_UNTESTED,
  SUBST_VERIFIED,        /* same outputs as the source pattern on random data          */
  SUBST_MISMATCH,        /* different outputs: dropped                                 */
  SUBST_INEXPRESSIBLE,   /* the rewritten pattern cannot be built: dropped             */
} SubstVerdict;

typedef enum {
  SUBST_FUSE_ACTIVATION,  /* linear/conv2d/batchnorm + activation -> one operator      */
  SUBST_MERGE,            /* n linears/convs reading one tensor -> one and a split      */
  SUBST_MERGE_CONCAT,     /* n linears/convs reading one tensor, concatenated -> one    */
  SUBST_DISTRIBUTE,       /* binary(linear_A(x), linear_B(y)) -> linear(concat(x, y))    */
  SUBST_SPLIT_LINEAR,     /* linear(concat(x_1..x_n)) -> sum of linears of the x_i       */
  SUBST_COLLAPSE,         /* linear_B(linear_A(x)) -> linear_{AB}(x) (re-association)    */
  SUBST_TRANSPOSE_PAIR,   /* transpose_q(transpose_p(x)) -> transpose_r(x) or x         */
  SUBST_FOLD_TRANSPOSE,   /* matmul(a, transpose(b)) -> matmul(a, b) with trans_b       */
  SUBST_UNARY_PAIR,       /* unary_k2(unary_k1(x)) -> unary_c(x)                        */
  SUBST_N_FAMILIES
} SubstFamily;

typedef struct {
  char *id;              /* "merge/linear/n3/bias1": the family's name and parameters  */
  SubstFamily family;
  int type;              /* SimOpType of the main operator                              */
  int kind;              /* unary or binary kind (or the first of a pair)               */
  int kind2;             /* the second of a pair                                        */
  int target;            /* the candidate result: a unary kind, a trans_b value         */
  int n;                 /* members, or a rank                                          */
  int bias;
  int p[4], q[4], r[4];  /* transpose permutations: x -> p -> q, candidate r            */
  int src_ops, dst_ops;  /* operators of the source and the rewritten pattern           */
  gboolean reparam;      /* changes the weights themselves (not used for training)      */
  gboolean wrong_map;    /* maps weights wrongly on purpose (the verifier's own test)   */
  SubstVerdict verdict;
  double error;          /* max |a - b| / max(1, max |b|) over the outputs              */
  char *why;             /* for a rejection                                             */
} SubstRule;

typedef struct {
  GPtrArray *rules;      /* SubstRule*                                                  */
  GHashTable *verified;  /* id -> SubstRule* of the verified ones                       */
  int n_verified, n_mismatch, n_inexpressible;
  double seconds;        /* to generate and verify                                      */
  int max_ops;           /* the largest source pattern                                  */
} SubstSet;

/* The set, generated and verified on first use (thread-safe); never freed. */
const SubstSet *subst_set_get(void);
/* Generates and verifies a new set (for timing it and for tests). */
SubstSet *subst_set_build(void);
void subst_set_free(SubstSet *s);
/* Verifies one rule: runs its source pattern and its rewrite with the CPU executor on
 * random inputs and weights and sets its verdict, error and why. */
void subst_rule_verify(SubstRule *r);
/* Rewrites real graph @g by @rewrite and checks the same way that the outputs are the
 * same (weights of rewritten operators mapped from the originals); @diff receives the
 * largest relative difference. */
gboolean subst_check_rewrite(const SimGraph *g, const char *rewrite, double *diff,
                             GError **error);
SubstRule *subst_rule_copy(const SubstRule *r);
void subst_rule_free(SubstRule *r);
const char *subst_family_name(SubstFamily f);
const char *subst_family_category(SubstFamily f);
const char *subst_verdict_name(SubstVerdict v);
/* Whether the set verified the rule of @id. */
gboolean subst_rule_verified(const char *id);
/* A verified rule of @family for the given parameters (the others set to -1 match any),
 * or NULL. */
const SubstRule *subst_find_verified(SubstFamily family, int type, int kind, int kind2, int n,
                                     int bias, const int *p, const int *q);

/* The generated families on a real graph (subst-gen.c): each finds its instances,
 * named KIND:OPERATORS, and prepares the rebuild of one. */
void subst_gen_find(const SimGraph *g, GPtrArray *out);
/* 1: @kind is a generated family and @rb is prepared; 0: it is one but does not apply
 * (@error set); -1: not a generated family. */
int subst_gen_prepare(SubstRebuild *rb, const char *kind, const char *args, GError **error);

#define SUBST_MAX_OPS 4
#define SUBST_TOLERANCE 1e-4
/* Rules are checked twice, with floating-point inputs uniform in [-1, 1) and in
 * [-SUBST_INPUT_RANGE, SUBST_INPUT_RANGE): wide enough to tell relu6 from relu and to
 * take exp past 6, where the narrow range tells exp(relu(x)) from exp(x). */
#define SUBST_INPUT_RANGE 10.0f
/* The most inputs of a concatenation a split linear reads (CANDLE-Uno has 7). */
#define SPLIT_MAX 8

/* The rule being verified on this thread (subst-gen.c): it alone decides the rewrites
 * of its own pattern meanwhile. */
extern GPrivate subst_forced_key;
/* Rule @r's source pattern and the name of the rewrite that applies it (subst-gen.c). */
SimGraph *subst_source_pattern(const SubstRule *r, char **rewrite);

G_END_DECLS
