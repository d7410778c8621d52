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
 * one GELU (fuse_pointwise()); a SwiGLU MLP becomes one gated_mlp (fuse_swiglu()); Pad before a pooling or convolution becomes its padding;
 * Flatten is a reshape; GlobalAveragePool a pooling over the whole image; Clip to [0, 6]
 * a relu6; 1-D convolutions and poolings 1 x k windows between reshapes (as_2d());
 * a learned tensor used as data (a ViT's class token) an embedding of its rows
 * (learned_tensor()); Expand of a computed tensor copies joined by a concat; masks and
 * positions computed from constants are inputs of their shape.  An operator outside
 * this mapping is an error that names the node and its type; sim_onnx_check() lists the
 * operator types the importer does not know (docs/import.md). */
#include "sim-private.h"

#include "parasol-config.h"

#include <glib/gstdio.h>

#include <math.h>
#include <string.h>

#if PARASOL_HAVE_ONNX

#include "onnx.pb-c.h"

/* The largest ONNX file read: models with their weights inside can be large, but the
 * importer keeps the whole file and its decoded form in memory. */
#define ONNX_MAX_BYTES ((gsize)2 << 30)
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

static gboolean fail(Importer *im, const Onnx__NodeProto *n, int code, const char *fmt, ...)
  G_GNUC_PRINTF(4, 5);

static gboolean fail(Importer *im, const Onnx__NodeProto *n, int code, const char *fmt, ...)
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

static Value *value_get(Importer *im, const char *name)
{
  return name && *name ? g_hash_table_lookup(im->values, name) : NULL;
}

static void value_set(Importer *im, const char *name, const Value *v)
{
  if (!name || !*name)
    return;
  g_hash_table_replace(im->values, g_strdup(name), g_memdup2(v, sizeof *v));
}

static void set_tensor(Importer *im, const char *name, int tensor)
{
  Value v = { .kind = V_TENSOR, .tensor = tensor };
  value_set(im, name, &v);
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

static gboolean is_int_type(int32_t t)
{
  return t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ||
         t == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 || t == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8 ||
         t == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT16;
}

/* A TensorProto as a value: a constant when it is small and its data is inside the file,
 * a leaf otherwise. */
static gboolean tensor_value(Importer *im, const Onnx__TensorProto *t, Value *v,
                             const Onnx__NodeProto *n)
{
  memset(v, 0, sizeof *v);
  if (t->n_dims > SIM_MAX_DIMS)
    return fail(im, n, SIM_ERROR_INVALID, "tensor '%s' has %zu dimensions; at most %d are "
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
  if (!external && numel <= CONST_MAX && (is_int_type(dt) || numel <= 1)) {
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
    v->is_int = is_int_type(dt);
  } else {
    v->kind = V_LEAF;
  }
  return TRUE;
}

static int64_t const_numel(const Value *v)
{
  return sim_shape_numel(&v->shape);
}

/* The constant @name as integers, or FALSE with an error. */
static gboolean const_ints(Importer *im, const Onnx__NodeProto *n, int input, int64_t *out,
                           int *count, int max)
{
  const char *name = (size_t)input < n->n_input ? n->input[input] : NULL;
  Value *v = value_get(im, name);
  if (!v || v->kind != V_CONST)
    return fail(im, n, SIM_ERROR_INVALID,
                "input %d ('%s') must be a constant known at import time (a shape, axes or "
                "sizes), found %s", input, name ? name : "",
                !v ? "nothing" : v->kind == V_LEAF ? "a graph input or weight" : "a computed "
                "tensor");
  int64_t k = const_numel(v);
  if (k > max)
    return fail(im, n, SIM_ERROR_INVALID, "input %d has %" G_GINT64_FORMAT " values; at most "
                "%d expected", input, k, max);
  /* INT64_MAX ("to the end") does not survive a double: clamped far past any size. */
  for (int64_t i = 0; i < k; i++)
    out[i] = (int64_t)llround(CLAMP(v->data[i], -4611686018427387904.0, 4611686018427387904.0));
  *count = (int)k;
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Attributes                                                                          */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
  for (size_t i = 0; i < n->n_attribute; i++)
    if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name))
      return n->attribute[i];
  return NULL;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_i ? a->i : dflt;
}

static double attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
  const Onnx__AttributeProto *a = attr(n, name);
  return a && a->has_f ? a->f : dflt;
}

/* An ints attribute; returns its length (0 when absent). */
static int attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int max)
{
  const Onnx__AttributeProto *a = attr(n, name);
  if (!a)
    return 0;
  int k = (int)MIN(a->n_ints, (size_t)max);
  for (int i = 0; i < k; i++)
    out[i] = a->ints[i];
  return k;
}

