/* onnx-node.c — one ONNX node as parasol operators, constants or values (onnx.c
 * describes the mapping; onnx-fuse.c folds the patterns that span several nodes).  About
 * a thousand lines because it is one table of cases, an operator type each, tried in
 * order: splitting it by type would scatter the order that decides which case wins. */
#include "parasol-config.h"

#if PARASOL_HAVE_ONNX

#include "onnx-private.h"

#include <math.h>
#include <string.h>

/* The steps of onnx_import_node(), tried in order: each sets *@done and returns whether the
 * node was imported where it knows the node, and leaves *@done FALSE otherwise. */

/* Constants and shape arithmetic: the values the importer evaluates itself (Constant, Identity
 * and Cast, Shape, Size, arithmetic and Unsqueeze, Squeeze, Concat and Gather of constants),
 * after the pointwise patterns that start at a Pow or a Mul. */
static gboolean node_values(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                            const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  if (!strcmp(op, "Pow") || !strcmp(op, "Mul")) {
    gboolean fused = FALSE;
    if (!onnx_fuse_pointwise(im, index, &fused))
      return FALSE;
    if (fused)
      return TRUE;
  }
  if (!strcmp(op, "Constant")) {
    Value v = { 0 };
    const Onnx__AttributeProto *a = onnx_attr(n, "value");
    if (a && a->t) {
      if (!onnx_tensor_value(im, a->t, &v, n))
        return FALSE;
    } else if ((a = onnx_attr(n, "value_int")) || (a = onnx_attr(n, "value_float"))) {
      v.kind = V_CONST;
      v.is_int = a->has_i;
      v.data[0] = a->has_i ? (double)a->i : a->f;
    } else if ((a = onnx_attr(n, "value_ints"))) {
      v.kind = V_CONST;
      v.is_int = TRUE;
      v.shape.ndim = 1;
      v.shape.dims[0] = (int64_t)MIN(a->n_ints, (size_t)CONST_MAX);
      for (int64_t i = 0; i < v.shape.dims[0]; i++)
        v.data[i] = (double)a->ints[i];
    } else {
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a Constant without a supported value attribute");
    }
    if (v.kind != V_CONST)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a Constant of %" G_GINT64_FORMAT " values; "
                  "large constants are not supported", sim_shape_numel(&v.shape));
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Identity") || (!strcmp(op, "Cast") && in0)) {
    Value v = *in0;
    if (!strcmp(op, "Cast") && v.kind == V_CONST) {
      int64_t to = onnx_attr_int(n, "to", 1);
      v.is_int = onnx_is_int_type((int32_t)to);
      if (v.is_int)
        for (int64_t i = 0; i < onnx_const_numel(&v); i++)
          v.data[i] = trunc(v.data[i]);
    }
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Shape")) {
    SimShape s = onnx_shape_of(im, in0);
    int64_t start = onnx_attr_int(n, "start", 0), end = onnx_attr_int(n, "end", s.ndim);
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
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Size")) {
    SimShape s = onnx_shape_of(im, in0);
    Value v = { .kind = V_CONST, .is_int = TRUE };
    v.data[0] = (double)sim_shape_numel(&s);
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if ((!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") ||
       !strcmp(op, "Equal") || !strcmp(op, "Max") || !strcmp(op, "Min") || !strcmp(op, "Pow")) &&
      onnx_all_const(im, n, 0, 1))
    return onnx_const_binary(im, n, op);
  if ((!strcmp(op, "Sqrt") || !strcmp(op, "Neg")) && in0 && in0->kind == V_CONST) {
    Value v = *in0;
    for (int64_t i = 0; i < onnx_const_numel(&v); i++)
      v.data[i] = op[0] == 'S' ? sqrt(v.data[i]) : -v.data[i];
    v.is_int = v.is_int && op[0] == 'N';
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) {
    int64_t axes[SIM_MAX_DIMS];
    int na = onnx_attr_ints(n, "axes", axes, SIM_MAX_DIMS);
    if (n->n_input > 1 && *n->input[1] && !onnx_const_ints(im, n, 1, axes, &na, SIM_MAX_DIMS))
      return FALSE;
    SimShape s = onnx_shape_of(im, in0), r = { 0 };
    gboolean unsq = op[0] == 'U';
    int rank = unsq ? s.ndim + na : s.ndim;
    gboolean mark[SIM_MAX_DIMS * 2] = { FALSE };
    for (int i = 0; i < na; i++) {
      int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
      if (a < 0 || a >= rank)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range",
                    axes[i]);
      mark[a] = TRUE;
    }
    if (unsq) {
      if (rank > SIM_MAX_DIMS)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "more than %d dimensions", SIM_MAX_DIMS);
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
      onnx_value_set(im, out, &v);
      return TRUE;
    }
    if (r.ndim == 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a tensor squeezed to a scalar is not supported");
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_reshape(im->g, name, in0->tensor, r.ndim, r.dims);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Concat") && onnx_all_const(im, n, 0, (int)n->n_input - 1)) {
    Value v = { .kind = V_CONST, .is_int = TRUE };
    v.shape.ndim = 1;
    for (size_t i = 0; i < n->n_input; i++) {
      Value *p = onnx_value_get(im, n->input[i]);
      for (int64_t j = 0; j < onnx_const_numel(p); j++) {
        if (v.shape.dims[0] >= CONST_MAX)
          return onnx_fail(im, n, SIM_ERROR_INVALID, "a constant of more than %d values",
                      CONST_MAX);
        v.data[v.shape.dims[0]++] = p->data[j];
      }
      v.is_int = v.is_int && p->is_int;
    }
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Concat")) {
    int xs[64];
    if (n->n_input > G_N_ELEMENTS(xs))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "more than %zu inputs", G_N_ELEMENTS(xs));
    for (size_t i = 0; i < n->n_input; i++)
      if (!onnx_tensor_of(im, n, (int)i, &xs[i]))
        return FALSE;
    int64_t axis = onnx_attr_int(n, "axis", 0);
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = n->n_input == 1 ? xs[0]
                            : sim_graph_concat(im->g, name, (int)axis, (int)n->n_input, xs);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gather") && onnx_all_const(im, n, 0, 1)) {
    Value *d = in0, *ix = onnx_value_get(im, n->input[1]);
    if (d->shape.ndim > 1)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "Gather from a constant of rank %d",
                  d->shape.ndim);
    Value v = { .kind = V_CONST, .is_int = d->is_int, .shape = ix->shape };
    for (int64_t i = 0; i < onnx_const_numel(ix); i++) {
      int64_t k = (int64_t)ix->data[i];
      if (k < 0)
        k += onnx_const_numel(d);
      if (k < 0 || k >= onnx_const_numel(d))
        return onnx_fail(im, n, SIM_ERROR_INVALID, "index %" G_GINT64_FORMAT " out of range", k);
      v.data[i] = d->data[k];
    }
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Embeddings and selections: Gather from a weight, Gather and Slice. */
static gboolean node_layout(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                            const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  Value *ix = n->n_input > 1 ? onnx_value_get(im, n->input[1]) : NULL;
  if (!strcmp(op, "Gather") && in0->kind == V_LEAF && !in0->data_only && ix &&
      !(ix->kind == V_CONST && onnx_const_numel(ix) == 1)) {
    /* An embedding table: rows of a weight picked by computed or input indices. */
    if (in0->shape.ndim != 2 || onnx_attr_int(n, "axis", 0) != 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "Gather from a weight is an embedding only for a "
                  "table of rank 2 along axis 0");
    int ids;
    if (!onnx_tensor_of(im, n, 1, &ids))
      return FALSE;
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_embedding(im->g, name, ids, in0->shape.dims[0], in0->shape.dims[1]);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gather") || !strcmp(op, "Slice")) {
    /* One part [begin, end) along one axis: of a constant (shape arithmetic), of a weight
     * (PyTorch splits a packed projection's weight) or of a computed tensor (a split whose
     * part is kept); Gather of one index then drops the axis. */
    SimShape s = onnx_shape_of(im, in0);
    int64_t axis, begin, end, step = 1;
    gboolean drop = FALSE;
    if (op[0] == 'G') {
      int64_t index1[1];
      int k = 0;
      if (!onnx_const_ints(im, n, 1, index1, &k, 1))
        return FALSE;
      if (k != 1 || onnx_value_get(im, n->input[1])->shape.ndim > 1)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "Gather takes one index here");
      drop = onnx_value_get(im, n->input[1])->shape.ndim == 0;
      axis = onnx_attr_int(n, "axis", 0);
      axis = axis < 0 ? axis + s.ndim : axis;
      if (axis < 0 || axis >= s.ndim)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range", axis);
      begin = index1[0] < 0 ? index1[0] + s.dims[axis] : index1[0];
      end = begin + 1;
    } else {
      int64_t st[SIM_MAX_DIMS], en[SIM_MAX_DIMS], ax[SIM_MAX_DIMS] = { 0 }, sp[SIM_MAX_DIMS];
      int ns = 0, ne = 0, nax = 0, nsp = 0;
      if (n->n_input < 3) {
        ns = onnx_attr_ints(n, "starts", st, SIM_MAX_DIMS);
        ne = onnx_attr_ints(n, "ends", en, SIM_MAX_DIMS);
        nax = onnx_attr_ints(n, "axes", ax, SIM_MAX_DIMS);
      } else if (!onnx_const_ints(im, n, 1, st, &ns, SIM_MAX_DIMS) ||
                 !onnx_const_ints(im, n, 2, en, &ne, SIM_MAX_DIMS)) {
        return FALSE;
      }
      if (n->n_input > 3 && *n->input[3] && !onnx_const_ints(im, n, 3, ax, &nax, SIM_MAX_DIMS))
        return FALSE;
      if (n->n_input > 4 && *n->input[4] && !onnx_const_ints(im, n, 4, sp, &nsp, SIM_MAX_DIMS))
        return FALSE;
      if (ns != 1 || ne != 1)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "only a slice along one axis is supported");
      step = nsp ? sp[0] : 1;
      axis = nax ? ax[0] : 0;
      axis = axis < 0 ? axis + s.ndim : axis;
      if (axis < 0 || axis >= s.ndim)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " out of range", axis);
      int64_t dim = s.dims[axis];
      begin = st[0] < 0 ? st[0] + dim : st[0];
      end = en[0] < 0 ? en[0] + dim : en[0];
      begin = CLAMP(begin, 0, dim);
      end = CLAMP(end, 0, dim);
      if (step != 1 && (in0->kind != V_CONST || step < 1))
        return onnx_fail(im, n, SIM_ERROR_INVALID, "a slice with step %" G_GINT64_FORMAT " is "
                    "supported only on constants", step);
    }
    if (begin < 0 || end > s.dims[axis] || begin > end ||
        (begin == end && in0->kind != V_CONST))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "the part [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
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
        return onnx_fail(im, n, SIM_ERROR_INVALID, "%s of a constant of rank %d", op, s.ndim);
      Value v = *in0;
      v.shape = part;
      for (int64_t i = begin, j = 0; i < end; i += step)
        v.data[j++] = in0->data[i];
      onnx_value_set(im, out, &v);
      return TRUE;
    }
    if (in0->kind == V_LEAF) {
      Value v = *in0;
      v.shape = part;
      onnx_value_set(im, out, &v);
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
      g_autofree char *name = onnx_op_name(im, n, index, NULL);
      if (!onnx_built(im, n, sim_graph_split(im->g, name, x, (int)axis, parts, sizes, outs)))
        return FALSE;
      t = outs[keep];
    }
    if (drop) {
      g_autofree char *name = onnx_op_name(im, n, index, "/squeeze");
      t = sim_graph_reshape(im->g, name, t, part.ndim, part.dims);
      if (!onnx_built(im, n, t))
        return FALSE;
    }
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Changes of layout: Split, Reshape and Flatten, Transpose. */
static gboolean node_reshape(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                             const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  if (!strcmp(op, "Split")) {
    SimShape s = onnx_shape_of(im, in0);
    int64_t axis = onnx_attr_int(n, "axis", 0);
    axis = axis < 0 ? axis + s.ndim : axis;
    if (axis < 0 || axis >= s.ndim || n->n_output > 16)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "axis %" G_GINT64_FORMAT " or %zu parts not "
                  "supported", axis, n->n_output);
    int64_t sizes[16];
    int ns = onnx_attr_ints(n, "split", sizes, 16);
    if (n->n_input > 1 && *n->input[1] && !onnx_const_ints(im, n, 1, sizes, &ns, 16))
      return FALSE;
    int parts = (int)n->n_output;
    if (ns == 0) {
      if (s.dims[axis] % parts != 0)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "%" G_GINT64_FORMAT " does not split into %d "
                    "equal parts", s.dims[axis], parts);
      for (int i = 0; i < parts; i++)
        sizes[i] = s.dims[axis] / parts;
    } else if (ns != parts) {
      return onnx_fail(im, n, SIM_ERROR_INVALID, "%d sizes for %d outputs", ns, parts);
    }
    if (in0->kind == V_LEAF) {
      for (int i = 0; i < parts; i++) {
        Value v = *in0;
        v.shape.dims[axis] = sizes[i];
        onnx_value_set(im, n->output[i], &v);
      }
      return TRUE;
    }
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    int outs[16];
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    if (!onnx_built(im, n, sim_graph_split(im->g, name, x, (int)axis, parts, sizes, outs)))
      return FALSE;
    for (int i = 0; i < parts; i++)
      onnx_set_tensor(im, n->output[i], outs[i]);
    return TRUE;
  }
  if (!strcmp(op, "Reshape") || !strcmp(op, "Flatten")) {
    SimShape s = onnx_shape_of(im, in0);
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (op[0] == 'F') {
      int64_t axis = onnx_attr_int(n, "axis", 1);
      axis = axis < 0 ? axis + s.ndim : axis;
      int64_t lead = 1;
      for (int d = 0; d < axis; d++)
        lead *= s.dims[d];
      dims[nd++] = lead;
      dims[nd++] = -1;
    } else {
      if (!onnx_const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
        return FALSE;
      gboolean allowzero = onnx_attr_int(n, "allowzero", 0) != 0;
      for (int d = 0; d < nd; d++)
        if (dims[d] == 0 && !allowzero) {
          if (d >= s.ndim)
            return onnx_fail(im, n, SIM_ERROR_INVALID, "target dimension %d copies an input "
                        "dimension that does not exist", d);
          dims[d] = s.dims[d];
        }
    }
    if (in0->kind == V_CONST) {
      Value v = *in0;
      v.shape = sim_shape_make(nd, dims);
      for (int d = 0; d < nd; d++)
        if (dims[d] < 0)
          v.shape.dims[d] = onnx_const_numel(in0) / MAX(1, -sim_shape_numel(&v.shape));
      onnx_value_set(im, out, &v);
      return TRUE;
    }
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_reshape(im->g, name, x, nd, dims);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Transpose")) {
    SimShape s = onnx_shape_of(im, in0);
    int64_t perm64[SIM_MAX_DIMS];
    int np = onnx_attr_ints(n, "perm", perm64, SIM_MAX_DIMS);
    int perm[SIM_MAX_DIMS];
    gboolean identity = TRUE;
    for (int d = 0; d < s.ndim; d++) {
      perm[d] = np ? (int)perm64[d] : s.ndim - 1 - d;
      identity = identity && perm[d] == d;
    }
    if (np && np != s.ndim)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a permutation of %d entries for rank %d", np,
                  s.ndim);
    if (in0->kind == V_LEAF) {
      /* A weight seen transposed (PyTorch's linear: x @ W^T) is still a weight. */
      Value v = *in0;
      for (int d = 0; d < s.ndim; d++)
        v.shape.dims[d] = s.dims[perm[d]];
      onnx_value_set(im, out, &v);
      return TRUE;
    }
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    int t = x;
    if (!identity) {
      g_autofree char *name = onnx_op_name(im, n, index, NULL);
      t = sim_graph_transpose(im->g, name, x, perm);
      if (!onnx_built(im, n, t))
        return FALSE;
    }
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Layers: convolutions, poolings, Pad, batch and layer normalization, Gemm and MatMul. */
static gboolean node_layers(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                            const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  if (!strcmp(op, "Conv")) {
    Value *x;
    if (!onnx_padded_tensor(im, n, &x))
      return FALSE;
    Value *w = onnx_leaf_input(im, n, 1, "filter");
    if (!w)
      return FALSE;
    if (w->shape.ndim != 4 && w->shape.ndim != 3)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "only 1-D and 2-D convolutions (a filter of rank 3 "
                  "or 4) are supported");
    /* Conv1d is a 1 x k convolution over [n, c, 1, length], with the same weights. */
    gboolean one = w->shape.ndim == 3;
    SimConvParams p = sim_conv_params(w->shape.dims[0], one ? 1 : (int)w->shape.dims[2],
                                      (int)w->shape.dims[one ? 2 : 3]);
    int kernel[2];
    if (!onnx_spatial_attrs(im, n, x, kernel, p.stride, p.padding, p.dilation))
      return FALSE;
    p.groups = (int)onnx_attr_int(n, "group", 1);
    p.bias = n->n_input > 2 && *n->input[2];
    if (p.bias && !onnx_leaf_input(im, n, 2, "bias"))
      return FALSE;
    const char *after = onnx_fold_relu(im, out, &p.activation);
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int x2 = onnx_as_2d(im, n, index, x->tensor);
    if (x2 < 0)
      return FALSE;
    int t = sim_graph_conv2d(im->g, name, x2, &p);
    if (!onnx_built(im, n, t))
      return FALSE;
    if ((t = onnx_from_2d(im, n, index, x->tensor, t)) < 0)
      return FALSE;
    onnx_set_tensor(im, after, t);
    return TRUE;
  }
  if (!strcmp(op, "MaxPool") || !strcmp(op, "AveragePool")) {
    Value *x;
    if (!onnx_padded_tensor(im, n, &x))
      return FALSE;
    if (n->n_output > 1 && *n->output[1])
      return onnx_fail(im, n, SIM_ERROR_INVALID, "MaxPool's indices output is not supported");
    int k[2], s[2], p[2];
    if (!onnx_spatial_attrs(im, n, x, k, s, p, NULL))
      return FALSE;
    /* count_include_pad changes what an average divides by, not the work. */
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_POOL2D);
    g_autoptr(GError) err = NULL;
    int64_t kernel[2] = { k[0], k[1] }, stride[2] = { s[0], s[1] }, pad[2] = { p[0], p[1] };
    int opid = -1, x2 = onnx_as_2d(im, n, index, x->tensor);
    if (x2 < 0)
      return FALSE;
    if (sim_attrs_set_string(a, "kind", op[0] == 'M' ? "max" : "avg", &err) &&
        sim_attrs_set_ints(a, "kernel", 2, kernel, &err) &&
        sim_attrs_set_ints(a, "stride", 2, stride, &err) &&
        sim_attrs_set_ints(a, "padding", 2, pad, &err) &&
        sim_attrs_set_int(a, "ceil_mode", onnx_attr_int(n, "ceil_mode", 0) != 0, &err))
      opid = sim_graph_add_op(im->g, SIM_OP_POOL2D, name, 1, &x2, a, &err);
    if (opid < 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
    int t = onnx_from_2d(im, n, index, x->tensor, sim_graph_op_output(im->g, opid, 0));
    if (t < 0)
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "GlobalAveragePool") || !strcmp(op, "GlobalMaxPool")) {
    int x0, x;
    if (!onnx_tensor_of(im, n, 0, &x0) || (x = onnx_as_2d(im, n, index, x0)) < 0)
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int kh = (int)s.dims[2], kw = (int)s.dims[3];
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_pool2d(im->g, name, x, op[6] == 'A' ? SIM_POOL_AVG : SIM_POOL_MAX, kh, kw,
                             kh, kw, 0, 0);
    if (!onnx_built(im, n, t) || (t = onnx_from_2d(im, n, index, x0, t)) < 0)
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Pad")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t pads[2 * SIM_MAX_DIMS];
    int np = onnx_attr_ints(n, "pads", pads, 2 * SIM_MAX_DIMS);
    if (n->n_input > 1 && *n->input[1] && !onnx_const_ints(im, n, 1, pads, &np, 2 * SIM_MAX_DIMS))
      return FALSE;
    char buf[32];
    const char *mode = onnx_attr_string(n, "mode", buf, sizeof buf);
    gboolean ok = (!mode || !strcmp(mode, "constant")) && s.ndim == 4 && np == 8 &&
                  pads[0] == 0 && pads[1] == 0 && pads[4] == 0 && pads[5] == 0 &&
                  pads[2] == pads[6] && pads[3] == pads[7];
    if (!ok)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "only constant, symmetric padding of the height "
                  "and width of an image is supported (before a convolution or pooling)");
    Value v = { .kind = V_TENSOR, .tensor = x, .pad = { (int)pads[2], (int)pads[3] } };
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "BatchNormalization")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    if (!onnx_leaf_input(im, n, 1, "scale") || !onnx_leaf_input(im, n, 2, "shift"))
      return FALSE;
    SimUnaryKind act = SIM_UNARY_IDENTITY;
    const char *after = onnx_fold_relu(im, out, &act);
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_batchnorm(im->g, name, x, act == SIM_UNARY_RELU);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, after, t);
    /* Training mode's running mean and variance are buffers, not activations. */
    return TRUE;
  }
  if (!strcmp(op, "LayerNormalization")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t axis = onnx_attr_int(n, "axis", -1);
    if (axis != -1 && axis != s.ndim - 1)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "normalization over axis %" G_GINT64_FORMAT
                  "; only the last dimension is supported", axis);
    if (!onnx_leaf_input(im, n, 1, "scale"))
      return FALSE;
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_layernorm(im->g, name, x);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Gemm")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    if (onnx_attr_int(n, "transA", 0))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "transA is not supported");
    Value *w = onnx_leaf_input(im, n, 1, "weight");
    if (!w)
      return FALSE;
    if (w->shape.ndim != 2)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "the weight has rank %d, not 2", w->shape.ndim);
    int64_t outf = onnx_attr_int(n, "transB", 0) ? w->shape.dims[0] : w->shape.dims[1];
    gboolean bias = n->n_input > 2 && *n->input[2];
    if (bias && !onnx_leaf_input(im, n, 2, "bias"))
      return FALSE;
    return onnx_emit_linear(im, n, index, x, outf, bias);
  }
  if (!strcmp(op, "MatMul")) {
    Value *b = onnx_value_get(im, n->n_input > 1 ? n->input[1] : NULL);
    if (!b)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "input 1 is not made by an earlier node");
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    gboolean fused = FALSE;
    if (b->kind == V_LEAF && b->shape.ndim == 2 && !onnx_fuse_swiglu(im, index, x, &fused))
      return FALSE;
    if (fused)
      return TRUE;
    if (b->kind == V_LEAF && b->shape.ndim == 2)
      return onnx_emit_linear(im, n, index, x, b->shape.dims[1], FALSE);
    int y;
    if (!onnx_tensor_of(im, n, 1, &y))
      return FALSE;
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_matmul(im->g, name, x, y, FALSE);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Constants of positions and masks, and GELU written out: GELU met at its first node,
 * Range, ConstantOfShape, Where of constants. */
