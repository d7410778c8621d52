/* attrs.c — operator attributes: the sets the builders and readers fill (SimAttrs), checked
 * against the operator class's specification, and the reads the operator classes make of
 * an operator's values. */
#include "sim-private.h"

#include <math.h>
#include <string.h>

int sim_op_class_attr_index(const SimOpClass *c, const char *name)
{
  for (int i = 0; i < c->n_attrs; i++)
    if (strcmp(c->attrs[i].name, name) == 0)
      return i;
  return -1;
}

static const char *attr_type_phrase(SimAttrType t)
{
  switch (t) {
  case SIM_ATTR_INT: return "an integer";
  case SIM_ATTR_BOOL: return "a boolean";
  case SIM_ATTR_FLOAT: return "a finite number";
  case SIM_ATTR_INTS: return "a list of integers";
  case SIM_ATTR_ENUM: return "a name";
  }
  return "a value";
}

static char *enum_choices(const SimAttrSpec *s)
{
  GString *str = g_string_new(NULL);
  for (int i = 0; s->enum_names[i]; i++)
    g_string_append_printf(str, "%s%s", i ? ", " : "", s->enum_names[i]);
  return g_string_free(str, FALSE);
}

/* Finds attribute @name of @a's class, or sets an error that lists the known ones. */
static SimAttrValue *attr_lookup(SimAttrs *a, const char *name, const SimAttrSpec **spec,
                                 GError **error)
{
  const SimOpClass *c = sim_op_class(a->type);
  int i = sim_op_class_attr_index(c, name);
  if (i < 0) {
    GString *known = g_string_new(NULL);
    for (int j = 0; j < c->n_attrs; j++)
      g_string_append_printf(known, "%s%s", j ? ", " : "", c->attrs[j].name);
    g_set_error(error, SIM_ERROR, SIM_ERROR_UNKNOWN,
                "op type '%s' has no attribute '%s' (it has: %s)", c->name, name,
                c->n_attrs ? known->str : "none");
    g_string_free(known, TRUE);
    return NULL;
  }
  *spec = &c->attrs[i];
  return &a->v[i];
}

static gboolean wrong_type(SimAttrs *a, const SimAttrSpec *s, const char *given, GError **error)
{
  g_autofree char *choices = s->type == SIM_ATTR_ENUM ? enum_choices(s) : NULL;
  g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
              "op type '%s': attribute '%s' takes %s%s%s%s, not %s",
              sim_op_type_name(a->type), s->name, attr_type_phrase(s->type),
              choices ? " (one of " : "", choices ? choices : "", choices ? ")" : "", given);
  return FALSE;
}

SimAttrs *sim_attrs_new(SimOpType type)
{
  g_return_val_if_fail(type >= 0 && type < SIM_OP_COUNT, NULL);
  SimAttrs *a = g_new0(SimAttrs, 1);
  a->type = type;
  return a;
}

void sim_attrs_free(SimAttrs *a)
{
  g_free(a);
}

gboolean sim_attrs_set_int(SimAttrs *a, const char *name, int64_t v, GError **error)
{
  g_return_val_if_fail(a != NULL && name != NULL, FALSE);
  const SimAttrSpec *s = NULL;
  SimAttrValue *val = attr_lookup(a, name, &s, error);
  if (!val)
    return FALSE;
  g_autofree char *given = g_strdup_printf("the integer %" G_GINT64_FORMAT, v);
  switch (s->type) {
  case SIM_ATTR_INT:
    val->i[0] = v;
    val->n = 1;
    break;
  case SIM_ATTR_BOOL:
    if (v != 0 && v != 1)
      return wrong_type(a, s, given, error);
    val->i[0] = v;
    val->n = 1;
    break;
  case SIM_ATTR_FLOAT:
    val->f = (double)v;
    break;
  case SIM_ATTR_INTS:
    /* A single number for a list means that number in every position (a 3x3 kernel
     * written as 3); the class expands it. */
    val->i[0] = v;
    val->n = 1;
    break;
  case SIM_ATTR_ENUM:
    return wrong_type(a, s, given, error);
  }
  val->set = TRUE;
  return TRUE;
}

