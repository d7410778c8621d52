/* report.c — what one simulated iteration tells: time, throughput, utilization, where the
 * time goes on each device and along the critical path, the busiest links, memory. */
#include "report.h"
#include "steady.h"
#include "taskgraph.h"
#include "engine.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  double a, b;
} Interval;

static int interval_cmp(const void *x, const void *y)
{
  const Interval *p = x, *q = y;
  if (p->a != q->a)
    return p->a < q->a ? -1 : 1;
  return (p->b > q->b) - (p->b < q->b);
}

/* Sorts (unless they already are) and merges @v in place; returns the number of
 * disjoint intervals. */
static int merge_intervals(Interval *v, int n)
{
  if (n == 0)
    return 0;
  gboolean sorted = TRUE;
  for (int i = 1; i < n && sorted; i++)
    sorted = interval_cmp(&v[i - 1], &v[i]) <= 0;
  if (!sorted)
    qsort(v, (size_t)n, sizeof *v, interval_cmp);
  int k = 0;
  for (int i = 1; i < n; i++) {
    if (v[i].a <= v[k].b) {
      if (v[i].b > v[k].b)
        v[k].b = v[i].b;
    } else {
      v[++k] = v[i];
    }
  }
  return k + 1;
}

static double total_length(const Interval *v, int n)
{
  double s = 0;
  for (int i = 0; i < n; i++)
    s += v[i].b - v[i].a;
  return s;
}

static double overlap_length(const Interval *a, int na, const Interval *b, int nb)
{
  double s = 0;
  int i = 0, j = 0;
  while (i < na && j < nb) {
    double lo = MAX(a[i].a, b[j].a), hi = MIN(a[i].b, b[j].b);
    if (hi > lo)
      s += hi - lo;
    if (a[i].b < b[j].b)
      i++;
    else
      j++;
  }
  return s;
}

static int link_use_cmp(const void *x, const void *y)
{
  const SimLinkUse *p = x, *q = y;
  if (p->bytes != q->bytes)
    return p->bytes > q->bytes ? -1 : 1;
  return strcmp(p->name, q->name);
}

static SimDType graph_compute_dtype(const SimGraph *g)
{
  for (int t = 0; t < sim_graph_n_tensors(g); t++) {
    SimDType dt = sim_graph_tensor_dtype(g, t);
    if (dt == SIM_DTYPE_FP32 || dt == SIM_DTYPE_FP16 || dt == SIM_DTYPE_BF16 ||
        dt == SIM_DTYPE_FP8)
      return dt;
  }
  return SIM_DTYPE_FP32;
}

/* The busiest links, by bytes carried (@link_bytes: per link), most used first. */
static void report_links(SimReport *r, const SimMachine *m, const double *link_bytes)
{
  int nl = sim_machine_n_links(m);
  GArray *uses = g_array_new(FALSE, FALSE, sizeof(SimLinkUse));
  for (int l = 0; l < nl; l++) {
    if (link_bytes[l] <= 0)
      continue;
    SimLinkUse u = { (char *)sim_machine_link_name(m, l), link_bytes[l], 0 };
    double cap = sim_machine_link_bandwidth(m, l) * r->iteration_time;
    u.utilization = cap > 0 ? u.bytes / cap : 0;
    g_array_append_val(uses, u);
  }
  if (uses->len > 1) /* an empty GArray's data is NULL, which qsort may not be given */
    qsort(uses->data, uses->len, sizeof(SimLinkUse), link_use_cmp);
  r->n_links = MIN((int)uses->len, 10);
  r->links = g_new0(SimLinkUse, r->n_links > 0 ? r->n_links : 1);
  for (int i = 0; i < r->n_links; i++) {
    r->links[i] = g_array_index(uses, SimLinkUse, i);
    r->links[i].name = g_strdup(r->links[i].name);
  }
  g_array_free(uses, TRUE);
}