static gboolean node_elementwise(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                                 const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  const char *gelu_out = !strcmp(op, "Div") && in0 && in0->kind == V_TENSOR
                           ? onnx_fold_gelu(im, n->input[0]) : NULL;
  if (gelu_out) {
    /* GELU written out, met at its first node when no linear came before it. */
    const char *y = gelu_out;
    int t0;
    if (!onnx_tensor_of(im, n, 0, &t0))
      return FALSE;
    g_autofree char *name = onnx_op_name(im, n, index, "/gelu");
    int t = sim_graph_unary(im->g, name, t0, SIM_UNARY_GELU);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, y, t);
    return TRUE;
  }
  if (!strcmp(op, "Range") && onnx_all_const(im, n, 0, 2)) {
    double start = 0, limit = 0, delta = 1;
    if (!onnx_is_scalar_const(im, n->input[0], &start) || !onnx_is_scalar_const(im, n->input[1], &limit) ||
        !onnx_is_scalar_const(im, n->input[2], &delta) || delta == 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "expected scalar start, limit and a non-zero delta");
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
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "ConstantOfShape")) {
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!onnx_const_ints(im, n, 0, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    Value v = { .kind = V_CONST, .shape = sim_shape_make(nd, dims), .dtype = SIM_DTYPE_FP32 };
    const Onnx__AttributeProto *a = onnx_attr(n, "value");
    Value fill = { 0 };
    if (a && a->t && !onnx_tensor_value(im, a->t, &fill, n))
      return FALSE;
    v.is_int = fill.kind == V_CONST && fill.is_int;
    if (sim_shape_numel(&v.shape) > CONST_MAX) {
      v.kind = V_LEAF;
      v.data_only = TRUE;
    } else {
      for (int64_t i = 0; i < sim_shape_numel(&v.shape); i++)
        v.data[i] = fill.kind == V_CONST ? fill.data[0] : 0;
    }
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  if (!strcmp(op, "Where") && n->n_input == 3 && onnx_all_const(im, n, 0, 2)) {
    /* Shape arithmetic: expand(n, -1, -1) exports a Where over the target shape. */
    Value *c = onnx_value_get(im, n->input[0]), *a = onnx_value_get(im, n->input[1]),
          *b = onnx_value_get(im, n->input[2]);
    int64_t nc = onnx_const_numel(c), na = onnx_const_numel(a), nb = onnx_const_numel(b);
    int64_t nr = MAX(nc, MAX(na, nb));
    if ((nc != nr && nc != 1) || (na != nr && na != 1) || (nb != nr && nb != 1))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "constant operands of %" G_GINT64_FORMAT ", %"
                  G_GINT64_FORMAT " and %" G_GINT64_FORMAT " values", nc, na, nb);
    Value r = *(na == nr ? a : nb == nr ? b : c);
    r.is_int = a->is_int && b->is_int;
    for (int64_t i = 0; i < nr; i++)
      r.data[i] = c->data[nc == 1 ? 0 : i] != 0 ? a->data[na == 1 ? 0 : i]
                                                 : b->data[nb == 1 ? 0 : i];
    onnx_value_set(im, out, &r);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* What masks and positions are made of on computed tensors: Where, Neg, Expand, Trilu,
 * Equal, Not. */
static gboolean node_masks(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                           const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  Value *w1 = n->n_input == 3 ? onnx_value_get(im, n->input[1]) : NULL;
  Value *w2 = n->n_input == 3 ? onnx_value_get(im, n->input[2]) : NULL;
  gboolean ta = w1 && w1->kind == V_TENSOR, tb = w2 && w2->kind == V_TENSOR;
  if (!strcmp(op, "Where") && (ta || tb)) {
    /* masked_fill and its kin on a computed tensor: one element-wise pass over the
     * tensor(s) it selects from; the condition (a mask) only decides which. */
    int x, y;
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t;
    if (ta && tb) {
      if (!onnx_tensor_of(im, n, 1, &x) || !onnx_tensor_of(im, n, 2, &y))
        return FALSE;
      t = sim_graph_binary(im->g, name, x, y, SIM_BINARY_ADD);
    } else {
      if (!onnx_tensor_of(im, n, ta ? 1 : 2, &x))
        return FALSE;
      t = sim_graph_unary(im->g, name, x, SIM_UNARY_IDENTITY);
    }
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Neg") && in0 && in0->kind == V_TENSOR) {
    /* A negation (rotate_half of rotary embeddings): a scaling by -1, one pass. */
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
    g_autoptr(GError) err = NULL;
    sim_attrs_set_string(a, "kind", "scale", NULL);
    sim_attrs_set_float(a, "scale", -1.0, NULL);
    int opid = sim_graph_add_op(im->g, SIM_OP_UNARY, name, 1, &in0->tensor, a, &err);
    if (opid < 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
    onnx_set_tensor(im, out, sim_graph_op_output(im->g, opid, 0));
    return TRUE;
  }
  if (!strcmp(op, "Expand") && in0->kind == V_TENSOR) {
    /* A computed tensor stretched along dimensions of size 1 (the keys and values of
     * grouped-query attention, x[:, :, None].expand(...) then a reshape): copies of it
     * joined along each such dimension, the copy that the reshape after it makes. */
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!onnx_const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    int t = in0->tensor;
    SimShape a = sim_graph_tensor_shape(im->g, t);
    if (nd > a.ndim) {
      int64_t lead[SIM_MAX_DIMS];
      int extra = nd - a.ndim;
      for (int d = 0; d < nd; d++)
        lead[d] = d < extra ? 1 : a.dims[d - extra];
      g_autofree char *name = onnx_op_name(im, n, index, "/rank");
      t = sim_graph_reshape(im->g, name, t, nd, lead);
      if (!onnx_built(im, n, t))
        return FALSE;
      a = sim_graph_tensor_shape(im->g, t);
    }
    for (int d = 0; d < a.ndim; d++) {
      int64_t want = d - (a.ndim - nd) >= 0 ? dims[d - (a.ndim - nd)] : 1;
      if (want == a.dims[d] || want == 1 || want == -1)
        continue;
      if (a.dims[d] != 1 || want > 64)
        return onnx_fail(im, n, SIM_ERROR_INVALID, "dimension %d of size %" G_GINT64_FORMAT
                    " cannot stretch to %" G_GINT64_FORMAT " (only size 1, to at most 64)",
                    d, a.dims[d], want);
      int copies[64];
      for (int64_t c = 0; c < want; c++)
        copies[c] = t;
      g_autofree char *name = onnx_op_name(im, n, index, NULL);
      g_autofree char *uname = onnx_free_name(im, name);
      t = sim_graph_concat(im->g, uname, d, (int)want, copies);
      if (!onnx_built(im, n, t))
        return FALSE;
    }
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Expand") && onnx_is_learned(in0)) {
    /* A learned tensor stretched over the batch (a ViT's class token,
     * class_token.expand(n, -1, -1)): the embedding of onnx_learned_tensor() read by ids of the
     * stretched shape. */
    int64_t dims[SIM_MAX_DIMS];
    int nd = 0;
    if (!onnx_const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
      return FALSE;
    SimShape a = in0->shape, r = { .ndim = MAX(a.ndim, nd) };
    for (int d = 0; d < r.ndim; d++) {
      int64_t x = d - (r.ndim - a.ndim) >= 0 ? a.dims[d - (r.ndim - a.ndim)] : 1;
      int64_t y = d - (r.ndim - nd) >= 0 ? dims[d - (r.ndim - nd)] : 1;
      r.dims[d] = MAX(x, y);
    }
    if (a.ndim < 1 || r.dims[r.ndim - 1] != a.dims[a.ndim - 1])
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a learned tensor is stretched only along "
                  "other dimensions than its last");
    SimShape lead = r;
    lead.ndim = r.ndim - 1;
    if (lead.ndim == 0) {
      lead.ndim = 1;
      lead.dims[0] = 1;
    }
    int t = onnx_learned_tensor(im, n, n->input[0], in0, &lead);
    if (t < 0)
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if ((!strcmp(op, "Trilu") || !strcmp(op, "Where") || !strcmp(op, "Expand") ||
       !strcmp(op, "Equal") || !strcmp(op, "Not") || !strcmp(op, "Neg")) &&
      in0->kind != V_TENSOR) {
    /* Masks built from constants: only their shape matters (an input where used). */
    for (size_t i = 0; i < n->n_input; i++) {
      Value *v = onnx_value_get(im, n->input[i]);
      if (*n->input[i] && (!v || v->kind == V_TENSOR || (v->kind == V_LEAF && !v->data_only)))
        return onnx_fail(im, n, SIM_ERROR_INVALID, "%s is supported only on constants (masks)", op);
    }
    Value v = *in0;
    if (!strcmp(op, "Where"))
      v = *onnx_value_get(im, n->input[1]);
    if (!strcmp(op, "Expand")) {
      int64_t dims[SIM_MAX_DIMS];
      int nd = 0;
      if (!onnx_const_ints(im, n, 1, dims, &nd, SIM_MAX_DIMS))
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
    onnx_value_set(im, out, &v);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Arithmetic on tensors: Add, Sub, Mul and Div (with a scalar constant, a scaling or a
 * shift), and Clip (ReLU6, ReLU). */
static gboolean node_arithmetic(Importer *im, const Onnx__NodeProto *n, int index,
                                const char *op, const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div")) {
    /* With a scalar constant: a scaling (Mul, Div) or a shift (Add, Sub), one
     * memory-bound pass either way. */
    double c = 0;
    int ci = onnx_is_scalar_const(im, n->input[1], &c)   ? 1
             : onnx_is_scalar_const(im, n->input[0], &c) ? 0
                                                    : -1;
    if (!strcmp(op, "Div") && ci == 0)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "a constant divided by a tensor is not supported");
    if (ci >= 0) {
      int x;
      if (!onnx_tensor_of(im, n, 1 - ci, &x))
        return FALSE;
      gboolean scale = op[0] == 'M' || op[0] == 'D';
      g_autofree char *name = onnx_op_name(im, n, index, NULL);
      int t;
      if (scale) {
        g_autoptr(SimAttrs) a = sim_attrs_new(SIM_OP_UNARY);
        g_autoptr(GError) err = NULL;
        sim_attrs_set_string(a, "kind", "scale", NULL);
        sim_attrs_set_float(a, "scale", op[0] == 'D' ? 1.0 / c : c, NULL);
        int opid = sim_graph_add_op(im->g, SIM_OP_UNARY, name, 1, &x, a, &err);
        if (opid < 0)
          return onnx_fail(im, n, SIM_ERROR_INVALID, "%s", err->message);
        t = sim_graph_op_output(im->g, opid, 0);
      } else {
        t = sim_graph_unary(im->g, name, x, SIM_UNARY_IDENTITY);
      }
      if (!onnx_built(im, n, t))
        return FALSE;
      onnx_set_tensor(im, out, t);
      return TRUE;
    }
    int a, b;
    if (!onnx_tensor_of(im, n, 0, &a) || !onnx_tensor_of(im, n, 1, &b))
      return FALSE;
    static const SimBinaryKind kinds[] = { ['A'] = SIM_BINARY_ADD, ['S'] = SIM_BINARY_SUB,
                                           ['M'] = SIM_BINARY_MUL, ['D'] = SIM_BINARY_DIV };
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_binary(im->g, name, a, b, kinds[(unsigned char)op[0]]);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Clip")) {
    /* torch.nn.ReLU6 (MobileNet) is Clip to [0, 6]; the bounds are inputs from opset 11,
     * attributes before. */
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    double lo = onnx_attr_float(n, "min", -INFINITY), hi = onnx_attr_float(n, "max", INFINITY);
    if ((n->n_input > 1 && *n->input[1] && !onnx_is_scalar_const(im, n->input[1], &lo)) ||
        (n->n_input > 2 && *n->input[2] && !onnx_is_scalar_const(im, n->input[2], &hi)))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "the bounds must be scalar constants");
    SimUnaryKind kind;
    if (lo == 0 && hi == 6)
      kind = SIM_UNARY_RELU6;
    else if (lo == 0 && isinf(hi) && hi > 0)
      kind = SIM_UNARY_RELU;
    else
      return onnx_fail(im, n, SIM_ERROR_INVALID, "clips to [%g, %g]; only [0, 6] (ReLU6) and "
                  "[0, inf) (ReLU) are supported", lo, hi);
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_unary(im->g, name, x, kind);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

/* Activations (SiLU found as x times its sigmoid), Softmax and Dropout. */
static gboolean node_activations(Importer *im, const Onnx__NodeProto *n, int index, const char *op,
                                 const char *out, Value *in0, gboolean *done)
{
  *done = TRUE;
  static const struct { const char *onnx; SimUnaryKind kind; } unaries[] = {
    { "Relu", SIM_UNARY_RELU }, { "Gelu", SIM_UNARY_GELU }, { "Sigmoid", SIM_UNARY_SIGMOID },
    { "Tanh", SIM_UNARY_TANH }, { "Exp", SIM_UNARY_EXP },
  };
  for (size_t u = 0; u < G_N_ELEMENTS(unaries); u++) {
    if (strcmp(op, unaries[u].onnx) != 0)
      continue;
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    SimUnaryKind kind = unaries[u].kind;
    const char *after = out;
    /* SiLU: x * sigmoid(x). */
    if (kind == SIM_UNARY_SIGMOID) {
      int c = onnx_sole_consumer(im, out);
      const Onnx__NodeProto *m = onnx_node(im, c);
      if (m && !strcmp(m->op_type, "Mul") && m->n_input == 2 &&
          (!strcmp(m->input[0], n->input[0]) || !strcmp(m->input[1], n->input[0]))) {
        kind = SIM_UNARY_SILU;
        im->skip[c] = TRUE;
        after = m->output[0];
      }
    }
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_unary(im->g, name, x, kind);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, after, t);
    return TRUE;
  }
  if (!strcmp(op, "Softmax")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    SimShape s = sim_graph_tensor_shape(im->g, x);
    int64_t axis = onnx_attr_int(n, "axis", -1);
    if (axis != -1 && axis != s.ndim - 1)
      return onnx_fail(im, n, SIM_ERROR_INVALID, "softmax over axis %" G_GINT64_FORMAT "; only the "
                  "last dimension is supported", axis);
    g_autofree char *name = onnx_op_name(im, n, index, NULL);
    int t = sim_graph_softmax(im->g, name, x);
    if (!onnx_built(im, n, t))
      return FALSE;
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  if (!strcmp(op, "Dropout")) {
    int x;
    if (!onnx_tensor_of(im, n, 0, &x))
      return FALSE;
    double p = onnx_attr_float(n, "ratio", 0.5);
    if (n->n_input > 1 && *n->input[1] && !onnx_is_scalar_const(im, n->input[1], &p))
      return onnx_fail(im, n, SIM_ERROR_INVALID, "the ratio must be a constant");
    gboolean training = TRUE;
    double tm = 1;
    if (n->n_input > 2 && *n->input[2] && onnx_is_scalar_const(im, n->input[2], &tm))
      training = tm != 0;
    int t = x;
    if (training && p > 0) {
      g_autofree char *name = onnx_op_name(im, n, index, NULL);
      t = sim_graph_dropout(im->g, name, x, p);
      if (!onnx_built(im, n, t))
        return FALSE;
    }
    onnx_set_tensor(im, out, t);
    return TRUE;
  }
  *done = FALSE;
  return TRUE;
}

gboolean onnx_import_node(Importer *im, int index)
{
  const Onnx__NodeProto *n = im->graph->node[index];
  const char *op = n->op_type;
  if (!op || !*op) {
    g_autofree char *place = g_strdup_printf("node %d", index);
    sim_set_error_at(im->error, SIM_ERROR_PARSE, im->filename, place, "no operator type");
    return FALSE;
  }
  if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx") != 0)
    return onnx_fail(im, n, SIM_ERROR_UNKNOWN, "operator of domain '%s' is not supported",
                n->domain);
  const char *out = n->n_output ? n->output[0] : NULL;
  Value *in0 = n->n_input ? onnx_value_get(im, n->input[0]) : NULL;
  if (n->n_input && *n->input[0] && !in0)
    return onnx_fail(im, n, SIM_ERROR_INVALID, "input '%s' is not made by an earlier node",
                n->input[0]);


  static gboolean (*const steps[])(Importer *, const Onnx__NodeProto *, int, const char *,
                                   const char *, Value *, gboolean *) = {
    node_values, node_layout, node_reshape, node_layers, node_elementwise, node_masks,
    node_arithmetic, node_activations,
  };
  for (size_t k = 0; k < G_N_ELEMENTS(steps); k++) {
    gboolean done = FALSE;
    gboolean ok = steps[k](im, n, index, op, out, in0, &done);
    if (done)
      return ok;
  }
  return onnx_fail(im, n, SIM_ERROR_UNKNOWN, "operator %s is not supported by the importer "
              "(parasol import --check lists every unsupported node)", op);
}

#endif /* PARASOL_HAVE_ONNX */
