/* onnx.c — ONNX models as parasol graphs (`parasol import`, `--model FILE.onnx`).
 *
 * The file is read with protobuf-c from the C code that protoc-c generates at build time
 * from the onnx.proto schema of Debian's libonnx-dev (sim/meson.build).  Only shapes are
 * needed, so the weights may be graph inputs (torch.onnx.export(export_params=False)),
 * initializers with their data, external data or initializers with no data at all.
 *
 * Every ONNX value is one of:
 *   - a constant: small integer or float data known at import time (Constant nodes,
 *     shape arithmetic: Shape, Gather, Unsqueeze, Concat, Cast, Add, Mul, ...), which
 *     the importer evaluates so that the targets of Reshape are known;
 *   - a leaf: a graph input or initializer with a shape and no data needed; used in a
 *     weight's place (Conv's W, Gemm's B, a MatMul's right side, a norm's scale) it is a
 *     weight of the parasol operator, used as data it becomes an input op;
 *   - a tensor of the parasol graph.
 * Symbolic dimensions of the graph inputs ("batch", "seq") take their value from the
 * model parameters (--param batch=64); a sequence dimension sets tokens_per_sample.
 *
 * PyTorch's exports are mapped onto parasol's operators as the zoo builds them:
 * torch.nn.MultiheadAttention (the nodes under its scope) becomes one attention operator;
 * a MatMul with a weight and the Add of a bias become one linear; Relu after Conv, Gemm
 * or BatchNormalization and GELU (written out with Erf) after a linear become the
 * operator's activation; RMSNorm written out (Pow, ReduceMean, Add, Sqrt, a reciprocal,
 * Mul by x and by the weight) becomes one rmsnorm and GELU's tanh approximation written out
 * one GELU (onnx_fuse_pointwise()); a SwiGLU MLP becomes one gated_mlp
 * (onnx_fuse_swiglu()); Pad before a pooling or convolution becomes its padding;
 * Flatten is a reshape; GlobalAveragePool a pooling over the whole image; Clip to [0, 6]
 * a relu6; 1-D convolutions and poolings 1 x k windows between reshapes (onnx_as_2d());
 * a learned tensor used as data (a ViT's class token) an embedding of its rows
 * (onnx_learned_tensor()); Expand of a computed tensor copies joined by a concat; masks and
 * positions computed from constants are inputs of their shape.  An operator outside
 * this mapping is an error that names the node and its type; sim_onnx_check() lists the
 * operator types the importer does not know (docs/import.md).
 *
 * The importer's files: this one (values, attributes, constant arithmetic, the file and its
 * inputs), onnx-node.c (one node) and onnx-fuse.c (the patterns above), sharing
 * onnx-private.h. */
#include "sim-private.h"

#include "parasol-config.h"

#include <glib/gstdio.h>

#include <math.h>
#include <string.h>

#if PARASOL_HAVE_ONNX

#include "onnx-private.h"

/* The largest ONNX file read: models with their weights inside can be large, but the
 * importer keeps the whole file and its decoded form in memory. */
#define ONNX_MAX_BYTES ((gsize)2 << 30)
gboolean onnx_fail(Importer *im, const Onnx__NodeProto *n, int code, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  g_autofree char *msg = g_strdup_vprintf(fmt, ap);
  va_end(ap);
  g_autofree char *place = n ? g_strdup_printf("node '%s' (%s)", n->name ? n->name : "",
                                               n->op_type)
                             : NULL;
  sim_set_error_at(im->error, code, im->filename, place, "%s", msg);
  return FALSE;
}

/* ---------------------------------------------------------------------------------- */
/* Values                                                                              */

Value *onnx_value_get(Importer *im, const char *name)
{
  return name && *name ? g_hash_table_lookup(im->values, name) : NULL;
}

void onnx_value_set(Importer *im, const char *name, const Value *v)
{
  if (!name || !*name)
    return;
  g_hash_table_replace(im->values, g_strdup(name), g_memdup2(v, sizeof *v));
}

void onnx_set_tensor(Importer *im, const char *name, int tensor)
{
  Value v = { .kind = V_TENSOR, .tensor = tensor };
  onnx_value_set(im, name, &v);
}