/* A merged run @t that took in rings (SimTaskGraph.rings): its steps, each as the engine
 * timed it from the run's start, the tasks' into the compute intervals of its device, the
 * rings' into the communication intervals of their members (folded devices aside). */
static void ring_steps(const SimTaskGraph *tg, const SimTimeline *tl, int32_t t,
                       GArray **cint, GArray **mint, const int *rep_of)
{
  const SimTask *k = &tg->task[t];
  double at = tl->start[t];
  Interval run = { at, at };
  for (size_t i = (size_t)k->peer;; i++) {
    double end = at + fabs(tg->chain_dur[i]);
    if (tg->chain_ring[i] >= 0) {
      if (run.b > run.a)
        g_array_append_val(cint[k->device], run);
      Interval iv = { at, end };
      const SimTask *r = &tg->rings[tg->chain_ring[i]];
      const int32_t *mem = sim_task_members(tg, r);
      for (int j = 0; j < r->n_members && iv.b > iv.a; j++) {
        int d = mem[j];
        if (rep_of && rep_of[d] != d)
          continue;
        if (!mint[d])
          mint[d] = g_array_new(FALSE, FALSE, sizeof(Interval));
        g_array_append_val(mint[d], iv);
      }
      run.a = run.b = end;
    } else {
      run.b = end;
    }
    at = end;
    if (signbit(tg->chain_dur[i]))
      break;
  }
  /* The engine ends the run at the sum of its steps, as here. */
  run.b = tl->end[t];
  if (run.b > run.a)
    g_array_append_val(cint[k->device], run);
}

/* Adds the time of the rings merged run @t took in to their class in @crit; returns it. */
static double ring_time_by_class(const SimTaskGraph *tg, int32_t t, double *crit)
{
  double sum = 0;
  for (size_t i = (size_t)tg->task[t].peer;; i++) {
    if (tg->chain_ring[i] >= 0) {
      double d = fabs(tg->chain_dur[i]);
      crit[tg->rings[tg->chain_ring[i]].cls] += d;
      sum += d;
    }
    if (signbit(tg->chain_dur[i]))
      break;
  }
  return sum;
}

