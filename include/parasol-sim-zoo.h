/* parasol-sim-zoo.h — part of libsim's public interface (parasol-sim.h, which includes
 * every part): the model zoo, ONNX import and model loading. */
#pragma once

#include "parasol-sim-graph.h"

G_BEGIN_DECLS

/* ---------------------------------------------------------------------------------- */
/* The model zoo                                                                       */

/* A parameter of a zoo model ("batch", "hidden", "layers", ...). */
typedef struct {
  const char *name;
  int64_t value;
  const char *help;
} SimModelParam;

typedef struct _SimModelParams SimModelParams;
SIM_PUBLIC SimModelParams *sim_model_params_new(void);
SIM_PUBLIC void sim_model_params_free(SimModelParams *p);
/* Parses "k=v" or "k1=v1,k2=v2"; values take k/M/G suffixes (1k = 1000). */
SIM_PUBLIC gboolean sim_model_params_parse(SimModelParams *p, const char *text, GError **error);
SIM_PUBLIC void sim_model_params_set(SimModelParams *p, const char *name, int64_t value);
SIM_PUBLIC gboolean sim_model_params_lookup(const SimModelParams *p, const char *name,
                                            int64_t *value);

SIM_PUBLIC int sim_zoo_n_models(void);
SIM_PUBLIC const char *sim_zoo_model_name(int i);
SIM_PUBLIC const char *sim_zoo_model_description(int i);
/* The parameters model @name accepts, with their defaults; NULL-terminated, static. */
SIM_PUBLIC const SimModelParam *sim_zoo_model_params(const char *name);
/* Megatron pads a transformer's vocabulary so that the vocabulary-parallel embedding and
 * output layer split evenly over the tensor-parallel ranks: to a multiple of
 * make-vocab-size-divisible-by (128) x TP (megatron/training/tokenizer's
 * _vocab_size_with_padding, as data/reference/vtrain's runs used it).  When @name is a
 * zoo transformer (it has "vocab" and "heads") whose vocabulary @params leaves at its
 * default, and that default is not such a multiple for @tp (< 1 counts as 1), sets
 * "vocab" in @params to the padded size and returns TRUE with the default in
 * *@vocab_default and the padded size in *@vocab_padded (either may be NULL); otherwise
 * changes nothing and returns FALSE.  The program pads every plan's model this way. */
SIM_PUBLIC gboolean sim_model_params_pad_vocab(SimModelParams *params, const char *name, int tp,
                                               int64_t *vocab_default, int64_t *vocab_padded);
/* Builds zoo model @name ("resnet-50", "gpt3-175b", "gpt") with @params (may be NULL).
 * Unknown names and unknown or out-of-range parameters are SIM_ERROR_UNKNOWN/INVALID. */
SIM_PUBLIC SimGraph *sim_zoo_build(const char *name, const SimModelParams *params,
                                   GError **error);
/* ONNX models (sim/onnx.c): the graph of FILE.onnx, its symbolic input dimensions
 * ("batch", "seq") set from @params.  Without ONNX support built in (protobuf-c), an
 * error says so and sim_onnx_available() is FALSE. */
SIM_PUBLIC gboolean sim_onnx_available(void);
SIM_PUBLIC SimGraph *sim_onnx_import(const char *path, const SimModelParams *params,
                                     GError **error);
/* One line per operator type the importer does not support ("Erf: 2 nodes, the first
 * '/l/Erf'"); an empty list when it supports them all; NULL with @error on a bad file. */
SIM_PUBLIC char **sim_onnx_check(const char *path, GError **error);

/* A zoo name, a graph file or an ONNX file (FILE.onnx).  A zoo model comes in fp16, the
 * float dtype of the program's default precision (mixed fp16; sim_graph_set_float_dtype()
 * sets another), where sim_zoo_build() builds it in fp32; graph and ONNX files keep their
 * own dtypes. */
SIM_PUBLIC SimGraph *sim_model_load(const char *name_or_file, const SimModelParams *params,
                                    GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(SimModelParams, sim_model_params_free)

G_END_DECLS