static SimDType dtype_of(int32_t onnx_type)
{
  switch (onnx_type) {
  case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: return SIM_DTYPE_FP16;
  case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: return SIM_DTYPE_BF16;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return SIM_DTYPE_INT32;
  case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return SIM_DTYPE_INT64;
  default: return SIM_DTYPE_FP32;
  }
}

gboolean onnx_is_int_type(int32_t t)
{
  return t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ||
         t == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 || t == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 ||
         t == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT16;
}

/* A TensorProto as a value: a constant when it is small and its data is inside the file,
 * a leaf otherwise. */
gboolean onnx_tensor_value(Importer *im, const Onnx__TensorProto *t, Value *v,
                             const Onnx__NodeProto *n)
{
  memset(v, 0, sizeof *v);
  if (t->n_dims > SIM_MAX_DIMS)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "tensor '%s' has %zu dimensions; at most %d are "
                "supported", t->name ? t->name : "", t->n_dims, SIM_MAX_DIMS);
  v->shape.ndim = (int)t->n_dims;
  int64_t numel = 1;
  for (size_t d = 0; d < t->n_dims; d++) {
    v->shape.dims[d] = t->dims[d];
    numel *= t->dims[d];
  }
  v->dtype = dtype_of(t->data_type);
  gboolean external = t->has_data_location &&
                      t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  gsize have = 0;
  int32_t dt = t->data_type;
  if (!external && numel <= CONST_MAX && (onnx_is_int_type(dt) || numel <= 1)) {
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64) {
      if (t->n_int64_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++)
          v->data[i] = (double)t->int64_data[i];
        have = numel;
      } else if (t->has_raw_data && t->raw_data.len == (size_t)numel * 8) {
        for (int64_t i = 0; i < numel; i++) {
          int64_t x;
          memcpy(&x, t->raw_data.data + 8 * i, 8);
          v->data[i] = (double)GINT64_FROM_LE(x);
        }
        have = numel;
      }
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ||
               dt == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL ||
               dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 ||
               dt == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 ||
               dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT16) {
      gsize size = dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ? 4
                   : dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT16 ? 2 : 1;
      if (t->n_int32_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++)
          v->data[i] = t->int32_data[i];
        have = numel;
      } else if (t->has_raw_data && t->raw_data.len == (size_t)numel * size) {
        for (int64_t i = 0; i < numel; i++) {
          if (size == 4) {
            int32_t x;
            memcpy(&x, t->raw_data.data + 4 * i, 4);
            v->data[i] = GINT32_FROM_LE(x);
          } else if (size == 2) {
            int16_t x;
            memcpy(&x, t->raw_data.data + 2 * i, 2);
            v->data[i] = GINT16_FROM_LE(x);
          } else {
            v->data[i] = dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT8
                           ? (double)(int8_t)t->raw_data.data[i] : t->raw_data.data[i];
          }
        }
        have = numel;
      }
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
      if (t->n_float_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++)
          v->data[i] = t->float_data[i];
        have = numel;
      } else if (t->has_raw_data && t->raw_data.len == (size_t)numel * 4) {
        for (int64_t i = 0; i < numel; i++) {
          guint32 x;
          float f;
          memcpy(&x, t->raw_data.data + 4 * i, 4);
          x = GUINT32_FROM_LE(x);
          memcpy(&f, &x, 4);
          v->data[i] = f;
        }
        have = numel;
      }
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) {
      if (t->n_double_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++)
          v->data[i] = t->double_data[i];
        have = numel;
      } else if (t->has_raw_data && t->raw_data.len == (size_t)numel * 8) {
        for (int64_t i = 0; i < numel; i++)
          memcpy(&v->data[i], t->raw_data.data + 8 * i, 8);
        have = numel;
      }
    }
  }
  if (have == (gsize)numel && (numel > 0 || t->has_raw_data)) {
    v->kind = V_CONST;
    v->is_int = onnx_is_int_type(dt);
  } else {
    v->kind = V_LEAF;
  }
  return TRUE;
}

int64_t onnx_const_numel(const Value *v)
{
  return sim_shape_numel(&v->shape);
}