SimReport *sim_report_build(const SimGraph *g, const SimMachine *m, const SimStrategy *s,
                            const SimTaskGraph *tg, const SimTimeline *tl, const int *rep_of,
                            const char *folding, const SimOptions *o, double model_flops)
{
  SimReport *r = g_new0(SimReport, 1);
  int nd = sim_machine_n_devices(m);
  r->model = g_strdup(sim_graph_get_name(g));
  r->machine_name = g_strdup(sim_machine_get_name(m));
  r->machine = m;
  r->n_devices = nd;
  r->iteration_time = tl->makespan;
  r->batch = sim_graph_batch_size(g);
  r->tokens_per_sample = sim_graph_tokens_per_sample(g);
  r->model_flops = model_flops;
  r->folding = g_strdup(folding ? folding : "none");
  r->detail = o->detail;
  r->microbatches = s->microbatches;
  r->n_stages = s->n_stages;
  r->chunks = sim_strategy_chunks_per_group(s);
  r->schedule = s->schedule;
  r->n_tasks = tg->n_tasks;
  SimDType cdt = graph_compute_dtype(g);

  r->peak_mem = g_new0(int64_t, nd);
  r->host_mem = g_memdup2(tg->host_mem, sizeof(int64_t) * (size_t)MAX(nd, 1));
  {
    /* The most any device's offloaded optimizer holds in host memory, and the most one
     * node's GPUs hold there together. */
    int nn = sim_machine_n_nodes(m);
    int64_t *node = g_new0(int64_t, MAX(nn, 1));
    for (int d = 0; d < nd; d++) {
      r->host_most = MAX(r->host_most, r->host_mem[d]);
      node[sim_machine_device_node(m, d)] += r->host_mem[d];
    }
    for (int k = 0; k < nn; k++)
      r->host_node_most = MAX(r->host_node_most, node[k]);
    g_free(node);
  }
  r->capacity = g_new0(int64_t, nd);
  r->compute = g_new0(double, nd);
  r->comm = g_new0(double, nd);
  r->overlap = g_new0(double, nd);
  r->idle = g_new0(double, nd);

  /* Per device: compute intervals (its stream, which runs them one after the other, so
   * that they come in order) and communication intervals (flows it sends or receives),
   * merged.  Folded devices take their representative's figures (below): their intervals
   * are not gathered. */
  GArray **cint = g_new0(GArray *, nd), **mint = g_new0(GArray *, nd);
#define FOLDED(d) (rep_of && rep_of[(d)] != (d))
  for (int d = 0; d < nd && d < tg->n_devices; d++) {
    int32_t lo = tg->stream_off[d], hi = tg->stream_off[d + 1];
    if (hi <= lo || FOLDED(d))
      continue;
    cint[d] = g_array_sized_new(FALSE, FALSE, sizeof(Interval), (guint)(hi - lo));
    for (int32_t i = lo; i < hi; i++) {
      int32_t t = tg->stream[i];
      if (tl->start[t] < 0)
        continue;
      if (tg->n_rings && tg->task[t].peer >= 0) {
        ring_steps(tg, tl, t, cint, mint, rep_of);
        continue;
      }
      Interval iv = { tl->start[t], tl->end[t] };
      g_array_append_val(cint[d], iv);
    }
  }
  for (int t = 0; t < tg->n_tasks; t++) {
    const SimTask *k = &tg->task[t];
    if (k->kind != SIM_TASK_FLOW || tl->start[t] < 0)
      continue;
    Interval iv = { tl->start[t], tl->end[t] };
    if (k->n_links && iv.b > iv.a) {
      /* A whole collective occupies every member. */
      const int32_t *mem = sim_task_members(tg, k);
      for (int i = 0; i < k->n_members; i++) {
        int d = mem[i];
        if (FOLDED(d))
          continue;
        if (!mint[d])
          mint[d] = g_array_new(FALSE, FALSE, sizeof(Interval));
        g_array_append_val(mint[d], iv);
      }
    } else if (k->device != k->peer && iv.b > iv.a) {
      for (int side = 0; side < 2; side++) {
        int d = side ? k->peer : k->device;
        if (FOLDED(d))
          continue;
        if (!mint[d])
          mint[d] = g_array_new(FALSE, FALSE, sizeof(Interval));
        g_array_append_val(mint[d], iv);
      }
    }
  }
  for (int d = 0; d < nd; d++) {
    int nc = 0, nm = 0;
    Interval *c = NULL, *mm = NULL;
    if (cint[d]) {
      c = (Interval *)cint[d]->data;
      nc = merge_intervals(c, (int)cint[d]->len);
    }
    if (mint[d]) {
      mm = (Interval *)mint[d]->data;
      nm = merge_intervals(mm, (int)mint[d]->len);
    }
    r->compute[d] = total_length(c, nc);
    r->comm[d] = total_length(mm, nm);
    r->overlap[d] = overlap_length(c, nc, mm, nm);
    r->idle[d] = r->iteration_time - r->compute[d];
    r->peak_mem[d] = tl->peak_mem[d];
  }
#undef FOLDED
  /* Folded devices take their representative's figures. */
  if (rep_of)
    for (int d = 0; d < nd; d++) {
      int p = rep_of[d];
      if (p == d)
        continue;
      r->compute[d] = r->compute[p];
      r->comm[d] = r->comm[p];
      r->overlap[d] = r->overlap[p];
      r->idle[d] = r->idle[p];
      r->peak_mem[d] = r->peak_mem[p];
    }
  r->fits = TRUE;
  for (int d = 0; d < nd; d++) {
    const SimDeviceSpec *spec = sim_machine_device_spec(m, d);
    r->capacity[d] = spec->mem_capacity;
    /* A plan that leaves GPUs idle (--dp 1 on an 8-GPU machine) is measured against the
     * GPUs it uses. */
    if (r->compute[d] > 0 || r->peak_mem[d] > 0) {
      r->peak_flops += spec->peak_flops[cdt];
      r->n_used++;
    }
    if (r->peak_mem[d] > r->capacity[d])
      r->fits = FALSE;
    if (cint[d])
      g_array_free(cint[d], TRUE);
    if (mint[d])
      g_array_free(mint[d], TRUE);
  }
  g_free(cint);
  g_free(mint);

  /* The critical path: from the task that ends last, follow what each task waited for. */
  int last = -1;
  for (int t = 0; t < tg->n_tasks; t++)
    if (last < 0 || tl->end[t] > tl->end[last])
      last = t;
  double covered = 0;
  for (int t = last; t >= 0; t = tl->crit[t]) {
    const SimTask *k = &tg->task[t];
    double len = tl->end[t] - tl->start[t];
    if (k->kind == SIM_TASK_COMPUTE || k->kind == SIM_TASK_FLOW || k->kind == SIM_TASK_DELAY) {
      /* A merged run's rings count as what they are. */
      double rings = tg->n_rings && k->kind == SIM_TASK_COMPUTE && k->peer >= 0
                     ? ring_time_by_class(tg, t, r->crit) : 0;
      r->crit[k->cls] += len - rings;
      covered += len;
    }
  }
  r->crit[SIM_CLASS_COUNT] = MAX(0.0, r->iteration_time - covered);

  report_links(r, m, tl->link_bytes);

  if (o->keep_timeline) {
    r->n_records = tg->n_tasks;
    r->tasks = g_memdup2(tg->task, sizeof(SimTask) * (size_t)MAX(tg->n_tasks, 1));
    size_t n_extra = 0;
    for (int t = 0; t < tg->n_tasks; t++)
      if (tg->task[t].kind == SIM_TASK_FLOW && tg->task[t].n_links)
        n_extra = MAX(n_extra, (size_t)tg->task[t].links_off + tg->task[t].n_links +
                                 tg->task[t].n_members);
    r->extra = g_memdup2(tg->extra, sizeof(int32_t) * MAX(n_extra, 1));
    r->start = g_memdup2(tl->start, sizeof(double) * (size_t)MAX(tg->n_tasks, 1));
    r->end = g_memdup2(tl->end, sizeof(double) * (size_t)MAX(tg->n_tasks, 1));
    r->n_ops = sim_graph_n_ops(g);
    r->op_names = g_new0(char *, r->n_ops + 1);
    for (int x = 0; x < r->n_ops; x++)
      r->op_names[x] = g_strdup(sim_graph_op_name(g, x));
  }
  return r;
}