gboolean sim_attrs_set_ints(SimAttrs *a, const char *name, int n, const int64_t *v,
                            GError **error)
{
  g_return_val_if_fail(a != NULL && name != NULL && n >= 0 && (n == 0 || v != NULL), FALSE);
  const SimAttrSpec *s = NULL;
  SimAttrValue *val = attr_lookup(a, name, &s, error);
  if (!val)
    return FALSE;
  if (s->type != SIM_ATTR_INTS)
    return wrong_type(a, s, "a list", error);
  if (n > SIM_MAX_DIMS) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "op type '%s': attribute '%s' holds at most %d values, not %d",
                sim_op_type_name(a->type), name, SIM_MAX_DIMS, n);
    return FALSE;
  }
  val->n = n;
  for (int i = 0; i < n; i++)
    val->i[i] = v[i];
  val->set = TRUE;
  return TRUE;
}

gboolean sim_attrs_set_float(SimAttrs *a, const char *name, double v, GError **error)
{
  g_return_val_if_fail(a != NULL && name != NULL, FALSE);
  const SimAttrSpec *s = NULL;
  SimAttrValue *val = attr_lookup(a, name, &s, error);
  if (!val)
    return FALSE;
  g_autofree char *given = g_strdup_printf("the number %g", v);
  switch (s->type) {
  case SIM_ATTR_FLOAT:
    /* Graph files are JSON, which has no infinities or NaNs. */
    if (!isfinite(v))
      return wrong_type(a, s, given, error);
    val->f = v;
    break;
  case SIM_ATTR_INT:
    /* JSON writers print 64 as 64.0 now and then; integral numbers are accepted. */
    if (!isfinite(v) || v != floor(v) || fabs(v) > 9.0e15)
      return wrong_type(a, s, given, error);
    val->i[0] = (int64_t)v;
    val->n = 1;
    break;
  default:
    return wrong_type(a, s, given, error);
  }
  val->set = TRUE;
  return TRUE;
}

gboolean sim_attrs_set_string(SimAttrs *a, const char *name, const char *v, GError **error)
{
  g_return_val_if_fail(a != NULL && name != NULL && v != NULL, FALSE);
  const SimAttrSpec *s = NULL;
  SimAttrValue *val = attr_lookup(a, name, &s, error);
  if (!val)
    return FALSE;
  g_autofree char *given = g_strdup_printf("'%s'", v);
  if (s->type == SIM_ATTR_BOOL) {
    if (g_ascii_strcasecmp(v, "true") == 0)
      val->i[0] = 1;
    else if (g_ascii_strcasecmp(v, "false") == 0)
      val->i[0] = 0;
    else
      return wrong_type(a, s, given, error);
    val->n = 1;
    val->set = TRUE;
    return TRUE;
  }
  if (s->type != SIM_ATTR_ENUM)
    return wrong_type(a, s, given, error);
  int idx = -1;
  for (int i = 0; s->enum_names[i]; i++)
    if (strcmp(v, s->enum_names[i]) == 0)
      idx = i;
  /* Data types also take their other spellings ("float16", "half"). */
  if (idx < 0 && s->enum_names == sim_dtype_names)
    idx = sim_dtype_from_name(v);
  if (idx < 0)
    return wrong_type(a, s, given, error);
  val->i[0] = idx;
  val->n = 1;
  val->set = TRUE;
  return TRUE;
}

const SimAttrValue *sim_op_attr(const SimOp *op, const char *name)
{
  int i = sim_op_class_attr_index(sim_op_class(op->type), name);
  if (i < 0) {
    g_critical("op type '%s' has no attribute '%s'", sim_op_type_name(op->type), name);
    return NULL;
  }
  return &op->attrs[i];
}

int64_t sim_op_attr_int(const SimOp *op, const char *name)
{
  const SimAttrValue *v = sim_op_attr(op, name);
  return v ? v->i[0] : 0;
}

double sim_op_attr_float(const SimOp *op, const char *name)
{
  const SimAttrValue *v = sim_op_attr(op, name);
  return v ? v->f : 0.0;
}