/* The constant @name as integers, or FALSE with an error. */
gboolean onnx_const_ints(Importer *im, const Onnx__NodeProto *n, int input, int64_t *out,
                           int *count, int max)
{
  const char *name = (size_t)input < n->n_input ? n->input[input] : NULL;
  Value *v = onnx_value_get(im, name);
  if (!v || v->kind != V_CONST)
    return onnx_fail(im, n, SIM_ERROR_INVALID,
                "input %d ('%s') must be a constant known at import time (a shape, axes or "
                "sizes), found %s", input, name ? name : "",
                !v ? "nothing" : v->kind == V_LEAF ? "a graph input or weight" : "a computed "
                "tensor");
  int64_t k = onnx_const_numel(v);
  if (k > max)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "input %d has %" G_GINT64_FORMAT " values; at most "
                "%d expected", input, k, max);
  /* INT64_MAX ("to the end") does not survive a double: clamped far past any size. */
  for (int64_t i = 0; i < k; i++)
    out[i] = (int64_t)llround(CLAMP(v->data[i], -4611686018427387904.0, 4611686018427387904.0));
  *count = (int)k;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Attributes                                                                          */

const Onnx__AttributeProto *onnx_attr(const Onnx__NodeProto *n, const char *name)
{
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name))
      return n->attribute[i];
  return NULL;
}

int64_t onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
  const Onnx__AttributeProto *a = onnx_attr(n, name);
  return a && a->has_i ? a->i : dflt;
}

double onnx_attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
  const Onnx__AttributeProto *a = onnx_attr(n, name);
  return a && a->has_f ? a->f : dflt;
}

/* An ints attribute; returns its length (0 when absent). */
int onnx_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max)
{
  const Onnx__AttributeProto *a = onnx_attr(n, name);
  if (!a)
    return 0;
  int k = (int)MIN(a->n_ints, (size_t)max);
  for (int i = 0; i < k; i++)
    out[i] = a->ints[i];
  return k;
}

const char *onnx_attr_string(const Onnx__NodeProto *n, const char *name, char *buf, gsize size)
{
  const Onnx__AttributeProto *a = onnx_attr(n, name);
  if (!a || !a->has_s)
    return NULL;
  gsize k = MIN(a->s.len, size - 1);
  memcpy(buf, a->s.data, k);
  buf[k] = '\0';
  return buf;
}

/* ---------------------------------------------------------------------------------- */
/* Building                                                                            */

/* A unique op name from the node's name ("/layer1/layer1.0/conv1/Conv" loses its first
 * slash), or its type and index. */
char *onnx_op_name(Importer *im, const Onnx__NodeProto *n, int index, const char *suffix)
{
  const char *base = n->name && *n->name ? n->name : NULL;
  g_autofree char *b = base ? g_strdup(base[0] == '/' && base[1] ? base + 1 : base)
                            : g_strdup_printf("%s_%d", n->op_type, index);
  char *name = suffix ? g_strconcat(b, suffix, NULL) : g_strdup(b);
  for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
    g_free(name);
    name = suffix ? g_strdup_printf("%s%s#%d", b, suffix, k) : g_strdup_printf("%s#%d", b, k);
  }
  return name;
}

/* A builder's result: the tensor, or FALSE with the graph's error naming the node. */
gboolean onnx_built(Importer *im, const Onnx__NodeProto *n, int t)
{
  if (t >= 0)
    return TRUE;
  g_autoptr(GError) err = NULL;
  sim_graph_check(im->g, &err);
  return onnx_fail(im, n, SIM_ERROR_INVALID, "%s", err ? err->message : "cannot be built");
}

/* Whether leaf @v is a learned tensor: neither computed from constants nor a buffer. */
gboolean onnx_is_learned(const Value *v)
{
  return v->kind == V_LEAF && !v->data_only && !v->buffer;
}

/* An op name not yet taken, from @name. */
char *onnx_free_name(Importer *im, const char *name)
{
  char *oname = g_strdup(name);
  for (int k = 2; sim_graph_op_by_name(im->g, oname) >= 0; k++) {
    g_free(oname);
    oname = g_strdup_printf("%s#%d", name, k);
  }
  return oname;
}

/* Learned tensor @v (named @name) used as data, as a ViT's class token and position
 * embedding are: an embedding whose table is the tensor, its rows all dimensions but the
 * last, read by ids of shape @lead, so that the output is @lead with the last dimension
 * added.  Its parameters are the tensor's; its gradient is summed over the ids. */