static const char *attr_string(const Onnx__NodeProto *n, const char *name, char *buf, gsize size)
{
  const Onnx__AttributeProto *a = attr(n, name);
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
static char *op_name(Importer *im, const Onnx__NodeProto *n, int index, const char *suffix)
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
static gboolean built(Importer *im, const Onnx__NodeProto *n, int t)
{
  if (t >= 0)
    return TRUE;
  g_autoptr(GError) err = NULL;
  sim_graph_check(im->g, &err);
  return fail(im, n, SIM_ERROR_INVALID, "%s", err ? err->message : "cannot be built");
}

/* Whether leaf @v is a learned tensor: neither computed from constants nor a buffer. */
static gboolean is_learned(const Value *v)
{
  return v->kind == V_LEAF && !v->data_only && !v->buffer;
}

/* An op name not yet taken, from @name. */
static char *free_name(Importer *im, const char *name)
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
static int learned_tensor(Importer *im, const Onnx__NodeProto *n, const char *name,
                          const Value *v, const SimShape *lead)
{
  int64_t rows = 1, width = v->shape.ndim ? v->shape.dims[v->shape.ndim - 1] : 1;
  for (int d = 0; d + 1 < v->shape.ndim; d++)
    rows *= v->shape.dims[d];
  if (lead->ndim + 1 > SIM_MAX_DIMS) {
    fail(im, n, SIM_ERROR_INVALID, "learned tensor '%s' has too many dimensions", name);
    return -1;
  }
  g_autofree char *base = g_strdup_printf("%s/rows", name);
  g_autofree char *ids_name = free_name(im, base);
  int ids = sim_graph_input(im->g, ids_name, SIM_DTYPE_INT64, lead->ndim, lead->dims);
  if (!built(im, n, ids))
    return -1;
  g_autofree char *oname = free_name(im, name);
  int t = sim_graph_embedding(im->g, oname, ids, rows, width);
  if (!built(im, n, t))
    return -1;
  return t;
}

/* Input @i of node @n as a tensor of the graph: a leaf used as data becomes an input op,
 * or an embedding if it is learned (learned_tensor()). */
static gboolean tensor_of(Importer *im, const Onnx__NodeProto *n, int i, int *out)
{
  const char *name = (size_t)i < n->n_input ? n->input[i] : NULL;
  Value *v = value_get(im, name);
  if (!v)
    return fail(im, n, SIM_ERROR_INVALID, "input %d ('%s') is not made by an earlier node", i,
                name ? name : "");
  if (v->kind == V_TENSOR) {
    if (v->pad[0] || v->pad[1])
      return fail(im, n, SIM_ERROR_INVALID, "input '%s' is padded (Pad), which only a "
                  "convolution or pooling can take", name);
    *out = v->tensor;
    return TRUE;
  }
  if (v->kind == V_CONST && v->shape.ndim == 0)
    return fail(im, n, SIM_ERROR_INVALID, "input %d ('%s') is a scalar constant, which this "
                "operator cannot take as data", i, name);
  if (is_learned(v)) {
    SimShape lead = v->shape;
    lead.ndim = MAX(v->shape.ndim - 1, 1);
    if (v->shape.ndim <= 1)
      lead.dims[0] = 1;
    /* Added to (or joined with) a batch of samples, it is read once per sample, as its
     * broadcast is: the operator then splits over the samples as the others do. */
    for (size_t j = 0; v->shape.ndim >= 2 && v->shape.dims[0] == 1 && j < n->n_input; j++) {
      Value *o = (int)j == i ? NULL : value_get(im, n->input[j]);
      if (o && o->kind == V_TENSOR) {
        SimShape os = sim_graph_tensor_shape(im->g, o->tensor);
        if (os.ndim == v->shape.ndim && os.dims[0] > 1)
          lead.dims[0] = os.dims[0];
      }
    }
    int t = learned_tensor(im, n, name, v, &lead);
    if (t < 0)
      return FALSE;
    set_tensor(im, name, t);
    *out = t;
    return TRUE;
  }
  /* A constant used as data (positions, a mask) is an input of its shape: its values do
   * not change the work. */
  SimDType dtype = v->kind == V_CONST ? (v->is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32) : v->dtype;
  g_autofree char *oname = free_name(im, name);
  int t = sim_graph_input(im->g, oname, dtype, v->shape.ndim, v->shape.dims);
  if (!built(im, n, t))
    return FALSE;
  set_tensor(im, name, t);
  *out = t;
  return TRUE;
}

static SimShape shape_of(Importer *im, const Value *v)
{
  return v->kind == V_TENSOR ? sim_graph_tensor_shape(im->g, v->tensor) : v->shape;
}

/* The leaf (weight) input @i of @n, which must exist. */
static Value *leaf_input(Importer *im, const Onnx__NodeProto *n, int i, const char *what)
{
  const char *name = (size_t)i < n->n_input ? n->input[i] : NULL;
  Value *v = value_get(im, name);
  if (!v || v->kind != V_LEAF || v->data_only) {
    fail(im, n, SIM_ERROR_INVALID, "input %d ('%s', the %s) must be a weight: a graph input "
         "or an initializer, not a computed tensor", i, name ? name : "", what);
    return NULL;
  }
  return v;
}

/* The single node that consumes @name, or -1. */
static int sole_consumer(Importer *im, const char *name)
{
  GArray *c = name ? g_hash_table_lookup(im->consumers, name) : NULL;
  if (!c || c->len != 1)
    return -1;
  for (size_t o = 0; o < im->graph->n_output; o++)
    if (!g_strcmp0(im->graph->output[o]->name, name))
      return -1;
  return g_array_index(c, int, 0);
}

static const Onnx__NodeProto *node(Importer *im, int i)
{
  return i >= 0 ? im->graph->node[i] : NULL;
}

static gboolean is_scalar_const(Importer *im, const char *name, double *value)
{
  Value *v = value_get(im, name);
  if (!v || v->kind != V_CONST || const_numel(v) != 1)
    return FALSE;
  if (value)
    *value = v->data[0];
  return TRUE;
}

/* If @out feeds exactly a Relu, folds it: returns the name of the Relu's output. */
static const char *fold_relu(Importer *im, const char *out, SimUnaryKind *act)
{
  int c = sole_consumer(im, out);
  const Onnx__NodeProto *r = node(im, c);
  if (!r || strcmp(r->op_type, "Relu") != 0 || r->n_output < 1)
    return out;
  im->skip[c] = TRUE;
  *act = SIM_UNARY_RELU;
  return r->output[0];
}

/* GELU as PyTorch exports it without a Gelu operator: y = (x * (1 + erf(x / sqrt 2))) * 0.5
 * (or with the 0.5 first).  If @x feeds exactly that, marks its nodes folded and returns
 * the name of y. */
static const char *fold_gelu(Importer *im, const char *x)
{
  GArray *c = g_hash_table_lookup(im->consumers, x);
  if (!c || c->len != 2)
    return NULL;
  int div = -1, mul = -1;
  for (guint i = 0; i < 2; i++) {
    const Onnx__NodeProto *k = node(im, g_array_index(c, int, i));
    if (!strcmp(k->op_type, "Div") && k->n_input == 2 && !strcmp(k->input[0], x))
      div = g_array_index(c, int, i);
    else if (!strcmp(k->op_type, "Mul"))
      mul = g_array_index(c, int, i);
  }
  double s = 0;
  if (div < 0 || mul < 0 || !is_scalar_const(im, node(im, div)->input[1], &s) ||
      fabs(s - G_SQRT2) > 1e-4)
    return NULL;
  int erf = sole_consumer(im, node(im, div)->output[0]);
  if (!node(im, erf) || strcmp(node(im, erf)->op_type, "Erf") != 0)
    return NULL;
  int add = sole_consumer(im, node(im, erf)->output[0]);
  const Onnx__NodeProto *a = node(im, add);
  double one = 0;
  if (!a || strcmp(a->op_type, "Add") != 0 || a->n_input != 2 ||
      !(is_scalar_const(im, a->input[0], &one) || is_scalar_const(im, a->input[1], &one)) ||
      one != 1.0)
    return NULL;
  const Onnx__NodeProto *m = node(im, mul);
  gboolean takes_add = FALSE;
  for (size_t i = 0; i < m->n_input; i++)
    takes_add = takes_add || !strcmp(m->input[i], a->output[0]);
  int last = -1;
  if (takes_add) {
    /* (x * (1 + erf)) * 0.5 */
    int half = sole_consumer(im, m->output[0]);
    const Onnx__NodeProto *h = node(im, half);
    double v = 0;
    if (!h || strcmp(h->op_type, "Mul") != 0 ||
        !(is_scalar_const(im, h->input[0], &v) || is_scalar_const(im, h->input[1], &v)) ||
        v != 0.5)
      return NULL;
    last = half;
  } else {
    /* (x * 0.5) * (1 + erf) */
    double v = 0;
    if (!(is_scalar_const(im, m->input[0], &v) || is_scalar_const(im, m->input[1], &v)) ||
        v != 0.5)
      return NULL;
    int prod = sole_consumer(im, m->output[0]);
    const Onnx__NodeProto *p = node(im, prod);
    if (!p || strcmp(p->op_type, "Mul") != 0 || sole_consumer(im, a->output[0]) != prod)
      return NULL;
    last = prod;
  }
  im->skip[div] = im->skip[erf] = im->skip[add] = im->skip[mul] = im->skip[last] = TRUE;
  return node(im, last)->output[0];
}

static char *scope_of(const Onnx__NodeProto *n);

/* A scalar that is known, or that a Constant node later in the file will make: patterns
 * are matched at their first node, before the constants they use are imported. */
static gboolean scalar_ahead(Importer *im, const char *name, double *value)
{
  if (is_scalar_const(im, name, value))
    return TRUE;
  if (!name || !*name || value_get(im, name))
    return FALSE;
  for (size_t i = 0; i < im->graph->n_node; i++) {
    const Onnx__NodeProto *k = im->graph->node[i];
    if (k->n_output < 1 || strcmp(k->output[0], name) != 0)
      continue;
    const Onnx__AttributeProto *a = strcmp(k->op_type, "Constant") ? NULL : attr(k, "value");
    if (a && a->t && a->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
      int64_t numel = 1;
      for (size_t d = 0; d < a->t->n_dims; d++)
        numel *= a->t->dims[d];
      if (numel != 1)
        return FALSE;
      if (a->t->n_float_data == 1)
        *value = a->t->float_data[0];
      else if (a->t->has_raw_data && a->t->raw_data.len == sizeof(float)) {
        float f;
        memcpy(&f, a->t->raw_data.data, sizeof f);
        *value = f;
      } else
        return FALSE;
      return TRUE;
    }
    if (a && a->t && a->t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE &&
        a->t->has_raw_data && a->t->raw_data.len == sizeof(double)) {
      memcpy(value, a->t->raw_data.data, sizeof *value);
      return TRUE;
    }
    if ((a = attr(k, "value_float")) && a->has_f) {
      *value = a->f;
      return TRUE;
    }
    return FALSE;
  }
  return FALSE;
}

/* For a node of two inputs one of which is @name: the other one, else NULL. */
static const char *other_input(const Onnx__NodeProto *n, const char *name)
{
  if (!n || n->n_input != 2)
    return NULL;
  return !strcmp(n->input[0], name) ? n->input[1] : !strcmp(n->input[1], name) ? n->input[0]
                                                                               : NULL;
}

/* The node that alone consumes @name if it is an @op, or -1; Cast and Identity nodes on
 * the way are stepped over and added to @set. */
static int next_op(Importer *im, const char *name, const char *op, int *set, int *ns)
{
  int c = sole_consumer(im, name);
  while (node(im, c) && node(im, c)->n_output == 1 && *ns < 16 &&
         (!strcmp(node(im, c)->op_type, "Cast") || !strcmp(node(im, c)->op_type, "Identity"))) {
    set[(*ns)++] = c;
    c = sole_consumer(im, node(im, c)->output[0]);
  }
  return node(im, c) && !strcmp(node(im, c)->op_type, op) && node(im, c)->n_output >= 1 ? c
                                                                                        : -1;
}

/* A node of @op that alone consumes @name and takes a scalar near @want with it. */
static int next_scaled(Importer *im, const char *name, const char *op, double want, int *set,
                       int *ns)
{
  int c = next_op(im, name, op, set, ns);
  double v = 0;
  const char *o = c >= 0 ? other_input(node(im, c), name) : NULL;
  if (!o || !scalar_ahead(im, o, &v) || fabs(v - want) > 1e-3 * fabs(want))
    return -1;
  set[(*ns)++] = c;
  return c;
}

/* Among the consumers of @x, the node x ** @power: Pow(x, power), or for 2 and 3 the
 * products Mul(x, x) and Mul(x, Mul(x, x)).  Adds its nodes to @set. */
static int power_of(Importer *im, const char *x, double power, int *set, int *ns)
{
  GArray *c = g_hash_table_lookup(im->consumers, x);
  for (guint i = 0; c && i < c->len; i++) {
    int k = g_array_index(c, int, i);
    const Onnx__NodeProto *p = node(im, k);
    double e = 0;
    if (!strcmp(p->op_type, "Pow") && p->n_input == 2 && !strcmp(p->input[0], x) &&
        scalar_ahead(im, p->input[1], &e) && e == power) {
      set[(*ns)++] = k;
      return k;
    }
    if (!strcmp(p->op_type, "Mul") && p->n_input == 2 && !strcmp(p->input[0], x) &&
        !strcmp(p->input[1], x)) {
      if (power == 2) {
        set[(*ns)++] = k;
        return k;
      }
      int m = next_op(im, p->output[0], "Mul", set, ns);
      const char *o = m >= 0 ? other_input(node(im, m), p->output[0]) : NULL;
      if (power == 3 && o && !strcmp(o, x)) {
        set[(*ns)++] = k;
        set[(*ns)++] = m;
        return m;
      }
    }
  }
  return -1;
}

/* GELU's tanh approximation as written out (GPT-2's gelu_new, and torch's
 * gelu(approximate="tanh") as exported):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).  Returns the node whose output is the
 * result, with every node of the pattern in @set, or -1. */
static int match_gelu_tanh(Importer *im, const char *x, int *set, int *ns)
{
  int cube = power_of(im, x, 3, set, ns);
  if (cube < 0)
    return -1;
  int k = next_scaled(im, node(im, cube)->output[0], "Mul", 0.044715, set, ns);
  int add = k >= 0 ? next_op(im, node(im, k)->output[0], "Add", set, ns) : -1;
  const char *o = add >= 0 ? other_input(node(im, add), node(im, k)->output[0]) : NULL;
  if (!o || strcmp(o, x) != 0)
    return -1;
  set[(*ns)++] = add;
  k = next_scaled(im, node(im, add)->output[0], "Mul", sqrt(2 / G_PI), set, ns);
  int th = k >= 0 ? next_op(im, node(im, k)->output[0], "Tanh", set, ns) : -1;
  if (th < 0)
    return -1;
  set[(*ns)++] = th;
  int one = next_scaled(im, node(im, th)->output[0], "Add", 1, set, ns);
  int fin = one >= 0 ? next_op(im, node(im, one)->output[0], "Mul", set, ns) : -1;
  o = fin >= 0 ? other_input(node(im, fin), node(im, one)->output[0]) : NULL;
  if (!o)
    return -1;
  set[(*ns)++] = fin;
  if (!strcmp(o, x)) /* (x (1 + tanh)) 0.5 */
    return next_scaled(im, node(im, fin)->output[0], "Mul", 0.5, set, ns);
  /* (0.5 x) (1 + tanh) */
  GArray *c = g_hash_table_lookup(im->consumers, x);
  for (guint i = 0; c && i < c->len; i++) {
    int h = g_array_index(c, int, i);
    double v = 0;
    const char *s = other_input(node(im, h), x);
    if (!strcmp(node(im, h)->op_type, "Mul") && !strcmp(node(im, h)->output[0], o) && s &&
        scalar_ahead(im, s, &v) && v == 0.5 && sole_consumer(im, o) == fin) {
      set[(*ns)++] = h;
      return fin;
    }
  }
  return -1;
}

/* RMSNorm as PyTorch implementations write it (LLaMA's):
 * weight * (x * rsqrt(mean(x^2, -1, keepdim) + eps)), the rsqrt exported as 1 / Sqrt or
 * Reciprocal(Sqrt), or x / sqrt(...).  Returns the node whose output is the result, with
 * every node in @set, or -1. */
static int match_rmsnorm(Importer *im, const char *x, SimShape xs, int *set, int *ns)
{
  int sq = power_of(im, x, 2, set, ns);
  int mean = sq >= 0 ? next_op(im, node(im, sq)->output[0], "ReduceMean", set, ns) : -1;
  if (mean < 0)
    return -1;
  const Onnx__NodeProto *m = node(im, mean);
  int64_t axes[2];
  int na = attr_ints(m, "axes", axes, 2);
  double a1 = 0;
  if (m->n_input > 1 && scalar_ahead(im, m->input[1], &a1)) {
    axes[0] = (int64_t)a1;
    na = 1;
  }
  if (na != 1 || attr_int(m, "keepdims", 1) != 1)
    return -1;
  set[(*ns)++] = mean;
  int add = next_op(im, m->output[0], "Add", set, ns);
  double eps = 0;
  const char *o = add >= 0 ? other_input(node(im, add), m->output[0]) : NULL;
  if (!o || !scalar_ahead(im, o, &eps))
    return -1;
  set[(*ns)++] = add;
  int root = next_op(im, node(im, add)->output[0], "Sqrt", set, ns);
  if (root < 0)
    return -1;
  set[(*ns)++] = root;
  const char *r = node(im, root)->output[0];
  int normed = -1;
  int d = next_op(im, r, "Div", set, ns);
  double v = 0;
  if (d >= 0 && !strcmp(node(im, d)->input[1], r) && !strcmp(node(im, d)->input[0], x)) {
    normed = d; /* x / sqrt */
  } else {
    int inv = d >= 0 && !strcmp(node(im, d)->input[1], r) &&
                  scalar_ahead(im, node(im, d)->input[0], &v) && v == 1
                ? d
                : next_op(im, r, "Reciprocal", set, ns);
    int mul = inv >= 0 ? next_op(im, node(im, inv)->output[0], "Mul", set, ns) : -1;
    o = mul >= 0 ? other_input(node(im, mul), node(im, inv)->output[0]) : NULL;
    if (!o || strcmp(o, x) != 0)
      return -1;
    set[(*ns)++] = inv;
    normed = mul;
  }
  set[(*ns)++] = normed;
  int w = next_op(im, node(im, normed)->output[0], "Mul", set, ns);
  o = w >= 0 ? other_input(node(im, w), node(im, normed)->output[0]) : NULL;
  Value *wv = o ? value_get(im, o) : NULL;
  if (!wv || wv->kind != V_LEAF || wv->data_only || wv->shape.ndim != 1 ||
      wv->shape.dims[0] != xs.dims[xs.ndim - 1] || (axes[0] != -1 && axes[0] != xs.ndim - 1))
    return -1;
  set[(*ns)++] = w;
  return w;
}

/* At a node that reads a tensor x: GELU's tanh approximation or RMSNorm written out
 * element by element from x become one operator (the nodes of the pattern are then
 * skipped).  *fused tells whether they did. */
static gboolean fuse_pointwise(Importer *im, int index, gboolean *fused)
{
  const Onnx__NodeProto *n = node(im, index);
  *fused = FALSE;
  for (size_t i = 0; i < n->n_input && i < 2; i++) {
    Value *xv = value_get(im, n->input[i]);
    if (!xv || xv->kind != V_TENSOR || xv->pad[0] || xv->pad[1])
      continue;
    const char *x = n->input[i];
    SimShape s = sim_graph_tensor_shape(im->g, xv->tensor);
    int set[32], ns = 0;
    int last = match_gelu_tanh(im, x, set, &ns);
    gboolean rms = FALSE;
    if (last < 0) {
      ns = 0;
      last = match_rmsnorm(im, x, s, set, &ns);
      rms = last >= 0;
    }
    if (last < 0)
      continue;
    gboolean mine = FALSE;
    for (int k = 0; k < ns; k++)
      mine = mine || set[k] == index;
    if (!mine)
      continue;
    g_autofree char *scope = scope_of(n);
    g_autofree char *base = g_strdup_printf("%s%s%s", scope ? scope + (scope[0] == '/') : "",
                                            scope ? "/" : "", rms ? "rmsnorm" : "gelu");
    g_autofree char *name = g_strdup(base);
    for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
      g_free(name);
      name = g_strdup_printf("%s#%d", base, k);
    }
    int t = rms ? sim_graph_rmsnorm(im->g, name, xv->tensor)
                : sim_graph_unary(im->g, name, xv->tensor, SIM_UNARY_GELU);
    if (!built(im, n, t))
      return FALSE;
    for (int k = 0; k < ns; k++)
      im->skip[set[k]] = TRUE;
    set_tensor(im, node(im, last)->output[0], t);
    *fused = TRUE;
    return TRUE;
  }
  return TRUE;
}