void sim_report_extrapolate(SimReport *r, const SimReport *r2, const double *link_bytes,
                            const double *link_bytes2, const SimSteady *st, double time,
                            double period)
{
  double k = (double)((st->total - st->count) / st->period_mbs);
  r->iteration_time = time;
  for (int d = 0; d < r->n_devices; d++) {
    r->compute[d] += k * (r2->compute[d] - r->compute[d]);
    r->comm[d] += k * (r2->comm[d] - r->comm[d]);
    r->overlap[d] += k * (r2->overlap[d] - r->overlap[d]);
    r->idle[d] = time - r->compute[d];
  }
  double covered = 0;
  for (int c = 0; c < SIM_CLASS_COUNT; c++) {
    r->crit[c] += k * (r2->crit[c] - r->crit[c]);
    covered += r->crit[c];
  }
  r->crit[SIM_CLASS_COUNT] = MAX(0.0, time - covered);
  int nl = sim_machine_n_links(r->machine);
  double *bytes = g_new(double, MAX(nl, 1));
  for (int l = 0; l < nl; l++)
    bytes[l] = link_bytes[l] + k * (link_bytes2[l] - link_bytes[l]);
  for (int i = 0; i < r->n_links; i++)
    g_free(r->links[i].name);
  g_free(r->links);
  report_links(r, r->machine, bytes);
  g_free(bytes);
  r->n_tasks += r2->n_tasks;
  g_free(r->steady);
  r->steady = g_strdup_printf("%d and %d of %d micro-batches, then %g s per %s", st->count,
                              st->count + st->period_mbs, st->total, period,
                              st->period_mbs == 1 ? "micro-batch" : "group of micro-batches");
}