int onnx_learned_tensor(Importer *im, const Onnx__NodeProto *n, const char *name,
                          const Value *v, const SimShape *lead)
{
  int64_t rows = 1, width = v->shape.ndim ? v->shape.dims[v->shape.ndim - 1] : 1;
  for (int d = 0; d + 1 < v->shape.ndim; d++)
    rows *= v->shape.dims[d];
  if (lead->ndim + 1 > SIM_MAX_DIMS) {
    onnx_fail(im, n, SIM_ERROR_INVALID, "learned tensor '%s' has too many dimensions", name);
    return -1;
  }
  g_autofree char *base = g_strdup_printf("%s/rows", name);
  g_autofree char *ids_name = onnx_free_name(im, base);
  int ids = sim_graph_input(im->g, ids_name, SIM_DTYPE_INT64, lead->ndim, lead->dims);
  if (!onnx_built(im, n, ids))
    return -1;
  g_autofree char *oname = onnx_free_name(im, name);
  int t = sim_graph_embedding(im->g, oname, ids, rows, width);
  if (!onnx_built(im, n, t))
    return -1;
  return t;
}

/* Input @i of node @n as a tensor of the graph: a leaf used as data becomes an input op,
 * or an embedding if it is learned (onnx_learned_tensor()). */
gboolean onnx_tensor_of(Importer *im, const Onnx__NodeProto *n, int i, int *out)
{
  const char *name = (size_t)i < n->n_input ? n->input[i] : NULL;
  Value *v = onnx_value_get(im, name);
  if (!v)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "input %d ('%s') is not made by an earlier node", i,
                name ? name : "");
  if (v->kind == V_TENSOR) {
    if (v->pad[0] || v->pad[1])
      return onnx_fail(im, n, SIM_ERROR_INVALID, "input '%s' is padded (Pad), which only a "
                  "convolution or pooling can take", name);
    *out = v->tensor;
    return TRUE;
  }
  if (v->kind == V_CONST && v->shape.ndim == 0)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "input %d ('%s') is a scalar constant, which this "
                "operator cannot take as data", i, name);
  if (onnx_is_learned(v)) {
    SimShape lead = v->shape;
    lead.ndim = MAX(v->shape.ndim - 1, 1);
    if (v->shape.ndim <= 1)
      lead.dims[0] = 1;
    /* Added to (or joined with) a batch of samples, it is read once per sample, as its
     * broadcast is: the operator then splits over the samples as the others do. */
    for (size_t j = 0; v->shape.ndim >= 2 && v->shape.dims[0] == 1 && j < n->n_input; j++) {
      Value *o = (int)j == i ? NULL : onnx_value_get(im, n->input[j]);
      if (o && o->kind == V_TENSOR) {
        SimShape os = sim_graph_tensor_shape(im->g, o->tensor);
        if (os.ndim == v->shape.ndim && os.dims[0] > 1)
          lead.dims[0] = os.dims[0];
      }
    }
    int t = onnx_learned_tensor(im, n, name, v, &lead);
    if (t < 0)
      return FALSE;
    onnx_set_tensor(im, name, t);
    *out = t;
    return TRUE;
  }
  /* A constant used as data (positions, a mask) is an input of its shape: its values do
   * not change the work. */
  SimDType dtype = v->kind == V_CONST ? (v->is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32) : v->dtype;
  g_autofree char *oname = onnx_free_name(im, name);
  int t = sim_graph_input(im->g, oname, dtype, v->shape.ndim, v->shape.dims);
  if (!onnx_built(im, n, t))
    return FALSE;
  onnx_set_tensor(im, name, t);
  *out = t;
  return TRUE;
}

SimShape onnx_shape_of(Importer *im, const Value *v)
{
  return v->kind == V_TENSOR ? sim_graph_tensor_shape(im->g, v->tensor) : v->shape;
}

/* The leaf (weight) input @i of @n, which must exist. */
Value *onnx_leaf_input(Importer *im, const Onnx__NodeProto *n, int i, const char *what)
{
  const char *name = (size_t)i < n->n_input ? n->input[i] : NULL;
  Value *v = onnx_value_get(im, name);
  if (!v || v->kind != V_LEAF || v->data_only) {
    onnx_fail(im, n, SIM_ERROR_INVALID, "input %d ('%s', the %s) must be a weight: a graph input "
         "or an initializer, not a computed tensor", i, name ? name : "", what);
    return NULL;
  }
  return v;
}