/* The shape of the 2-D weight @name, also where a Transpose later in the file makes it from
 * a graph input or initializer (PyTorch transposes a Linear's weight next to its MatMul). */
static gboolean weight_ahead(Importer *im, const char *name, SimShape *shape)
{
  Value *v = value_get(im, name);
  if (v)
    return v->kind == V_LEAF && !v->data_only && v->shape.ndim == 2 && (*shape = v->shape, TRUE);
  for (size_t i = 0; name && i < im->graph->n_node; i++) {
    const Onnx__NodeProto *k = im->graph->node[i];
    if (k->n_output < 1 || strcmp(k->output[0], name) != 0)
      continue;
    Value *w = k->n_input == 1 && !strcmp(k->op_type, "Transpose") ? value_get(im, k->input[0])
                                                                    : NULL;
    if (!w || w->kind != V_LEAF || w->data_only || w->shape.ndim != 2)
      return FALSE;
    shape->ndim = 2;
    shape->dims[0] = w->shape.dims[1];
    shape->dims[1] = w->shape.dims[0];
    return TRUE;
  }
  return FALSE;
}

/* A SwiGLU MLP as PyTorch implementations write it, w2(silu(w1(x)) * w3(x)) with linears
 * without bias (exported as MatMul, Sigmoid, Mul, MatMul, Mul, MatMul), at its first
 * MatMul @index: one gated_mlp operator as the zoo's LLaMA has it (sim/ops/), with the
 * same three weights.  *fused tells whether the nodes formed it. */
static gboolean fuse_swiglu(Importer *im, int index, int x, gboolean *fused)
{
  const Onnx__NodeProto *n = node(im, index);
  *fused = FALSE;
  Value *w1 = value_get(im, n->input[1]);
  const char *h = n->output[0];
  GArray *c = g_hash_table_lookup(im->consumers, h);
  if (!w1 || w1->kind != V_LEAF || w1->data_only || w1->shape.ndim != 2 || !c || c->len != 2)
    return TRUE;
  int sig = -1, m1 = -1;
  for (guint i = 0; i < 2; i++) {
    int k = g_array_index(c, int, i);
    if (!strcmp(node(im, k)->op_type, "Sigmoid"))
      sig = k;
    else if (!strcmp(node(im, k)->op_type, "Mul"))
      m1 = k;
  }
  const char *o = m1 >= 0 ? other_input(node(im, m1), h) : NULL;
  if (sig < 0 || !o || strcmp(o, node(im, sig)->output[0]) != 0 ||
      sole_consumer(im, o) != m1)
    return TRUE;
  int m2 = sole_consumer(im, node(im, m1)->output[0]);
  o = m2 >= 0 && !strcmp(node(im, m2)->op_type, "Mul")
        ? other_input(node(im, m2), node(im, m1)->output[0])
        : NULL;
  if (!o || sole_consumer(im, o) != m2)
    return TRUE;
  int up = -1;
  GArray *xc = g_hash_table_lookup(im->consumers, n->input[0]);
  for (guint i = 0; xc && i < xc->len; i++) {
    int k = g_array_index(xc, int, i);
    const Onnx__NodeProto *u = node(im, k);
    SimShape w3;
    if (!strcmp(u->op_type, "MatMul") && u->n_output == 1 && !strcmp(u->output[0], o) &&
        u->n_input == 2 && !strcmp(u->input[0], n->input[0]) &&
        weight_ahead(im, u->input[1], &w3) && sim_shape_equal(&w3, &w1->shape))
      up = k;
  }
  int down = sole_consumer(im, node(im, m2)->output[0]);
  const Onnx__NodeProto *d = node(im, down);
  SimShape w2;
  gboolean has_w2 = d && !strcmp(d->op_type, "MatMul") && d->n_input == 2 &&
                    d->n_output == 1 && !strcmp(d->input[0], node(im, m2)->output[0]) &&
                    weight_ahead(im, d->input[1], &w2);
  SimShape xs = sim_graph_tensor_shape(im->g, x);
  if (up < 0 || !has_w2 || w2.dims[0] != w1->shape.dims[1] ||
      w2.dims[1] != xs.dims[xs.ndim - 1] || w1->shape.dims[0] != xs.dims[xs.ndim - 1])
    return TRUE;
  g_autofree char *scope = scope_of(node(im, m2));
  g_autofree char *base = g_strdup_printf("%s%s%s", scope ? scope + (scope[0] == '/') : "",
                                          scope ? "/" : "", "gated_mlp");
  g_autofree char *name = g_strdup(base);
  for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
    g_free(name);
    name = g_strdup_printf("%s#%d", base, k);
  }
  int t = sim_graph_gated_mlp(im->g, name, x, w1->shape.dims[1], SIM_UNARY_SILU);
  if (!built(im, n, t))
    return FALSE;
  im->skip[index] = im->skip[sig] = im->skip[m1] = im->skip[m2] = im->skip[up] = TRUE;
  im->skip[down] = TRUE;
  set_tensor(im, d->output[0], t);
  *fused = TRUE;
  return TRUE;
}

/* A linear over the last dimension of input 0 with weight [k, n] (MatMul) or from Gemm;
 * a following Add of a one-dimensional weight of n values is its bias, a following Relu
 * or GELU its activation. */
static gboolean emit_linear(Importer *im, const Onnx__NodeProto *n, int index, int x,
                            int64_t out_features, gboolean bias)
{
  const char *out = n->output[0];
  if (!bias) {
    int c = sole_consumer(im, out);
    const Onnx__NodeProto *a = node(im, c);
    if (a && !strcmp(a->op_type, "Add") && a->n_input == 2) {
      const char *other = !strcmp(a->input[0], out) ? a->input[1] : a->input[0];
      Value *b = value_get(im, other);
      if (b && b->kind == V_LEAF && b->shape.ndim == 1 && b->shape.dims[0] == out_features) {
        bias = TRUE;
        im->skip[c] = TRUE;
        out = a->output[0];
      }
    }
  }
  SimUnaryKind act = SIM_UNARY_IDENTITY;
  const char *after = fold_relu(im, out, &act);
  if (act == SIM_UNARY_IDENTITY) {
    const char *g = fold_gelu(im, out);
    if (g) {
      act = SIM_UNARY_GELU;
      after = g;
    }
  }
  g_autofree char *name = op_name(im, n, index, NULL);
  int t = sim_graph_linear(im->g, name, x, out_features, bias, act);
  if (!built(im, n, t))
    return FALSE;
  set_tensor(im, after, t);
  return TRUE;
}

/* Padding of a Conv or pooling: "pads" [top, left, bottom, right] must be symmetric, plus
 * what a Pad before it left on the input. */