void sim_report_free(SimReport *r)
{
  if (!r)
    return;
  g_free(r->model);
  g_free(r->machine_name);
  g_strfreev(r->op_names);
  g_free(r->peak_mem);
  g_free(r->host_mem);
  g_free(r->capacity);
  g_free(r->compute);
  g_free(r->comm);
  g_free(r->overlap);
  g_free(r->idle);
  for (int i = 0; i < r->n_links; i++)
    g_free(r->links[i].name);
  g_free(r->links);
  g_free(r->folding);
  g_free(r->steady);
  g_free(r->tasks);
  g_free(r->extra);
  g_free(r->start);
  g_free(r->end);
  g_free(r);
}

double sim_report_iteration_time(const SimReport *r) { return r->iteration_time; }
int sim_report_n_devices(const SimReport *r) { return r->n_devices; }
gboolean sim_report_fits(const SimReport *r) { return r->fits; }
int64_t sim_report_n_tasks(const SimReport *r) { return r->n_tasks; }
const char *sim_report_folding(const SimReport *r) { return r->folding; }
const char *sim_report_steady(const SimReport *r) { return r->steady; }

double sim_report_throughput(const SimReport *r)
{
  return r->iteration_time > 0 ? (double)r->batch / r->iteration_time : 0;
}

double sim_report_token_throughput(const SimReport *r)
{
  return sim_report_throughput(r) * (double)MAX(r->tokens_per_sample, 1);
}

double sim_report_mfu(const SimReport *r)
{
  if (r->iteration_time <= 0 || r->peak_flops <= 0)
    return 0;
  return r->model_flops / r->iteration_time / r->peak_flops;
}

int64_t sim_report_peak_memory(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->peak_mem[dev];
}

int64_t sim_report_host_memory(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->host_mem ? r->host_mem[dev] : 0;
}

static int64_t max_host_memory(const SimReport *r, int64_t *node_most)
{
  *node_most = r->host_node_most;
  return r->host_most;
}

int64_t sim_report_max_peak_memory(const SimReport *r)
{
  int64_t m = 0;
  for (int d = 0; d < r->n_devices; d++)
    m = MAX(m, r->peak_mem[d]);
  return m;
}

double sim_report_compute_time(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->compute[dev];
}

double sim_report_comm_time(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->comm[dev];
}

double sim_report_overlap_time(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->overlap[dev];
}

double sim_report_idle_time(const SimReport *r, int dev)
{
  g_return_val_if_fail(dev >= 0 && dev < r->n_devices, 0);
  return r->idle[dev];
}

double sim_report_critical_time(const SimReport *r, const char *cls)
{
  if (!strcmp(cls, "idle"))
    return r->crit[SIM_CLASS_COUNT];
  for (int c = 0; c < SIM_CLASS_COUNT; c++)
    if (!strcmp(cls, sim_task_class_name(c)))
      return r->crit[c];
  return 0;
}

static const char *task_kind_name(int k)
{
  static const char *const names[] = { "compute", "flow", "delay", "nop" };
  return k >= 0 && k < 4 ? names[k] : "?";
}

int64_t sim_report_n_records(const SimReport *r)
{
  return r->n_records;
}