/* The single node that consumes @name, or -1. */
int onnx_sole_consumer(Importer *im, const char *name)
{
  GArray *c = name ? g_hash_table_lookup(im->consumers, name) : NULL;
  if (!c || c->len != 1)
    return -1;
  for (size_t o = 0; o < im->graph->n_output; o++)
    if (!g_strcmp0(im->graph->output[o]->name, name))
      return -1;
  return g_array_index(c, int, 0);
}

const Onnx__NodeProto *onnx_node(Importer *im, int i)
{
  return i >= 0 ? im->graph->node[i] : NULL;
}

gboolean onnx_is_scalar_const(Importer *im, const char *name, double *value)
{
  Value *v = onnx_value_get(im, name);
  if (!v || v->kind != V_CONST || onnx_const_numel(v) != 1)
    return FALSE;
  if (value)
    *value = v->data[0];
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Constant arithmetic                                                                 */

gboolean onnx_all_const(Importer *im, const Onnx__NodeProto *n, int first, int last)
{
  for (int i = first; i <= last && (size_t)i < n->n_input; i++) {
    Value *v = onnx_value_get(im, n->input[i]);
    if (*n->input[i] && (!v || v->kind != V_CONST))
      return FALSE;
  }
  return TRUE;
}

/* Element-wise arithmetic on two constants, one of which may be a single value. */
gboolean onnx_const_binary(Importer *im, const Onnx__NodeProto *n, const char *op)
{
  Value *a = onnx_value_get(im, n->input[0]), *b = onnx_value_get(im, n->input[1]);
  int64_t na = onnx_const_numel(a), nb = onnx_const_numel(b);
  if (na != nb && na != 1 && nb != 1)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "constant operands of %" G_GINT64_FORMAT " and %"
                G_GINT64_FORMAT " values", na, nb);
  Value r = *(na >= nb ? a : b);
  r.is_int = a->is_int && b->is_int;
  for (int64_t i = 0; i < MAX(na, nb); i++) {
    double x = a->data[na == 1 ? 0 : i], y = b->data[nb == 1 ? 0 : i];
    double z = 0;
    if (!strcmp(op, "Add"))
      z = x + y;
    else if (!strcmp(op, "Sub"))
      z = x - y;
    else if (!strcmp(op, "Mul"))
      z = x * y;
    else if (!strcmp(op, "Div"))
      z = r.is_int ? (y != 0 ? floor(x / y) : 0) : x / y;
    else if (!strcmp(op, "Equal"))
      z = x == y;
    else if (!strcmp(op, "Max"))
      z = MAX(x, y);
    else if (!strcmp(op, "Min"))
      z = MIN(x, y);
    else if (!strcmp(op, "Pow"))
      z = pow(x, y);
    r.data[i] = z;
  }
  onnx_value_set(im, n->output[0], &r);
  return TRUE;
}


/* The operator types onnx_import_node() knows; --check lists the others. */
static const char *const supported_ops[] = {
  "Constant", "Identity", "Cast", "Shape", "Size", "Add", "Sub", "Mul", "Div", "Equal", "Max",
  "Min", "Unsqueeze", "Squeeze", "Concat", "Gather", "Slice", "Split", "Reshape", "Flatten",
  "Transpose", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Pad",
  "BatchNormalization", "LayerNormalization", "Gemm", "MatMul", "Relu", "Gelu", "Sigmoid",
  "Tanh", "Exp", "Erf", "Softmax", "Dropout", "Range", "ConstantOfShape", "Trilu", "Where",
  "Expand", "Not", "Neg", "Pow", "Sqrt", "Clip",
  /* Only inside RMSNorm (onnx_fuse_pointwise()), which --check, reading types, does not see. */
  "ReduceMean", "Reciprocal", NULL,
};

/* ---------------------------------------------------------------------------------- */
/* The file                                                                            */

