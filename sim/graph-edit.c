/* graph-edit.c — reading an operator's attributes back, so that graph rewrites (the
 * search's substitutions) can rebuild an operator with a change through the public
 * builder, sim_graph_add_op(), and every check and shape inference runs again. */
#include "sim-private.h"

#include <string.h>

SimAttrs *sim_graph_op_attrs(const SimGraph *g, int op)
{
  g_return_val_if_fail(g != NULL && op >= 0 && op < sim_graph_n_ops(g), NULL);
  const SimOp *o = sim_graph_op_get(g, op);
  const SimOpClass *c = sim_op_class(o->type);
  SimAttrs *a = sim_attrs_new(o->type);
  for (int i = 0; i < c->n_attrs && i < SIM_MAX_ATTRS; i++) {
    a->v[i] = o->attrs[i];
    a->v[i].set = TRUE;
  }
  return a;
}

SimOpType sim_attrs_get_type(const SimAttrs *a)
{
  g_return_val_if_fail(a != NULL, SIM_OP_INPUT);
  return a->type;
}

/* The value of attribute @name of @a, with its spec, or NULL for a name the type lacks. */
static const SimAttrValue *lookup(const SimAttrs *a, const char *name, const SimAttrSpec **spec)
{
  const SimOpClass *c = sim_op_class(a->type);
  for (int i = 0; i < c->n_attrs && i < SIM_MAX_ATTRS; i++) {
    if (strcmp(c->attrs[i].name, name) == 0) {
      *spec = &c->attrs[i];
      return &a->v[i];
    }
  }
  return NULL;
}

/* An attribute that was never set reads as its class's default, as the builder fills it. */
gboolean sim_attrs_get_int(const SimAttrs *a, const char *name, int64_t *v)
{
  g_return_val_if_fail(a != NULL && name != NULL && v != NULL, FALSE);
  const SimAttrSpec *s = NULL;
  const SimAttrValue *val = lookup(a, name, &s);
  if (!val || (s->type != SIM_ATTR_INT && s->type != SIM_ATTR_BOOL && s->type != SIM_ATTR_ENUM))
    return FALSE;
  *v = val->set ? val->i[0] : (int64_t)s->default_value;
  return TRUE;
}

int sim_attrs_get_ints(const SimAttrs *a, const char *name, int64_t *v, int max)
{
  g_return_val_if_fail(a != NULL && name != NULL && (v != NULL || max == 0), -1);
  const SimAttrSpec *s = NULL;
  const SimAttrValue *val = lookup(a, name, &s);
  if (!val || s->type != SIM_ATTR_INTS)
    return -1;
  int n = val->set ? val->n : 0;
  for (int i = 0; i < n && i < max; i++)
    v[i] = val->i[i];
  return n;
}

gboolean sim_attrs_get_float(const SimAttrs *a, const char *name, double *v)
{
  g_return_val_if_fail(a != NULL && name != NULL && v != NULL, FALSE);
  const SimAttrSpec *s = NULL;
  const SimAttrValue *val = lookup(a, name, &s);
  if (!val || s->type != SIM_ATTR_FLOAT)
    return FALSE;
  *v = val->set ? val->f : s->default_value;
  return TRUE;
}