static gboolean spatial_attrs(Importer *im, const Onnx__NodeProto *n, Value *in, int kernel[2],
                              int stride[2], int pad[2], int dilation[2])
{
  int64_t k[4] = { 0 }, s[4] = { 1, 1 }, p[8] = { 0 }, d[4] = { 1, 1 };
  char buf[32];
  const char *auto_pad = attr_string(n, "auto_pad", buf, sizeof buf);
  if (auto_pad && strcmp(auto_pad, "NOTSET") != 0)
    return fail(im, n, SIM_ERROR_INVALID, "auto_pad %s is not supported; export with explicit "
                "pads", auto_pad);
  int nk = attr_ints(n, "kernel_shape", k, 4);
  gboolean one = in->kind == V_TENSOR && sim_graph_tensor_shape(im->g, in->tensor).ndim == 3;
  if (kernel && nk != (one ? 1 : 2) && nk != 0)
    return fail(im, n, SIM_ERROR_INVALID, "a %d-dimensional kernel over a tensor of rank %d; "
                "only 1-D and 2-D are supported", nk, one ? 3 : 4);
  attr_ints(n, "strides", s, 4);
  int np = attr_ints(n, "pads", p, 8);
  attr_ints(n, "dilations", d, 4);
  if (one) {
    /* A 1-D window over [n, c, length] is a 1 x k window over [n, c, 1, length]. */
    if (np == 2 && p[0] != p[1])
      return fail(im, n, SIM_ERROR_INVALID, "asymmetric pads [%" G_GINT64_FORMAT ", %"
                  G_GINT64_FORMAT "] are not supported", p[0], p[1]);
    k[1] = k[0], k[0] = 1;
    s[1] = s[0], s[0] = 1;
    p[1] = p[3] = p[0], p[0] = p[2] = 0;
    d[1] = d[0], d[0] = 1;
    np = 4;
  }
  if (np == 4 && (p[0] != p[2] || p[1] != p[3]))
    return fail(im, n, SIM_ERROR_INVALID, "asymmetric pads [%" G_GINT64_FORMAT ", %"
                G_GINT64_FORMAT ", %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "] are not "
                "supported", p[0], p[1], p[2], p[3]);
  for (int i = 0; i < 2; i++) {
    if (kernel)
      kernel[i] = (int)k[i];
    stride[i] = (int)s[i];
    pad[i] = (int)p[i] + in->pad[i];
    if (dilation)
      dilation[i] = (int)d[i];
  }
  return TRUE;
}

/* A tensor [n, c, length] as [n, c, 1, length] for the 2-D operators (Conv1d,
 * MaxPool1d); 4-D tensors pass unchanged.  -1 on error. */
static int as_2d(Importer *im, const Onnx__NodeProto *n, int index, int x)
{
  SimShape s = sim_graph_tensor_shape(im->g, x);
  if (s.ndim == 4)
    return x;
  if (s.ndim != 3) {
    fail(im, n, SIM_ERROR_INVALID, "the input has rank %d; 1-D and 2-D windows take [n, c, "
         "length] or [n, c, h, w]", s.ndim);
    return -1;
  }
  g_autofree char *name = op_name(im, n, index, "/2d");
  int t = sim_graph_reshape(im->g, name, x, 4,
                            (int64_t[]){ s.dims[0], s.dims[1], 1, s.dims[2] });
  return built(im, n, t) ? t : -1;
}

/* The output @y of a 2-D operator back to [n, c, length] where its input @x had rank 3. */
static int from_2d(Importer *im, const Onnx__NodeProto *n, int index, int x, int y)
{
  if (y < 0 || sim_graph_tensor_shape(im->g, x).ndim == 4)
    return y;
  SimShape s = sim_graph_tensor_shape(im->g, y);
  g_autofree char *name = op_name(im, n, index, "/1d");
  int t = sim_graph_reshape(im->g, name, y, 3, (int64_t[]){ s.dims[0], s.dims[1], s.dims[3] });
  return built(im, n, t) ? t : -1;
}

static gboolean padded_tensor(Importer *im, const Onnx__NodeProto *n, Value **v)
{
  *v = value_get(im, n->n_input ? n->input[0] : NULL);
  if (*v && (*v)->kind == V_TENSOR)
    return TRUE;
  int t;
  if (!tensor_of(im, n, 0, &t))
    return FALSE;
  *v = value_get(im, n->input[0]);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* Constant arithmetic                                                                 */

static gboolean all_const(Importer *im, const Onnx__NodeProto *n, int first, int last)
{
  for (int i = first; i <= last && (size_t)i < n->n_input; i++) {
    Value *v = value_get(im, n->input[i]);
    if (*n->input[i] && (!v || v->kind != V_CONST))
      return FALSE;
  }
  return TRUE;
}

/* Element-wise arithmetic on two constants, one of which may be a single value. */
static gboolean const_binary(Importer *im, const Onnx__NodeProto *n, const char *op)
{
  Value *a = value_get(im, n->input[0]), *b = value_get(im, n->input[1]);
  int64_t na = const_numel(a), nb = const_numel(b);
  if (na != nb && na != 1 && nb != 1)
    return fail(im, n, SIM_ERROR_INVALID, "constant operands of %" G_GINT64_FORMAT " and %"
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
  value_set(im, n->output[0], &r);
  return TRUE;
}

/* ---------------------------------------------------------------------------------- */
/* The operators                                                                       */

/* ---------------------------------------------------------------------------------- */
/* PyTorch's multi-head attention                                                      */

/* The scope of a node's name: "/layers.0/self_attn/MatMul" is in "/layers.0/self_attn". */
static char *scope_of(const Onnx__NodeProto *n)
{
  const char *slash = n->name ? strrchr(n->name, '/') : NULL;
  return slash && slash != n->name ? g_strndup(n->name, slash - n->name) : NULL;
}

static gboolean in_scope(const Onnx__NodeProto *n, const char *scope)
{
  gsize k = strlen(scope);
  return n->name && !strncmp(n->name, scope, k) && n->name[k] == '/';
}

/* torch.nn.MultiheadAttention as torch.onnx.export writes it (its nodes named under the
 * module's scope, its weights in_proj_weight [3E, E], in_proj_bias, out_proj.weight and
 * out_proj.bias) becomes one attention operator, as the zoo's transformers have it
 * (sim/ops/attention.c): the same weights, and the batch stays dimension 0 where the
 * export transposes it away inside the module.  A square mask [S, S] is taken as causal.
 * Returns FALSE with no error when the nodes at @index do not form that module (they are
 * then imported one by one), FALSE with an error when building fails. */
static gboolean fuse_attention(Importer *im, int index, gboolean *fused)
{
  *fused = FALSE;
  const Onnx__GraphProto *gr = im->graph;
  g_autofree char *scope = scope_of(gr->node[index]);
  if (!scope)
    return TRUE;
  int64_t E = 0, heads = 0;
  gboolean bias = FALSE, out_w = FALSE;
  double dropout = 0;
  GHashTable *made = g_hash_table_new(g_str_hash, g_str_equal);
  GPtrArray *data = g_ptr_array_new();
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t o = 0; o < n->n_output; o++)
      g_hash_table_add(made, n->output[o]);
  }
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t j = 0; j < n->n_input; j++) {
      const char *in = n->input[j];
      if (!*in || g_hash_table_contains(made, in))
        continue;
      Value *v = value_get(im, in);
      if (!v) {
        /* Made inside an attention module fused before this one, which PyTorch's export
         * shares: the keys transposed to [s, b, E] (here the batch-first tensor they came
         * from), or shape arithmetic (not needed). */
        const Onnx__NodeProto *p = NULL;
        for (size_t k = 0; k < (size_t)index && !p; k++)
          for (size_t o = 0; o < gr->node[k]->n_output; o++)
            if (!strcmp(gr->node[k]->output[o], in))
              p = gr->node[k];
        int64_t perm[4];
        if (!p || strcmp(p->op_type, "Transpose") != 0 || attr_ints(p, "perm", perm, 4) != 3 ||
            perm[0] != 1 || perm[1] != 0 || perm[2] != 2)
          continue;
        in = p->input[0];
        v = value_get(im, in);
        if (!v || v->kind != V_TENSOR)
          goto out;
      }
      if (v->kind == V_LEAF && !v->data_only) {
        if (g_str_has_suffix(in, "in_proj_weight") && v->shape.ndim == 2 &&
            v->shape.dims[0] == 3 * v->shape.dims[1])
          E = v->shape.dims[1];
        else if (g_str_has_suffix(in, "in_proj_bias"))
          bias = TRUE;
        else if (g_str_has_suffix(in, "out_proj.weight"))
          out_w = TRUE;
        else if (!g_str_has_suffix(in, "out_proj.bias"))
          goto out;  /* separate q, k, v weights, or something else */
      } else if (v->kind == V_TENSOR || v->kind == V_LEAF) {
        gboolean seen = FALSE;
        for (guint k = 0; k < data->len; k++)
          seen = seen || !strcmp(data->pdata[k], in);
        if (!seen)
          g_ptr_array_add(data, (gpointer)in);
      } else if (v->kind == V_CONST && const_numel(v) > 1 && v->shape.ndim == 2) {
        g_ptr_array_add(data, (gpointer)in);
      }
    }
    double c = 0;
    if (!strcmp(n->op_type, "Div") && n->n_input == 2 && is_scalar_const(im, n->input[1], &c) &&
        value_get(im, n->input[1])->is_int && heads == 0)
      heads = (int64_t)c;
    if (!strcmp(n->op_type, "Dropout") && n->n_input > 1 && *n->input[1])
      is_scalar_const(im, n->input[1], &dropout);
  }
  if (E <= 0 || !out_w || heads <= 0 || E % heads != 0)
    goto out;
  /* The module's output: of what its nodes make and later nodes read, what its last node
   * makes (the others are shape arithmetic PyTorch shares between modules). */
  const char *result = NULL;
  int result_node = -1;
  for (size_t i = index; i < gr->n_node; i++) {
    const Onnx__NodeProto *n = gr->node[i];
    if (!in_scope(n, scope))
      continue;
    for (size_t o = 0; o < n->n_output; o++) {
      gboolean read = FALSE;
      for (size_t k = 0; k < gr->n_output && !read; k++)
        read = !g_strcmp0(gr->output[k]->name, n->output[o]);
      GArray *c = g_hash_table_lookup(im->consumers, n->output[o]);
      for (guint k = 0; c && k < c->len && !read; k++)
        read = !in_scope(gr->node[g_array_index(c, int, k)], scope);
      if (read && (int)i > result_node) {
        result = n->output[o];
        result_node = (int)i;
      }
    }
  }
  if (!result || strcmp(gr->node[result_node]->op_type, "Constant") == 0)
    goto out;
  /* Queries, keys and values [b, s, E] in the order the module reads them; a square
   * [s, s] mask; a key padding mask [b, s_kv]. */
  int qkv[3], nq = 0;
  gboolean causal = FALSE;
  SimShape padding = { .ndim = 0 };
  for (guint k = 0; k < data->len; k++) {
    Value *v = value_get(im, data->pdata[k]);
    SimShape sh = shape_of(im, v);
    if (sh.ndim == 3 && sh.dims[2] == E && v->kind == V_TENSOR && nq < 3) {
      qkv[nq++] = v->tensor;
    } else if (sh.ndim == 2 && sh.dims[0] == sh.dims[1]) {
      causal = TRUE;
    } else if (sh.ndim == 2 && padding.ndim == 0) {
      padding = sh;
    } else {
      goto out;
    }
  }
  if (nq == 0)
    goto out;
  if (nq == 1)
    qkv[1] = qkv[2] = qkv[0];
  else if (nq == 2)
    qkv[2] = qkv[1];
  SimShape q = sim_graph_tensor_shape(im->g, qkv[0]), kv = sim_graph_tensor_shape(im->g, qkv[1]);
  if (q.dims[0] != kv.dims[0])
    goto out;
  /* A key padding mask hides keys of each sample; the kernels compute the scores of all
   * of them all the same, so the work is the unmasked attention's. */
  if (padding.ndim && (padding.dims[0] != q.dims[0] || padding.dims[1] != kv.dims[1]))
    goto out;
  if (causal && q.dims[1] != kv.dims[1])
    causal = FALSE;
  {
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_ATTENTION);
    sim_attrs_set_int(a, "heads", heads, NULL);
    sim_attrs_set_int(a, "head_dim", E / heads, NULL);
    sim_attrs_set_int(a, "causal", causal, NULL);
    sim_attrs_set_float(a, "dropout", dropout, NULL);
    sim_attrs_set_int(a, "bias", bias, NULL);
    g_autoptr(GError) err = NULL;
    g_autofree char *name = g_strdup(scope[0] == '/' && scope[1] ? scope + 1 : scope);
    for (int k = 2; sim_graph_op_by_name(im->g, name) >= 0; k++) {
      g_free(name);
      name = g_strdup_printf("%s#%d", scope[0] == '/' && scope[1] ? scope + 1 : scope, k);
    }
    int op = sim_graph_add_op(im->g, SIM_OP_ATTENTION, name, 3, qkv, a, &err);
    if (op < 0) {
      g_hash_table_unref(made);
      g_ptr_array_unref(data);
      return fail(im, gr->node[index], SIM_ERROR_INVALID, "%s", err->message);
    }
    set_tensor(im, result, sim_graph_op_output(im->g, op, 0));
  }
  for (size_t i = index; i < gr->n_node; i++)
    if (in_scope(gr->node[i], scope))
      im->skip[i] = TRUE;
  *fused = TRUE;