static Onnx__ModelProto *read_model(const char *path, GError **error)
{
  g_autofree char *data = NULL;
  gsize len = 0;
  g_autoptr(GError) err = NULL;
  GStatBuf st;
  if (g_stat(path, &st) == 0 && (gsize)st.st_size > ONNX_MAX_BYTES) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s: %" G_GUINT64_FORMAT " bytes; the importer "
                "reads at most %" G_GSIZE_FORMAT " (export without the weights: "
                "export_params=False)", path, (guint64)st.st_size, ONNX_MAX_BYTES);
    return NULL;
  }
  if (!g_file_get_contents(path, &data, &len, &err)) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "cannot read the model: %s", err->message);
    return NULL;
  }
  Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, (const uint8_t *)data);
  if (!m || !m->graph) {
    if (m)
      onnx__model_proto__free_unpacked(m, NULL);
    g_set_error(error, SIM_ERROR, SIM_ERROR_PARSE, "%s: not an ONNX model (the bytes do not "
                "decode as an onnx.ModelProto with a graph)", path);
    return NULL;
  }
  /* The names the importer relies on: optional in the schema, never absent in a model. */
  const Onnx__GraphProto *gr = m->graph;
  const char *missing = NULL;
  size_t at = 0;
  for (size_t i = 0; i < gr->n_node && !missing; i++) {
    at = i;
    if (!gr->node[i]->op_type)
      missing = "node %zu has no op_type";
    for (size_t j = 0; j < gr->node[i]->n_attribute && !missing; j++)
      if (!gr->node[i]->attribute[j]->name)
        missing = "node %zu has an attribute without a name";
  }
  for (size_t i = 0; i < gr->n_output && !missing; i++)
    if (!gr->output[at = i]->name)
      missing = "graph output %zu has no name";
  for (size_t i = 0; i < gr->n_input && !missing; i++)
    if (!gr->input[at = i]->name)
      missing = "graph input %zu has no name";
  if (missing) {
    g_autofree char *what = g_strdup_printf(missing, at);
    g_set_error(error, SIM_ERROR, SIM_ERROR_PARSE, "%s: %s", path, what);
    onnx__model_proto__free_unpacked(m, NULL);
    return NULL;
  }
  return m;
}

/* Whether graph input @name is data rather than a weight that export_params=False left
 * as an input: it has a symbolic dimension, or a node takes it as its first input where
 * a weight never comes (weights come first only to Transpose, Gather, Identity, Cast, and
 * the arithmetic, concatenation and Expand that may take a learned tensor). */
static gboolean is_data_input(Importer *im, const char *name, gboolean symbolic)
{
  if (symbolic)
    return TRUE;
  static const char *const weight_first[] = { "Transpose", "Gather", "Identity", "Cast", "Add",
                                              "Mul", "Sub", "Div", "Concat", "Unsqueeze",
                                              "Reshape", "Slice", "Split", "Expand", NULL };
  GArray *c = g_hash_table_lookup(im->consumers, name);
  for (guint i = 0; c && i < c->len; i++) {
    const Onnx__NodeProto *n = im->graph->node[g_array_index(c, int, i)];
    if (n->n_input && !strcmp(n->input[0], name) && !g_strv_contains(weight_first, n->op_type))
      return TRUE;
  }
  return FALSE;
}