gboolean sim_report_record(const SimReport *r, int64_t i, SimTaskRecord *out)
{
  if (i < 0 || i >= r->n_records)
    return FALSE;
  const SimTask *t = &r->tasks[i];
  *out = (SimTaskRecord){ task_kind_name(t->kind), sim_task_class_name(t->cls), t->device,
                          t->peer, t->op, t->mb, t->shard, sim_task_bytes(t), r->start[i],
                          r->end[i] };
  return TRUE;
}

/* ---- printing -------------------------------------------------------------------------- */

static void fmt_bytes(char *buf, size_t n, double b)
{
  static const char *const u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    i++;
  }
  g_snprintf(buf, n, "%.2f %s", b, u[i]);
}

static void fmt_time(char *buf, size_t n, double s)
{
  if (s >= 1)
    g_snprintf(buf, n, "%.3f s", s);
  else if (s >= 1e-3)
    g_snprintf(buf, n, "%.3f ms", s * 1e3);
  else
    g_snprintf(buf, n, "%.1f us", s * 1e6);
}

static int dbl_cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void print_device_row(FILE *out, const SimReport *r, int d)
{
  char pm[32], cap[32];
  fmt_bytes(pm, sizeof pm, (double)r->peak_mem[d]);
  fmt_bytes(cap, sizeof cap, (double)r->capacity[d]);
  double T = r->iteration_time > 0 ? r->iteration_time : 1;
  fprintf(out, "  %5d  %7.1f%%  %7.1f%%  %7.1f%%  %7.1f%%  %12s / %-12s%s\n", d,
          100 * r->compute[d] / T, 100 * r->comm[d] / T, 100 * r->overlap[d] / T,
          100 * r->idle[d] / T, pm, cap, r->peak_mem[d] > r->capacity[d] ? "  OUT OF MEMORY" : "");
}