out:
  g_hash_table_unref(made);
  g_ptr_array_unref(data);
  return TRUE;
}

static gboolean import_node(Importer *im, int index)
{
  const Onnx__NodeProto *n = im->graph->node[index];
  const char *op = n->op_type;
  if (!op || !*op) {
    g_autofree char *place = g_strdup_printf("node %d", index);
    sim_set_error_at(im->error, SIM_ERROR_PARSE, im->filename, place, "no operator type");
    return FALSE;
  }
  if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx") != 0)
    return fail(im, n, SIM_ERROR_UNKNOWN, "operator of domain '%s' is not supported",
                n->domain);
  const char *out = n->n_output ? n->output[0] : NULL;
  Value *in0 = n->n_input ? value_get(im, n->input[0]) : NULL;
  if (n->n_input && *n->input[0] && !in0)
    return fail(im, n, SIM_ERROR_INVALID, "input '%s' is not made by an earlier node",
                n->input[0]);

  if (!strcmp(op, "Pow") || !strcmp(op, "Mul")) {
    gboolean fused = FALSE;
    if (!fuse_pointwise(im, index, &fused))
      return FALSE;
    if (fused)
      return TRUE;
  }
  if (!strcmp(op, "Constant")) {
    Value v = { 0 };
    const Onnx__AttributeProto *a = attr(n, "value");
    if (a && a->t) {
      if (!tensor_value(im, a->t, &v, n))
        return FALSE;
    } else if ((a = attr(n, "value_int")) || (a = attr(n, "value_float"))) {
      v.kind = V_CONST;
      v.is_int = a->has_i;
      v.data[0] = a->has_i ? (double)a->i : a->f;
    } else if ((a = attr(n, "value_ints"))) {
      v.kind = V_CONST;
      v.is_int = TRUE;
      v.shape.ndim = 1;
      v.shape.dims[0] = (int64_t)MIN(a->n_ints, (size_t)CONST_MAX);
      for (int64_t i = 0; i < v.shape.dims[0]; i++)
        v.data[i] = (double)a->ints[i];
    } else {
      return fail(im, n, SIM_ERROR_INVALID, "a Constant without a supported value attribute");
    }
    if (v.kind != V_CONST)
      return fail(im, n, SIM_ERROR_INVALID, "a Constant of %" G_GINT64_FORMAT " values; "
                  "large constants are not supported", sim_shape_numel(&v.shape));
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Identity") || (!strcmp(op, "Cast") && in0)) {
    Value v = *in0;
    if (!strcmp(op, "Cast") && v.kind == V_CONST) {
      int64_t to = attr_int(n, "to", 1);
      v.is_int = is_int_type((int32_t)to);
      if (v.is_int)
        for (int64_t i = 0; i < const_numel(&v); i++)
          v.data[i] = trunc(v.data[i]);
    }
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Shape")) {
    SimShape s = shape_of(im, in0);
    int64_t start = attr_int(n, "start", 0), end = attr_int(n, "end", s.ndim);
    if (start < 0)
      start += s.ndim;
    if (end < 0)
      end += s.ndim;
    start = CLAMP(start, 0, s.ndim);
    end = CLAMP(end, start, s.ndim);
    Value v = { .kind = V_CONST, .is_int = TRUE };
    v.shape.ndim = 1;
    v.shape.dims[0] = end - start;
    for (int64_t i = start; i < end; i++)
      v.data[i - start] = (double)s.dims[i];
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Size")) {
    SimShape s = shape_of(im, in0);
    Value v = { .kind = V_CONST, .is_int = TRUE };
    v.data[0] = (double)sim_shape_numel(&s);
    value_set(im, out, &v);
    return TRUE;
  }
  if ((!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") ||
       !strcmp(op, "Equal") || !strcmp(op, "Max") || !strcmp(op, "Min") || !strcmp(op, "Pow")) &&
      all_const(im, n, 0, 1))
    return const_binary(im, n, op);
  if ((!strcmp(op, "Sqrt") || !strcmp(op, "Neg")) && in0 && in0->kind == V_CONST) {
    Value v = *in0;
    for (int64_t i = 0; i < const_numel(&v); i++)
      v.data[i] = op[0] == 'S' ? sqrt(v.data[i]) : -v.data[i];
    v.is_int = v.is_int && op[0] == 'N';
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) {
    int64_t axes[SIM_MAX_DIMS];
    int na = attr_ints(n, "axes", axes, SIM_MAX_DIMS);
    if (n->n_input > 1 && *n->input[1] && !const_ints(im, n, 1, axes, &na, SIM_MAX_DIMS))
      return FALSE;
    SimShape s = shape_of(im, in0), r = { 0 };
    gboolean unsq = op[0] == 'U';
    int rank = unsq ? s.ndim + na : s.ndim;
    gboolean mark[SIM_MAX_DIMS * 2] = { FALSE };
    for (int i = 0; i < na; i++) {
      int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
      if (a < 0 || a >= rank)
        return fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range",
                    axes[i]);
      mark[a] = TRUE;
    }
    if (unsq) {
      if (rank > SIM_MAX_DIMS)
        return fail(im, n, SIM_ERROR_INVALID, "more than %d dimensions", SIM_MAX_DIMS);
      for (int i = 0, j = 0; i < rank; i++)
        r.dims[r.ndim++] = mark[i] ? 1 : s.dims[j++];
    } else {
      for (int i = 0; i < s.ndim; i++)
        if (!(na ? mark[i] : s.dims[i] == 1))
          r.dims[r.ndim++] = s.dims[i];
    }
    if (in0->kind != V_TENSOR) {
      Value v = *in0;
      v.shape = r;
      value_set(im, out, &v);
      return TRUE;
    }
    if (r.ndim == 0)
      return fail(im, n, SIM_ERROR_INVALID, "a tensor squeezed to a scalar is not supported");
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_reshape(im->g, name, in0->tensor, r.ndim, r.dims);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Concat") && all_const(im, n, 0, (int)n->n_input - 1)) {
    Value v = { .kind = V_CONST, .is_int = TRUE };
    v.shape.ndim = 1;
    for (size_t i = 0; i < n->n_input; i++) {
      Value *p = value_get(im, n->input[i]);
      for (int64_t j = 0; j < const_numel(p); j++) {
        if (v.shape.dims[0] >= CONST_MAX)
          return fail(im, n, SIM_ERROR_INVALID, "a constant of more than %d values",
                      CONST_MAX);
        v.data[v.shape.dims[0]++] = p->data[j];
      }
      v.is_int = v.is_int && p->is_int;
    }
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Concat")) {
    int xs[64];
    if (n->n_input > G_N_ELEMENTS(xs))
      return fail(im, n, SIM_ERROR_INVALID, "more than %zu inputs", G_N_ELEMENTS(xs));
    for (size_t i = 0; i < n->n_input; i++)
      if (!tensor_of(im, n, (int)i, &xs[i]))
        return FALSE;
    int64_t axis = attr_int(n, "axis", 0);
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = n->n_input == 1 ? xs[0]
                            : sim_graph_concat(im->g, name, (int)axis, (int)n->n_input, xs);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gather") && all_const(im, n, 0, 1)) {
    Value *d = in0, *ix = value_get(im, n->input[1]);
    if (d->shape.ndim > 1)
      return fail(im, n, SIM_ERROR_INVALID, "Gather from a constant of rank %d",
                  d->shape.ndim);
    Value v = { .kind = V_CONST, .is_int = d->is_int, .shape = ix->shape };
    for (int64_t i = 0; i < const_numel(ix); i++) {
      int64_t k = (int64_t)ix->data[i];
      if (k < 0)
        k += const_numel(d);
      if (k < 0 || k >= const_numel(d))
        return fail(im, n, SIM_ERROR_INVALID, "index %" G_GINT64_FORMAT " out of range", k);
      v.data[i] = d->data[k];
    }
    value_set(im, out, &v);
    return TRUE;
  }
  Value *ix = n->n_input > 1 ? value_get(im, n->input[1]) : NULL;
  if (!strcmp(op, "Gather") && in0->kind == V_LEAF && !in0->data_only && ix &&
      !(ix->kind == V_CONST && const_numel(ix) == 1)) {
    /* An embedding table: rows of a weight picked by computed or input indices. */
    if (in0->shape.ndim != 2 || attr_int(n, "axis", 0) != 0)
      return fail(im, n, SIM_ERROR_INVALID, "Gather from a weight is an embedding only for a "
                  "table of rank 2 along axis 0");
    int ids;
    if (!tensor_of(im, n, 1, &ids))
      return FALSE;
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_embedding(im->g, name, ids, in0->shape.dims[0], in0->shape.dims[1]);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gather") || !strcmp(op, "Slice")) {
    /* One part [begin, end) along one axis: of a constant (shape arithmetic), of a weight
     * (PyTorch splits a packed projection's weight) or of a computed tensor (a split whose
     * part is kept); Gather of one index then drops the axis. */
    SimShape s = shape_of(im, in0);
    int64_t axis, begin, end, step = 1;
    gboolean drop = FALSE;
    if (op[0] == 'G') {
      int64_t index1[1];
      int k = 0;
      if (!const_ints(im, n, 1, index1, &k, 1))
        return FALSE;
      if (k != 1 || value_get(im, n->input[1])->shape.ndim > 1)
        return fail(im, n, SIM_ERROR_INVALID, "Gather takes one index here");
      drop = value_get(im, n->input[1])->shape.ndim == 0;
      axis = attr_int(n, "axis", 0);
      axis = axis < 0 ? axis + s.ndim : axis;
      if (axis < 0 || axis >= s.ndim)
        return fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range", axis);
      begin = index1[0] < 0 ? index1[0] + s.dims[axis] : index1[0];
      end = begin + 1;
    } else {
      int64_t st[SIM_MAX_DIMS], en[SIM_MAX_DIMS], ax[SIM_MAX_DIMS] = { 0 }, sp[SIM_MAX_DIMS];
      int ns = 0, ne = 0, nax = 0, nsp = 0;
      if (n->n_input < 3) {
        ns = attr_ints(n, "starts", st, SIM_MAX_DIMS);
        ne = attr_ints(n, "ends", en, SIM_MAX_DIMS);
        nax = attr_ints(n, "axes", ax, SIM_MAX_DIMS);
      } else if (!const_ints(im, n, 1, st, &ns, SIM_MAX_DIMS) ||
                 !const_ints(im, n, 2, en, &ne, SIM_MAX_DIMS)) {
        return FALSE;
      }
      if (n->n_input > 3 && *n->input[3] && !const_ints(im, n, 3, ax, &nax, SIM_MAX_DIMS))
        return FALSE;
      if (n->n_input > 4 && *n->input[4] && !const_ints(im, n, 4, sp, &nsp, SIM_MAX_DIMS))
        return FALSE;
      if (ns != 1 || ne != 1)
        return fail(im, n, SIM_ERROR_INVALID, "only a slice along one axis is supported");
      step = nsp ? sp[0] : 1;
      axis = nax ? ax[0] : 0;
      axis = axis < 0 ? axis + s.ndim : axis;
      if (axis < 0 || axis >= s.ndim)
        return fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range", axis);
      int64_t dim = s.dims[axis];
      begin = st[0] < 0 ? st[0] + dim : st[0];
      end = en[0] < 0 ? en[0] + dim : en[0];
      begin = CLAMP(begin, 0, dim);
      end = CLAMP(end, 0, dim);
      if (step != 1 && (in0->kind != V_CONST || step < 1))
        return fail(im, n, SIM_ERROR_INVALID, "a slice with step %" G_GINT64_FORMAT " is "
                    "supported only on constants", step);
    }
    if (begin < 0 || end > s.dims[axis] || begin > end ||
        (begin == end && in0->kind != V_CONST))
      return fail(im, n, SIM_ERROR_INVALID, "the part [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                  ") along axis %" G_GINT64_FORMAT " is outside the tensor", begin, end, axis);
    SimShape part = s;
    part.dims[axis] = (end - begin + step - 1) / step;
    if (drop) {
      for (int d = (int)axis; d + 1 < s.ndim; d++)
        part.dims[d] = part.dims[d + 1];
      part.ndim--;
    }
    if (in0->kind == V_CONST) {
      if (s.ndim > 1)
        return fail(im, n, SIM_ERROR_INVALID, "%s of a constant of rank %d", op, s.ndim);
      Value v = *in0;
      v.shape = part;
      for (int64_t i = begin, j = 0; i < end; i += step)
        v.data[j++] = in0->data[i];
      value_set(im, out, &v);
      return TRUE;
    }
    if (in0->kind == V_LEAF) {
      Value v = *in0;
      v.shape = part;
      value_set(im, out, &v);
      return TRUE;
    }
    int x = in0->tensor;
    int t = x;
    if (end - begin < s.dims[axis]) {
      int64_t sizes[3];
      int parts = 0, keep = 0;
      if (begin > 0)
        sizes[parts++] = begin;
      keep = parts;
      sizes[parts++] = end - begin;
      if (end < s.dims[axis])
        sizes[parts++] = s.dims[axis] - end;
      int outs[3];
      g_autofree char *name = op_name(im, n, index, NULL);
      if (!built(im, n, sim_graph_split(im->g, name, x, (int)axis, parts, sizes, outs)))
        return FALSE;
      t = outs[keep];
    }
    if (drop) {
      g_autofree char *name = op_name(im, n, index, "/squeeze");
      t = sim_graph_reshape(im->g, name, t, part.ndim, part.dims);
      if (!built(im, n, t))
        return FALSE;
    }
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Split")) {
    SimShape s = shape_of(im, in0);
    int64_t axis = attr_int(n, "axis", 0);
    axis = axis < 0 ? axis + s.ndim : axis;
    if (axis < 0 || axis >= s.ndim || n->n_output > 16)
      return fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " or %zu parts not "
                  "supported", axis, n->n_output);
    int64_t sizes[16];
    int ns = attr_ints(n, "split", sizes, 16);
    if (n->n_input > 1 && *n->input[1] && !const_ints(im, n, 1, sizes, &ns, 16))
      return FALSE;
    int parts = (int)n->n_output;
    if (ns == 0) {
      if (s.dims[axis] % parts != 0)
        return fail(im, n, SIM_ERROR_INVALID, "%" G_GINT64_FORMAT " does not split into %d "
                    "equal parts", s.dims[axis], parts);
      for (int i = 0; i < parts; i++)
        sizes[i] = s.dims[axis] / parts;
    } else if (ns != parts) {
      return fail(im, n, SIM_ERROR_INVALID, "%d sizes for %d outputs", ns, parts);
    }
    if (in0->kind == V_LEAF) {
      for (int i = 0; i < parts; i++) {
        Value v = *in0;
        v.shape.dims[axis] = sizes[i];
        value_set(im, n->output[i], &v);
      }
      return TRUE;
    }
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    int outs[16];
    g_autofree char *name = op_name(im, n, index, NULL);
    if (!built(im, n, sim_graph_split(im->g, name, x, (int)axis, parts, sizes, outs)))
      return FALSE;
    for (int i = 0; i < parts; i++)
      set_tensor(im, n->output[i], outs[i]);
    return TRUE;
  }
  if (!strcmp(op, "Reshape") || !strcmp(op, "Flatten")) {
    SimShape s = shape_of(im, in0);
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (op[0] == 'F') {
      int64_t axis = attr_int(n, "axis", 1);
      axis = axis < 0 ? axis + s.ndim : axis;
      int64_t lead = 1;
      for (int d = 0; d < axis; d++)
        lead *= s.dims[d];
      dims[nd++] = lead;
      dims[nd++] = -1;
    } else {
      if (!const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
        return FALSE;
      gboolean allowzero = attr_int(n, "allowzero", 0) != 0;
      for (int d = 0; d < nd; d++)
        if (dims[d] == 0 && !allowzero) {
          if (d >= s.ndim)
            return fail(im, n, SIM_ERROR_INVALID, "target dimension %d copies an input "
                        "dimension that does not exist", d);
          dims[d] = s.dims[d];
        }
    }
    if (in0->kind == V_CONST) {
      Value v = *in0;
      v.shape = sim_shape_make(nd, dims);
      for (int d = 0; d < nd; d++)
        if (dims[d] < 0)
          v.shape.dims[d] = const_numel(in0) / MAX(1, -sim_shape_numel(&v.shape));
      value_set(im, out, &v);
      return TRUE;
    }
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_reshape(im->g, name, x, nd, dims);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Transpose")) {
    SimShape s = shape_of(im, in0);
    int64_t perm64[SIM_MAX_DIMS];
    int np = attr_ints(n, "perm", perm64, SIM_MAX_DIMS);
    int perm[SIM_MAX_DIMS];
    gboolean identity = TRUE;
    for (int d = 0; d < s.ndim; d++) {
      perm[d] = np ? (int)perm64[d] : s.ndim - 1 - d;
      identity = identity && perm[d] == d;
    }
    if (np && np != s.ndim)
      return fail(im, n, SIM_ERROR_INVALID, "a permutation of %d entries for rank %d", np,
                  s.ndim);
    if (in0->kind == V_LEAF) {
      /* A weight seen transposed (PyTorch's linear: x @ W^T) is still a weight. */
      Value v = *in0;
      for (int d = 0; d < s.ndim; d++)
        v.shape.dims[d] = s.dims[perm[d]];
      value_set(im, out, &v);
      return TRUE;
    }
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    int t = x;
    if (!identity) {
      g_autofree char *name = op_name(im, n, index, NULL);
      t = sim_graph_transpose(im->g, name, x, perm);
      if (!built(im, n, t))
        return FALSE;
    }
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Conv")) {
    Value *x;
    if (!padded_tensor(im, n, &x))
      return FALSE;
    Value *w = leaf_input(im, n, 1, "filter");
    if (!w)
      return FALSE;
    if (w->shape.ndim != 4 && w->shape.ndim != 3)
      return fail(im, n, SIM_ERROR_INVALID, "only 1-D and 2-D convolutions (a filter of rank 3 "
                  "or 4) are supported");
    /* Conv1d is a 1 x k convolution over [n, c, 1, length], with the same weights. */
    gboolean one = w->shape.ndim == 3;
    SimConvParams p = sim_conv_params(w->shape.dims[0], one ? 1 : (int)w->shape.dims[2],
                                      (int)w->shape.dims[one ? 2 : 3]);
    int kernel[2];
    if (!spatial_attrs(im, n, x, kernel, p.stride, p.padding, p.dilation))
      return FALSE;
    p.groups = (int)attr_int(n, "group", 1);
    p.bias = n->n_input > 2 && *n->input[2];
    if (p.bias && !leaf_input(im, n, 2, "bias"))
      return FALSE;
    const char *after = fold_relu(im, out, &p.activation);
    g_autofree char *name = op_name(im, n, index, NULL);
    int x2 = as_2d(im, n, index, x->tensor);
    if (x2 < 0)
      return FALSE;
    int t = sim_graph_conv2d(im->g, name, x2, &p);
    if (!built(im, n, t))
      return FALSE;
    if ((t = from_2d(im, n, index, x->tensor, t)) < 0)
      return FALSE;
    set_tensor(im, after, t);
    return TRUE;
  }
  if (!strcmp(op, "MaxPool") || !strcmp(op, "AveragePool")) {
    Value *x;
    if (!padded_tensor(im, n, &x))
      return FALSE;
    if (n->n_output > 1 && *n->output[1])
      return fail(im, n, SIM_ERROR_INVALID, "MaxPool's indices output is not supported");
    int k[2], s[2], p[2];
    if (!spatial_attrs(im, n, x, k, s, p, NULL))
      return FALSE;
    /* count_include_pad changes what an average divides by, not the work. */
    g_autofree char *name = op_name(im, n, index, NULL);
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_POOL2D);
    g_autoptr(GError) err = NULL;
    int64_t kernel[2] = { k[0], k[1] }, stride[2] = { s[0], s[1] }, pad[2] = { p[0], p[1] };
    int opid = -1, x2 = as_2d(im, n, index, x->tensor);
    if (x2 < 0)
      return FALSE;
    if (sim_attrs_set_string(a, "kind", op[0] == 'M' ? "max" : "avg", &err) &&
        sim_attrs_set_ints(a, "kernel", 2, kernel, &err) &&
        sim_attrs_set_ints(a, "stride", 2, stride, &err) &&
        sim_attrs_set_ints(a, "padding", 2, pad, &err) &&
        sim_attrs_set_int(a, "ceil_mode", attr_int(n, "ceil_mode", 0) != 0, &err))
      opid = sim_graph_add_op(im->g, SIM_OP_POOL2D, name, 1, &x2, a, &err);
    if (opid < 0)
      return fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
    int t = from_2d(im, n, index, x->tensor, sim_graph_op_output(im->g, opid, 0));
    if (t < 0)
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "GlobalAveragePool") || !strcmp(op, "GlobalMaxPool")) {
    int x0, x;
    if (!tensor_of(im, n, 0, &x0) || (x = as_2d(im, n, index, x0)) < 0)
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int kh = (int)s.dims[2], kw = (int)s.dims[3];
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_pool2d(im->g, name, x, op[6] == 'A' ? SIM_POOL_AVG : SIM_POOL_MAX, kh, kw,
                             kh, kw, 0, 0);
    if (!built(im, n, t) || (t = from_2d(im, n, index, x0, t)) < 0)
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Pad")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t pads[2 * SIM_MAX_DIMS];
    int np = attr_ints(n, "pads", pads, 2 * SIM_MAX_DIMS);
    if (n->n_input > 1 && *n->input[1] && !const_ints(im, n, 1, pads, &np, 2 * SIM_MAX_DIMS))
      return FALSE;
    char buf[32];
    const char *mode = attr_string(n, "mode", buf, sizeof buf);
    gboolean ok = (!mode || !strcmp(mode, "constant")) && s.ndim == 4 && np == 8 &&
                  pads[0] == 0 && pads[1] == 0 && pads[4] == 0 && pads[5] == 0 &&
                  pads[2] == pads[6] && pads[3] == pads[7];
    if (!ok)
      return fail(im, n, SIM_ERROR_INVALID, "only constant, symmetric padding of the height "
                  "and width of an image is supported (before a convolution or pooling)");
    Value v = { .kind = V_TENSOR, .tensor = x, .pad = { (int)pads[2], (int)pads[3] } };
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "BatchNormalization")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    if (!leaf_input(im, n, 1, "scale") || !leaf_input(im, n, 2, "shift"))
      return FALSE;
    SimUnaryKind act = SIM_UNARY_IDENTITY;
    const char *after = fold_relu(im, out, &act);
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_batchnorm(im->g, name, x, act == SIM_UNARY_RELU);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, after, t);
    /* Training mode's running mean and variance are buffers, not activations. */
    return TRUE;
  }
  if (!strcmp(op, "LayerNormalization")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t axis = attr_int(n, "axis", -1);
    if (axis != -1 && axis != s.ndim - 1)
      return fail(im, n, SIM_ERROR_INVALID, "normalization over axis %" G_GINT64_FORMAT
                  "; only the last dimension is supported", axis);
    if (!leaf_input(im, n, 1, "scale"))
      return FALSE;
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_layernorm(im->g, name, x);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gemm")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    if (attr_int(n, "transA", 0))
      return fail(im, n, SIM_ERROR_INVALID, "transA is not supported");
    Value *w = leaf_input(im, n, 1, "weight");
    if (!w)
      return FALSE;
    if (w->shape.ndim != 2)
      return fail(im, n, SIM_ERROR_INVALID, "the weight has rank %d, not 2", w->shape.ndim);
    int64_t outf = attr_int(n, "transB", 0) ? w->shape.dims[0] : w->shape.dims[1];
    gboolean bias = n->n_input > 2 && *n->input[2];
    if (bias && !leaf_input(im, n, 2, "bias"))
      return FALSE;
    return emit_linear(im, n, index, x, outf, bias);
  }
  if (!strcmp(op, "MatMul")) {
    Value *b = value_get(im, n->n_input > 1 ? n->input[1] : NULL);
    if (!b)
      return fail(im, n, SIM_ERROR_INVALID, "input 1 is not made by an earlier node");
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    gboolean fused = FALSE;
    if (b->kind == V_LEAF && b->shape.ndim == 2 && !fuse_swiglu(im, index, x, &fused))
      return FALSE;
    if (fused)
      return TRUE;
    if (b->kind == V_LEAF && b->shape.ndim == 2)
      return emit_linear(im, n, index, x, b->shape.dims[1], FALSE);
    int y;
    if (!tensor_of(im, n, 1, &y))
      return FALSE;
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_matmul(im->g, name, x, y, FALSE);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  const char *gelu_out = !strcmp(op, "Div") && in0 && in0->kind == V_TENSOR
                           ? fold_gelu(im, n->input[0]) : NULL;
  if (gelu_out) {
    /* GELU written out, met at its first node when no linear came before it. */
    const char *y = gelu_out;
    int t0;
    if (!tensor_of(im, n, 0, &t0))
      return FALSE;
    g_autofree char *name = op_name(im, n, index, "/gelu");
    int t = sim_graph_unary(im->g, name, t0, SIM_UNARY_GELU);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, y, t);
    return TRUE;
  }
  if (!strcmp(op, "Range") && all_const(im, n, 0, 2)) {
    double start = 0, limit = 0, delta = 1;
    if (!is_scalar_const(im, n->input[0], &start) || !is_scalar_const(im, n->input[1], &limit) ||
        !is_scalar_const(im, n->input[2], &delta) || delta == 0)
      return fail(im, n, SIM_ERROR_INVALID, "expected scalar start, limit and a non-zero delta");
    int64_t count = (int64_t)MAX(0, ceil((limit - start) / delta));
    Value v = { .kind = V_CONST, .is_int = in0->is_int };
    v.dtype = v.is_int ? SIM_DTYPE_INT64 : SIM_DTYPE_FP32;
    v.shape.ndim = 1;
    v.shape.dims[0] = count;
    if (count > CONST_MAX) {
      v.kind = V_LEAF;
      v.data_only = TRUE;
    } else {
      for (int64_t i = 0; i < count; i++)
        v.data[i] = start + (double)i * delta;
    }
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "ConstantOfShape")) {
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!const_ints(im, n, 0, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    Value v = { .kind = V_CONST, .shape = sim_shape_make(nd, dims), .dtype = SIM_DTYPE_FP32 };
    const Onnx__AttributeProto *a = attr(n, "value");
    Value fill = { 0 };
    if (a && a->t && !tensor_value(im, a->t, &fill, n))
      return FALSE;
    v.is_int = fill.kind == V_CONST && fill.is_int;
    if (sim_shape_numel(&v.shape) > CONST_MAX) {
      v.kind = V_LEAF;
      v.data_only = TRUE;
    } else {
      for (int64_t i = 0; i < sim_shape_numel(&v.shape); i++)
        v.data[i] = fill.kind == V_CONST ? fill.data[0] : 0;
    }
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Where") && n->n_input == 3 && all_const(im, n, 0, 2)) {
    /* Shape arithmetic: expand(n, -1, -1) exports a Where over the target shape. */
    Value *c = value_get(im, n->input[0]), *a = value_get(im, n->input[1]),
          *b = value_get(im, n->input[2]);
    int64_t nc = const_numel(c), na = const_numel(a), nb = const_numel(b);
    int64_t nr = MAX(nc, MAX(na, nb));
    if ((nc != nr && nc != 1) || (na != nr && na != 1) || (nb != nr && nb != 1))
      return fail(im, n, SIM_ERROR_INVALID, "constant operands of %" G_GINT64_FORMAT ", %"
                  G_GINT64_FORMAT " and %" G_GINT64_FORMAT " values", nc, na, nb);
    Value r = *(na == nr ? a : nb == nr ? b : c);
    r.is_int = a->is_int && b->is_int;
    for (int64_t i = 0; i < nr; i++)
      r.data[i] = c->data[nc == 1 ? 0 : i] != 0 ? a->data[na == 1 ? 0 : i]
                                                 : b->data[nb == 1 ? 0 : i];
    value_set(im, out, &r);
    return TRUE;
  }
  Value *w1 = n->n_input == 3 ? value_get(im, n->input[1]) : NULL;
  Value *w2 = n->n_input == 3 ? value_get(im, n->input[2]) : NULL;
  gboolean ta = w1 && w1->kind == V_TENSOR, tb = w2 && w2->kind == V_TENSOR;
  if (!strcmp(op, "Where") && (ta || tb)) {
    /* masked_fill and its kin on a computed tensor: one element-wise pass over the
     * tensor(s) it selects from; the condition (a mask) only decides which. */
    int x, y;
    g_autofree char *name = op_name(im, n, index, NULL);
    int t;
    if (ta && tb) {
      if (!tensor_of(im, n, 1, &x) || !tensor_of(im, n, 2, &y))
        return FALSE;
      t = sim_graph_binary(im->g, name, x, y, SIM_BINARY_ADD);
    } else {
      if (!tensor_of(im, n, ta ? 1 : 2, &x))
        return FALSE;
      t = sim_graph_unary(im->g, name, x, SIM_UNARY_IDENTITY);
    }
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Neg") && in0 && in0->kind == V_TENSOR) {
    /* A negation (rotate_half of rotary embeddings): a scaling by -1, one pass. */
    g_autofree char *name = op_name(im, n, index, NULL);
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
    g_autoptr(GError) err = NULL;
    sim_attrs_set_string(a, "kind", "scale", NULL);
    sim_attrs_set_float(a, "scale", -1.0, NULL);
    int opid = sim_graph_add_op(im->g, SIM_OP_UNARY, name, 1, &in0->tensor, a, &err);
    if (opid < 0)
      return fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
    set_tensor(im, out, sim_graph_op_output(im->g, opid, 0));
    return TRUE;
  }
  if (!strcmp(op, "Expand") && in0->kind == V_TENSOR) {
    /* A computed tensor stretched along dimensions of size 1 (the keys and values of
     * grouped-query attention, x[:, :, None].expand(...) then a reshape): copies of it
     * joined along each such dimension, the copy that the reshape after it makes. */
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    int t = in0->tensor;
    SimShape a = sim_graph_tensor_shape(im->g, t);
    if (nd > a.ndim) {
      int64_t lead[SIM_MAX_DIMS];
      int extra = nd - a.ndim;
      for (int d = 0; d < nd; d++)
        lead[d] = d < extra ? 1 : a.dims[d - extra];
      g_autofree char *name = op_name(im, n, index, "/rank");
      t = sim_graph_reshape(im->g, name, t, nd, lead);
      if (!built(im, n, t))
        return FALSE;
      a = sim_graph_tensor_shape(im->g, t);
    }
    for (int d = 0; d < a.ndim; d++) {
      int64_t want = d - (a.ndim - nd) >= 0 ? dims[d - (a.ndim - nd)] : 1;
      if (want == a.dims[d] || want == 1 || want == -1)
        continue;
      if (a.dims[d] != 1 || want > 64)
        return fail(im, n, SIM_ERROR_INVALID, "dimension %d of size %" G_GINT64_FORMAT
                    " cannot stretch to %" G_GINT64_FORMAT " (only size 1, to at most 64)",
                    d, a.dims[d], want);
      int copies[64];
      for (int64_t c = 0; c < want; c++)
        copies[c] = t;
      g_autofree char *name = op_name(im, n, index, NULL);
      g_autofree char *uname = free_name(im, name);
      t = sim_graph_concat(im->g, uname, d, (int)want, copies);
      if (!built(im, n, t))
        return FALSE;
    }
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Expand") && is_learned(in0)) {
    /* A learned tensor stretched over the batch (a ViT's class token,
     * class_token.expand(n, -1, -1)): the embedding of learned_tensor() read by ids of the
     * stretched shape. */
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    SimShape a = in0->shape, r = { .ndim = MAX(a.ndim, nd) };
    for (int d = 0; d < r.ndim; d++) {
      int64_t x = d - (r.ndim - a.ndim) >= 0 ? a.dims[d - (r.ndim - a.ndim)] : 1;
      int64_t y = d - (r.ndim - nd) >= 0 ? dims[d - (r.ndim - nd)] : 1;
      r.dims[d] = MAX(x, y);
    }
    if (a.ndim < 1 || r.dims[r.ndim - 1] != a.dims[a.ndim - 1])
      return fail(im, n, SIM_ERROR_INVALID, "a learned tensor is stretched only along "
                  "other dimensions than its last");
    SimShape lead = r;
    lead.ndim = r.ndim - 1;
    if (lead.ndim == 0) {
      lead.ndim = 1;
      lead.dims[0] = 1;
    }
    int t = learned_tensor(im, n, n->input[0], in0, &lead);
    if (t < 0)
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if ((!strcmp(op, "Trilu") || !strcmp(op, "Where") || !strcmp(op, "Expand") ||
       !strcmp(op, "Equal") || !strcmp(op, "Not") || !strcmp(op, "Neg")) &&
      in0->kind != V_TENSOR) {
    /* Masks built from constants: only their shape matters (an input where used). */
    for (size_t i = 0; i < n->n_input; i++) {
      Value *v = value_get(im, n->input[i]);
      if (*n->input[i] && (!v || v->kind == V_TENSOR || (v->kind == V_LEAF && !v->data_only)))
        return fail(im, n, SIM_ERROR_INVALID, "%s is supported only on constants (masks)", op);
    }
    Value v = *in0;
    if (!strcmp(op, "Where"))
      v = *value_get(im, n->input[1]);
    if (!strcmp(op, "Expand")) {
      int64_t dims[SIM_MAX_DIMS];
      int nd = 0;
      if (!const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
        return FALSE;
      SimShape a = in0->shape, r = { .ndim = MAX(a.ndim, nd) };
      for (int d = 0; d < r.ndim; d++) {
        int64_t x = d - (r.ndim - a.ndim) >= 0 ? a.dims[d - (r.ndim - a.ndim)] : 1;
        int64_t y = d - (r.ndim - nd) >= 0 ? dims[d - (r.ndim - nd)] : 1;
        r.dims[d] = MAX(x, y);
      }
      v.shape = r;
    }
    v.kind = V_LEAF;
    v.data_only = TRUE;
    value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div")) {
    /* With a scalar constant: a scaling (Mul, Div) or a shift (Add, Sub), one
     * memory-bound pass either way. */
    double c = 0;
    int ci = is_scalar_const(im, n->input[1], &c)   ? 1
             : is_scalar_const(im, n->input[0], &c) ? 0
                                                    : -1;
    if (!strcmp(op, "Div") && ci == 0)
      return fail(im, n, SIM_ERROR_INVALID, "a constant divided by a tensor is not supported");
    if (ci >= 0) {
      int x;
      if (!tensor_of(im, n, 1 - ci, &x))
        return FALSE;
      gboolean scale = op[0] == 'M' || op[0] == 'D';
      g_autofree char *name = op_name(im, n, index, NULL);
      int t;
      if (scale) {
        g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
        g_autoptr(GError) err = NULL;
        sim_attrs_set_string(a, "kind", "scale", NULL);
        sim_attrs_set_float(a, "scale", op[0] == 'D' ? 1.0 / c : c, NULL);
        int opid = sim_graph_add_op(im->g, SIM_OP_UNARY, name, 1, &x, a, &err);
        if (opid < 0)
          return fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
        t = sim_graph_op_output(im->g, opid, 0);
      } else {
        t = sim_graph_unary(im->g, name, x, SIM_UNARY_IDENTITY);
      }
      if (!built(im, n, t))
        return FALSE;
      set_tensor(im, out, t);
      return TRUE;
    }
    int a, b;
    if (!tensor_of(im, n, 0, &a) || !tensor_of(im, n, 1, &b))
      return FALSE;
    static const SimBinaryKind kinds[] = { ['A'] = SIM_BINARY_ADD, ['S'] = SIM_BINARY_SUB,
                                           ['M'] = SIM_BINARY_MUL, ['D'] = SIM_BINARY_DIV };
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_binary(im->g, name, a, b, kinds[(unsigned char)op[0]]);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Clip")) {
    /* torch.nn.ReLU6 (MobileNet) is Clip to [0, 6]; the bounds are inputs from opset 11,
     * attributes before. */
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    double lo = attr_float(n, "min", -INFINITY), hi = attr_float(n, "max", INFINITY);
    if ((n->n_input > 1 && *n->input[1] && !is_scalar_const(im, n->input[1], &lo)) ||
        (n->n_input > 2 && *n->input[2] && !is_scalar_const(im, n->input[2], &hi)))
      return fail(im, n, SIM_ERROR_INVALID, "the bounds must be scalar constants");
    SimUnaryKind kind;
    if (lo == 0 && hi == 6)
      kind = SIM_UNARY_RELU6;
    else if (lo == 0 && isinf(hi) && hi > 0)
      kind = SIM_UNARY_RELU;
    else
      return fail(im, n, SIM_ERROR_INVALID, "clips to [%g, %g]; only [0, 6] (ReLU6) and "
                  "[0, inf) (ReLU) are supported", lo, hi);
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_unary(im->g, name, x, kind);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  static const struct { const char *onnx; SimUnaryKind kind; } unaries[] = {
    { "Relu", SIM_UNARY_RELU }, { "Gelu", SIM_UNARY_GELU }, { "Sigmoid", SIM_UNARY_SIGMOID },
    { "Tanh", SIM_UNARY_TANH }, { "Exp", SIM_UNARY_EXP },
  };
  for (size_t u = 0; u < G_N_ELEMENTS(unaries); u++) {
    if (strcmp(op, unaries[u].onnx) != 0)
      continue;
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    SimUnaryKind kind = unaries[u].kind;
    const char *after = out;
    /* SiLU: x * sigmoid(x). */
    if (kind == SIM_UNARY_SIGMOID) {
      int c = sole_consumer(im, out);
      const Onnx__NodeProto *m = node(im, c);
      if (m && !strcmp(m->op_type, "Mul") && m->n_input == 2 &&
          (!strcmp(m->input[0], n->input[0]) || !strcmp(m->input[1], n->input[0]))) {
        kind = SIM_UNARY_SILU;
        im->skip[c] = TRUE;
        after = m->output[0];
      }
    }
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_unary(im->g, name, x, kind);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, after, t);
    return TRUE;
  }
  if (!strcmp(op, "Softmax")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t axis = attr_int(n, "axis", -1);
    if (axis != -1 && axis != s.ndim - 1)
      return fail(im, n, SIM_ERROR_INVALID, "softmax over axis %" G_GINT64_FORMAT "; only the "
                  "last dimension is supported", axis);
    g_autofree char *name = op_name(im, n, index, NULL);
    int t = sim_graph_softmax(im->g, name, x);
    if (!built(im, n, t))
      return FALSE;
    set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Dropout")) {
    int x;
    if (!tensor_of(im, n, 0, &x))
      return FALSE;
    double p = attr_float(n, "ratio", 0.5);
    if (n->n_input > 1 && *n->input[1] && !is_scalar_const(im, n->input[1], &p))
      return fail(im, n, SIM_ERROR_INVALID, "the ratio must be a constant");
    gboolean training = TRUE;
    double tm = 1;
    if (n->n_input > 2 && *n->input[2] && is_scalar_const(im, n->input[2], &tm))
      training = tm != 0;
    int t = x;
    if (training && p > 0) {
      g_autofree char *name = op_name(im, n, index, NULL);
      t = sim_graph_dropout(im->g, name, x, p);
      if (!built(im, n, t))
        return FALSE;
    }
    set_tensor(im, out, t);
    return TRUE;
  }
  return fail(im, n, SIM_ERROR_UNKNOWN, "operator %s is not supported by the importer "
              "(parasol import --check lists every unsupported node)", op);
}

/* The operator types import_node() knows; --check lists the others. */
static const char *const supported_ops[] = {
  "Constant", "Identity", "Cast", "Shape", "Size", "Add", "Sub", "Mul", "Div", "Equal", "Max",
  "Min", "Unsqueeze", "Squeeze", "Concat", "Gather", "Slice", "Split", "Reshape", "Flatten",
  "Transpose", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Pad",
  "BatchNormalization", "LayerNormalization", "Gemm", "MatMul", "Relu", "Gelu", "Sigmoid",
  "Tanh", "Exp", "Erf", "Softmax", "Dropout", "Range", "ConstantOfShape", "Trilu", "Where",
  "Expand", "Not", "Neg", "Pow", "Sqrt", "Clip",
  /* Only inside RMSNorm (fuse_pointwise()), which --check, reading types, does not see. */
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
    if (!tensor_value(im, gr->initializer[i], &v, NULL))
      return FALSE;
    v.buffer = g_hash_table_contains(im->buffers, gr->initializer[i]->name);
    value_set(im, gr->initializer[i]->name, &v);
  }
  for (size_t i = 0; i < gr->n_input; i++) {
    const Onnx__ValueInfoProto *in = gr->input[i];
    if (value_get(im, in->name))
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
    value_set(im, in->name, &v);
    if (is_data_input(im, in->name, symbolic)) {
      int t = sim_graph_input(im->g, in->name, v.dtype, v.shape.ndim, v.shape.dims);
      if (t < 0) {
        g_autoptr(GError) err = NULL;
        sim_graph_check(im->g, &err);
        sim_set_error_at(im->error, SIM_ERROR_INVALID, im->filename, place, "%s",
                         err ? err->message : "cannot be an input");
        return FALSE;
      }
      set_tensor(im, in->name, t);
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
      ok = import_node(&im, (int)i);
      im.skip[i] = TRUE;
    }
  /* Scopes that hold an attention module's packed projection weight. */
  g_autoptr(GHashTable) attention = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
  for (size_t i = 0; i < gr->n_node; i++)
    for (size_t j = 0; j < gr->node[i]->n_input; j++)
      if (g_str_has_suffix(gr->node[i]->input[j], "in_proj_weight")) {
        char *scope = scope_of(gr->node[i]);
        if (scope)
          g_hash_table_add(attention, scope);
      }
  for (size_t i = 0; ok && i < gr->n_node; i++) {
    if (im.skip[i])
      continue;
    g_autofree char *scope = scope_of(gr->node[i]);
    gboolean fused = FALSE;
    if (scope && g_hash_table_contains(attention, scope)) {
      ok = fuse_attention(&im, (int)i, &fused);
      g_hash_table_remove(attention, scope);
    }
    if (ok && !fused)
      ok = import_node(&im, (int)i);
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