/* The graph inputs with their shapes; symbolic dimensions from the parameters. */
static gboolean bind_inputs(Importer *im)
{
  const Onnx__GraphProto *gr = im->graph;
  for (size_t i = 0; i < gr->n_initializer; i++) {
    Value v;
    if (!onnx_tensor_value(im, gr->initializer[i], &v, NULL))
      return FALSE;
    v.buffer = g_hash_table_contains(im->buffers, gr->initializer[i]->name);
    onnx_value_set(im, gr->initializer[i]->name, &v);
  }
  for (size_t i = 0; i < gr->n_input; i++) {
    const Onnx__ValueInfoProto *in = gr->input[i];
    if (onnx_value_get(im, in->name))
      continue;  /* an initializer, listed again as an input */
    g_autofree char *place = g_strdup_printf("input '%s'", in->name);
    const Onnx__TypeProto *tp = in->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type ||
        !tp->tensor_type->shape) {
      sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place,
                       "a graph input without a tensor shape is not supported");
      return FALSE;
    }
    const Onnx__TensorShapeProto *sp = tp->tensor_type->shape;
    if (sp->n_dim > SIM_MAX_DIMS) {
      sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place,
                       "%zu dimensions; at most %d are supported", sp->n_dim, SIM_MAX_DIMS);
      return FALSE;
    }
    Value v = { .kind = V_LEAF, .dtype = dtype_of(tp->tensor_type->elem_type),
                .buffer = g_hash_table_contains(im->buffers, in->name) };
    v.shape.ndim = (int)sp->n_dim;
    gboolean symbolic = FALSE;
    for (size_t d = 0; d < sp->n_dim; d++) {
      const Onnx__TensorShapeProto__Dimension *dim = sp->dim[d];
      if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
          dim->dim_value > 0) {
        v.shape.dims[d] = dim->dim_value;
        continue;
      }
      const char *sym = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                          ? dim->dim_param : NULL;
      int64_t val = 0;
      if (!sym || !*sym) {
        sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place,
                         "dimension %zu has neither a size nor a name", d);
        return FALSE;
      }
      if (!im->params || !sim_model_params_lookup(im->params, sym, &val)) {
        sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place,
                         "dimension %zu is the symbol '%s'; give its size with --param %s=N",
                         d, sym, sym);
        return FALSE;
      }
      g_hash_table_add(im->used_params, g_strdup(sym));
      symbolic = TRUE;
      v.shape.dims[d] = val;
      if (!strcmp(sym, "seq") || !strcmp(sym, "sequence") || !strcmp(sym, "seq_len") ||
          !strcmp(sym, "sequence_length"))
        im->tokens = val;
    }
    onnx_value_set(im, in->name, &v);
    if (is_data_input(im, in->name, symbolic)) {
      int t = sim_graph_input(im->g, in->name, v.dtype, v.shape.ndim, v.shape.dims);
      if (t < 0) {
        g_autoptr(GError) err = NULL;
        sim_graph_check(im->g, &err);
        sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place, "%s",
                         err ? err->message : "cannot be an input");
        return FALSE;
      }
      onnx_set_tensor(im, in->name, t);
    }
  }
  return TRUE;
}

static void free_array(gpointer p)
{
  g_array_unref(p);
}

SimGraph *sim_onnx_import(const char *path, const SimModelParams *params, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  Onnx__ModelProto *m = read_model(path, error);
  if (!m)
    return NULL;
  const Onnx__GraphProto *gr = m->graph;
  g_autofree char *base = g_path_get_basename(path);
  if (g_str_has_suffix(base, ".onnx"))
    base[strlen(base) - 5] = '\0';
  Importer im = {
    .filename = path,
    .graph = gr,
    .g = sim_graph_new(base),
    .values = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free),
    .consumers = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, free_array),
    .skip = g_new0(gboolean, MAX(gr->n_node, 1)),
    .params = params,
    .used_params = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
    .tokens = 1,
    .buffers = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
    .error = error,
  };
  /* tools/torch2parasol.py names the module's buffers, which a file cannot tell from
   * parameters when both are graph inputs or initializers. */
  for (size_t i = 0; i < m->n_metadata_props; i++)
    if (!g_strcmp0(m->metadata_props[i]->key, "parasol.buffers") &&
        m->metadata_props[i]->value) {
      g_auto(GStrv) names = g_strsplit(m->metadata_props[i]->value, ",", -1);
      for (char **it = names; *it; it++)
        if (**it)
          g_hash_table_add(im.buffers, g_strdup(*it));
    }
  for (size_t i = 0; i < gr->n_node; i++)
    for (size_t j = 0; j < gr->node[i]->n_input; j++) {
      const char *name = gr->node[i]->input[j];
      if (!*name)
        continue;
      GArray *c = g_hash_table_lookup(im.consumers, name);
      if (!c) {
        c = g_array_new(FALSE, FALSE, sizeof(int));
        g_hash_table_insert(im.consumers, (gpointer)name, c);
      }
      int k = (int)i;
      if (c->len == 0 || g_array_index(c, int, c->len - 1) != k)
        g_array_append_val(c, k);
    }
  gboolean ok = bind_inputs(&im);
  if (ok && params) {
    g_auto(GStrv) names = sim_model_params_names(params);
    for (char **it = names; ok && *it; it++)
      if (!g_hash_table_contains(im.used_params, *it)) {
        GString *syms = g_string_new(NULL);
        GHashTableIter hi;
        gpointer key;
        g_hash_table_iter_init(&hi, im.used_params);
        while (g_hash_table_iter_next(&hi, &key, NULL))
          g_string_append_printf(syms, "%s%s", syms->len ? ", " : "", (char *)key);
        sim_set_error_at(error, SIM_ERROR_INVALID, path, NULL,
                         "--param %s: the model's inputs have no symbolic dimension of that "
                         "name (%s%s)", *it, syms->len ? "they have: " : "they have none",
                         syms->str);
        g_string_free(syms, TRUE);
        ok = FALSE;
      }
  }
  /* Constants first: folding a pattern looks at constants of nodes further on. */
  for (size_t i = 0; ok && i < gr->n_node; i++)
    if (!strcmp(gr->node[i]->op_type, "Constant")) {
      ok = onnx_import_node(&im, (int)i);
      im.skip[i] = TRUE;
    }
  /* Scopes that hold an attention module's packed projection weight. */
  g_autoptr(GHashTable) attention = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (size_t i = 0; i < gr->n_node; i++)
    for (size_t j = 0; j < gr->node[i]->n_input; j++)
      if (g_str_has_suffix(gr->node[i]->input[j], "in_proj_weight")) {
        char *scope = onnx_scope_of(gr->node[i]);
        if (scope)
          g_hash_table_add(attention, scope);
      }
  for (size_t i = 0; ok && i < gr->n_node; i++) {
    if (im.skip[i])
      continue;
    g_autofree char *scope = onnx_scope_of(gr->node[i]);
    gboolean fused = FALSE;
    if (scope && g_hash_table_contains(attention, scope)) {
      ok = onnx_fuse_attention(&im, (int)i, &fused);
      g_hash_table_remove(attention, scope);
    }
    if (ok && !fused)
      ok = onnx_import_node(&im, (int)i);
  }
  if (ok && sim_graph_n_ops(im.g) == 0) {
    sim_set_error_at(error, SIM_ERROR_INVALID, path, NULL, "the model has no "
                     "operators parasol models");
    ok = FALSE;
  }
  if (ok)
    sim_graph_set_tokens_per_sample(im.g, im.tokens);
  g_hash_table_unref(im.values);
  g_hash_table_unref(im.consumers);
  g_hash_table_unref(im.used_params);
  g_hash_table_unref(im.buffers);
  g_free(im.skip);
  onnx__model_proto__free_unpacked(m, NULL);
  if (!ok) {
    sim_graph_free(im.g);
    return NULL;
  }
  return im.g;
}

