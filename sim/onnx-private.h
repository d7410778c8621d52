/* onnx-private.h — what the ONNX importer's files share (onnx.c: values, attributes,
 * constants and the file; onnx-fuse.c: patterns folded into one operator and the helpers
 * that emit operators; onnx-node.c: one node).  Included only where PARASOL_HAVE_ONNX. */
#pragma once

#include "sim-private.h"

#include "onnx.pb-c.h"

/* Constants larger than this are leaves (weights), not data the importer evaluates. */
#define CONST_MAX 64

typedef enum { V_CONST, V_LEAF, V_TENSOR } ValueKind;

typedef struct {
  ValueKind kind;
  SimShape shape;            /* V_CONST, V_LEAF                                      */
  double data[CONST_MAX];    /* V_CONST, row-major                                   */
  gboolean is_int;           /* V_CONST                                              */
  SimDType dtype;            /* V_LEAF: the dtype of an input op made from it        */
  gboolean data_only;        /* V_LEAF: computed from constants (a mask, positions):
                              * an input where used, never a weight                */
  gboolean buffer;           /* V_LEAF: a module's buffer (rotary tables), which the
                              * exporter named (parasol.buffers): an input where used
                              * as data, where a parameter would be learned          */
  int tensor;                /* V_TENSOR                                             */
  int pad[2];                /* V_TENSOR: padding of H and W still to apply (Pad)    */
} Value;

typedef struct {
  const char *filename;
  const Onnx__GraphProto *graph;
  SimGraph *g;
  GHashTable *values;        /* ONNX name -> Value*                                  */
  GHashTable *consumers;     /* ONNX name -> GArray of node indices                  */
  gboolean *skip;            /* nodes folded into an earlier one                     */
  const SimModelParams *params;
  GHashTable *used_params;   /* symbolic dimension names bound                       */
  int64_t tokens;
  GHashTable *buffers;       /* names listed by the "parasol.buffers" metadata       */
  GError **error;
} Importer;

gboolean onnx_fail(Importer *im, const Onnx__NodeProto *n, int code, const char *fmt, ...)
  G_GNUC_PRINTF(4, 5);
Value *onnx_value_get(Importer *im, const char *name);
void onnx_value_set(Importer *im, const char *name, const Value *v);
void onnx_set_tensor(Importer *im, const char *name, int tensor);
gboolean onnx_is_int_type(int32_t t);
gboolean onnx_tensor_value(Importer *im, const Onnx__TensorProto *t, Value *v,
                           const Onnx__NodeProto *n);
int64_t onnx_const_numel(const Value *v);
gboolean onnx_const_ints(Importer *im, const Onnx__NodeProto *n, int input, int64_t *out, int *count,
                         int max);
const Onnx__AttributeProto *onnx_attr(const Onnx__NodeProto *n, const char *name);
int64_t onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt);
double onnx_attr_float(const Onnx__NodeProto *n, const char *name, double dflt);
int onnx_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max);
const char *onnx_attr_string(const Onnx__NodeProto *n, const char *name, char *buf, gsize size);
char *onnx_op_name(Importer *im, const Onnx__NodeProto *n, int index, const char *suffix);
gboolean onnx_built(Importer *im, const Onnx__NodeProto *n, int t);
gboolean onnx_is_learned(const Value *v);
char *onnx_free_name(Importer *im, const char *name);
int onnx_learned_tensor(Importer *im, const Onnx__NodeProto *n, const char *name, const Value *v,
                        const SimShape *lead);
gboolean onnx_tensor_of(Importer *im, const Onnx__NodeProto *n, int i, int *out);
SimShape onnx_shape_of(Importer *im, const Value *v);
Value *onnx_leaf_input(Importer *im, const Onnx__NodeProto *n, int i, const char *what);
int onnx_sole_consumer(Importer *im, const char *name);
const Onnx__NodeProto *onnx_node(Importer *im, int i);
gboolean onnx_is_scalar_const(Importer *im, const char *name, double *value);
gboolean onnx_all_const(Importer *im, const Onnx__NodeProto *n, int first, int last);
gboolean onnx_const_binary(Importer *im, const Onnx__NodeProto *n, const char *op);
const char *onnx_fold_relu(Importer *im, const char *out, SimUnaryKind *act);
const char *onnx_fold_gelu(Importer *im, const char *x);
gboolean onnx_fuse_pointwise(Importer *im, int index, gboolean *fused);
gboolean onnx_fuse_swiglu(Importer *im, int index, int x, gboolean *fused);
gboolean onnx_emit_linear(Importer *im, const Onnx__NodeProto *n, int index, int x,
                          int64_t out_features, gboolean bias);
gboolean onnx_spatial_attrs(Importer *im, const Onnx__NodeProto *n, Value *in, int kernel[2],
                            int stride[2], int pad[2], int dilation[2]);
int onnx_as_2d(Importer *im, const Onnx__NodeProto *n, int index, int x);
int onnx_from_2d(Importer *im, const Onnx__NodeProto *n, int index, int x, int y);
gboolean onnx_padded_tensor(Importer *im, const Onnx__NodeProto *n, Value **v);
char *onnx_scope_of(const Onnx__NodeProto *n);
gboolean onnx_fuse_attention(Importer *im, int index, gboolean *fused);
gboolean onnx_import_node(Importer *im, int index);