void sim_report_print(const SimReport *r, FILE *out)
{
  char t[32], b[32];
  fmt_time(t, sizeof t, r->iteration_time);
  fprintf(out, "model %s on %s (%d GPUs)\n", r->model, r->machine_name, r->n_devices);
  fprintf(out, "  iteration time      %s\n", t);
  fprintf(out, "  throughput          %.2f samples/s", sim_report_throughput(r));
  if (r->tokens_per_sample > 1)
    fprintf(out, ", %.0f tokens/s", sim_report_token_throughput(r));
  fprintf(out, "\n");
  double per_gpu = r->iteration_time > 0
                     ? r->model_flops / r->iteration_time / MAX(r->n_used, 1) : 0;
  fprintf(out, "  model FLOP/s        %.1f TFLOP/s per GPU, MFU %.1f%%\n", per_gpu / 1e12,
          100 * sim_report_mfu(r));
  fmt_bytes(b, sizeof b, (double)sim_report_max_peak_memory(r));
  fprintf(out, "  peak memory         %s on the fullest GPU%s\n", b,
          r->fits ? "" : " -- OUT OF MEMORY on some GPUs");
  int64_t host_node, host = max_host_memory(r, &host_node);
  if (host > 0) {
    char hn[32];
    fmt_bytes(b, sizeof b, (double)host);
    fmt_bytes(hn, sizeof hn, (double)host_node);
    fprintf(out, "  host memory         %s of optimizer states for the fullest GPU, %s a node\n",
            b, hn);
  }
  if (r->chunks > 1)
    fprintf(out, "  pipeline            %d stages of %d model chunks each, %d micro-batch%s, %s\n",
            r->n_stages / r->chunks, r->chunks, r->microbatches,
            r->microbatches == 1 ? "" : "es", sim_schedule_name(r->schedule));
  else
    fprintf(out, "  pipeline            %d stage%s, %d micro-batch%s, %s\n", r->n_stages,
            r->n_stages == 1 ? "" : "s", r->microbatches, r->microbatches == 1 ? "" : "es",
            sim_schedule_name(r->schedule));
  static const char *const detail_words[] = { "per-step transfers", "a flow per rank",
                                              "one flow each" };
  fprintf(out, "  simulated           %" G_GINT64_FORMAT " tasks, collectives as %s, folding: %s\n",
          r->n_tasks, detail_words[r->detail], r->folding);
  if (r->steady)
    fprintf(out, "  steady state        simulated %s\n", r->steady);

  fprintf(out, "\ncritical path\n");
  for (int c = 0; c <= SIM_CLASS_COUNT; c++) {
    if (r->crit[c] <= 0)
      continue;
    fmt_time(t, sizeof t, r->crit[c]);
    fprintf(out, "  %-12s %12s  %5.1f%%\n", c < SIM_CLASS_COUNT ? sim_task_class_name(c) : "waiting",
            t, r->iteration_time > 0 ? 100 * r->crit[c] / r->iteration_time : 0);
  }

  fprintf(out, "\nper GPU (share of the iteration)\n");
  fprintf(out, "  %5s  %8s  %8s  %8s  %8s  %27s\n", "gpu", "compute", "comm", "overlap", "idle",
          "peak memory / capacity");
  if (r->n_devices <= 16) {
    for (int d = 0; d < r->n_devices; d++)
      print_device_row(out, r, d);
  } else {
    for (int d = 0; d < 8; d++)
      print_device_row(out, r, d);
    fprintf(out, "  ... %d more; over all GPUs:\n", r->n_devices - 8);
    double *v = g_new(double, r->n_devices);
    const char *names[] = { "compute", "comm", "idle" };
    const double *arr[] = { r->compute, r->comm, r->idle };
    for (int k = 0; k < 3; k++) {
      memcpy(v, arr[k], sizeof(double) * (size_t)r->n_devices);
      qsort(v, (size_t)r->n_devices, sizeof(double), dbl_cmp);
      double T = r->iteration_time > 0 ? r->iteration_time : 1;
      fprintf(out, "  %-8s min %5.1f%%  median %5.1f%%  max %5.1f%%\n", names[k], 100 * v[0] / T,
              100 * v[r->n_devices / 2] / T, 100 * v[r->n_devices - 1] / T);
    }
    g_free(v);
  }
  if (r->n_links > 0) {
    fprintf(out, "\nbusiest links\n");
    for (int i = 0; i < r->n_links; i++) {
      fmt_bytes(b, sizeof b, r->links[i].bytes);
      fprintf(out, "  %-40s %12s  %5.1f%% busy\n", r->links[i].name, b,
              100 * r->links[i].utilization);
    }
  }
}