char **sim_onnx_check(const char *path, GError **error)
{
  g_return_val_if_fail(path != NULL, NULL);
  Onnx__ModelProto *m = read_model(path, error);
  if (!m)
    return NULL;
  g_autoptr(GPtrArray) lines = g_ptr_array_new();
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
  for (size_t i = 0; i < m->graph->n_node; i++) {
    const Onnx__NodeProto *n = m->graph->node[i];
    gboolean known = !n->domain || !*n->domain || !strcmp(n->domain, "ai.onnx");
    known = known && g_strv_contains(supported_ops, n->op_type);
    if (known || !g_hash_table_add(seen, n->op_type))
      continue;
    int count = 0;
    for (size_t j = i; j < m->graph->n_node; j++)
      count += !strcmp(m->graph->node[j]->op_type, n->op_type);
    g_ptr_array_add(lines, g_strdup_printf("%s%s%s: %d node%s, the first '%s'",
                                           n->domain && *n->domain ? n->domain : "",
                                           n->domain && *n->domain ? "." : "", n->op_type, count,
                                           count == 1 ? "" : "s", n->name ? n->name : ""));
  }
  g_ptr_array_add(lines, NULL);
  onnx__model_proto__free_unpacked(m, NULL);
  return (char **)g_ptr_array_free(g_steal_pointer(&lines), FALSE);
}

gboolean sim_onnx_available(void)
{
  return TRUE;
}

#else /* !PARASOL_HAVE_ONNX */

static void no_onnx(const char *path, GError **error)
{
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID, "%s: this parasol was built without ONNX "
              "support (it needs protobuf-c and onnx.proto: Debian's libprotobuf-c-dev, "
              "protobuf-c-compiler and libonnx-dev)", path);
}

SimGraph *sim_onnx_import(const char *path, const SimModelParams *params, GError **error)
{
  no_onnx(path, error);
  return NULL;
}

char **sim_onnx_check(const char *path, GError **error)
{
  no_onnx(path, error);
  return NULL;
}

gboolean sim_onnx_available(void)
{
  return FALSE;
}

#endif