char *sim_report_to_json(const SimReport *r)
{
  g_autoptr(JsonBuilder) jb = json_builder_new();
  json_builder_begin_object(jb);
  json_builder_set_member_name(jb, "model");
  json_builder_add_string_value(jb, r->model);
  json_builder_set_member_name(jb, "machine");
  json_builder_add_string_value(jb, r->machine_name);
  json_builder_set_member_name(jb, "gpus");
  json_builder_add_int_value(jb, r->n_devices);
  json_builder_set_member_name(jb, "iteration_time_s");
  json_builder_add_double_value(jb, r->iteration_time);
  json_builder_set_member_name(jb, "throughput_samples_per_s");
  json_builder_add_double_value(jb, sim_report_throughput(r));
  json_builder_set_member_name(jb, "throughput_tokens_per_s");
  json_builder_add_double_value(jb, sim_report_token_throughput(r));
  json_builder_set_member_name(jb, "model_flops_per_iteration");
  json_builder_add_double_value(jb, r->model_flops);
  json_builder_set_member_name(jb, "model_flops_per_gpu_per_s");
  json_builder_add_double_value(
    jb, r->iteration_time > 0 ? r->model_flops / r->iteration_time / r->n_devices : 0);
  json_builder_set_member_name(jb, "mfu");
  json_builder_add_double_value(jb, sim_report_mfu(r));
  json_builder_set_member_name(jb, "fits");
  json_builder_add_boolean_value(jb, r->fits);
  json_builder_set_member_name(jb, "peak_memory_bytes");
  json_builder_begin_array(jb);
  for (int d = 0; d < r->n_devices; d++)
    json_builder_add_int_value(jb, r->peak_mem[d]);
  json_builder_end_array(jb);
  int64_t host_node;
  if (max_host_memory(r, &host_node) > 0) {
    /* The offloaded optimizer's states in host memory, per device. */
    json_builder_set_member_name(jb, "host_memory_bytes");
    json_builder_begin_array(jb);
    for (int d = 0; d < r->n_devices; d++)
      json_builder_add_int_value(jb, r->host_mem[d]);
    json_builder_end_array(jb);
  }
  json_builder_set_member_name(jb, "devices");
  json_builder_begin_array(jb);
  for (int d = 0; d < r->n_devices; d++) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "compute_s");
    json_builder_add_double_value(jb, r->compute[d]);
    json_builder_set_member_name(jb, "comm_s");
    json_builder_add_double_value(jb, r->comm[d]);
    json_builder_set_member_name(jb, "overlap_s");
    json_builder_add_double_value(jb, r->overlap[d]);
    json_builder_set_member_name(jb, "idle_s");
    json_builder_add_double_value(jb, r->idle[d]);
    json_builder_set_member_name(jb, "peak_memory_bytes");
    json_builder_add_int_value(jb, r->peak_mem[d]);
    json_builder_set_member_name(jb, "memory_capacity_bytes");
    json_builder_add_int_value(jb, r->capacity[d]);
    json_builder_end_object(jb);
  }
  json_builder_end_array(jb);
  json_builder_set_member_name(jb, "critical_path_s");
  json_builder_begin_object(jb);
  for (int c = 0; c <= SIM_CLASS_COUNT; c++) {
    json_builder_set_member_name(jb, c < SIM_CLASS_COUNT ? sim_task_class_name(c) : "waiting");
    json_builder_add_double_value(jb, r->crit[c]);
  }
  json_builder_end_object(jb);
  json_builder_set_member_name(jb, "busiest_links");
  json_builder_begin_array(jb);
  for (int i = 0; i < r->n_links; i++) {
    json_builder_begin_object(jb);
    json_builder_set_member_name(jb, "link");
    json_builder_add_string_value(jb, r->links[i].name);
    json_builder_set_member_name(jb, "bytes");
    json_builder_add_double_value(jb, r->links[i].bytes);
    json_builder_set_member_name(jb, "utilization");
    json_builder_add_double_value(jb, r->links[i].utilization);
    json_builder_end_object(jb);
  }
  json_builder_end_array(jb);
  json_builder_set_member_name(jb, "microbatches");
  json_builder_add_int_value(jb, r->microbatches);
  json_builder_set_member_name(jb, "stages");
  json_builder_add_int_value(jb, r->n_stages / r->chunks);
  json_builder_set_member_name(jb, "chunks_per_stage");
  json_builder_add_int_value(jb, r->chunks);
  json_builder_set_member_name(jb, "schedule");
  json_builder_add_string_value(jb, sim_schedule_name(r->schedule));
  json_builder_set_member_name(jb, "tasks");
  json_builder_add_int_value(jb, r->n_tasks);
  json_builder_set_member_name(jb, "collectives");
  json_builder_add_string_value(jb, sim_detail_name(r->detail));
  json_builder_set_member_name(jb, "folding");
  json_builder_add_string_value(jb, r->folding);
  json_builder_set_member_name(jb, "steady_state");
  if (r->steady)
    json_builder_add_string_value(jb, r->steady);
  else
    json_builder_add_null_value(jb);
  json_builder_end_object(jb);
  g_autoptr(JsonGenerator) gen = json_generator_new();
  json_generator_set_pretty(gen, TRUE);
  g_autoptr(JsonNode) root = json_builder_get_root(jb);
  json_generator_set_root(gen, root);
  return json_generator_to_data(gen, NULL);
}
