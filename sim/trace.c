/* trace.c — the simulated timeline in the Chrome trace event format (open it in Perfetto
 * or chrome://tracing): one process per node, a compute track and a communication track
 * per GPU, one track per link carrying traffic, and a process for the network between
 * nodes.  Times are in microseconds, as the format wants. */
#include "taskgraph.h"
#include "report.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put_escaped(FILE *f, const char *s)
{
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* The links a flow crosses: its route, or a whole collective's own list. */
static const int *flow_links(const SimReport *r, const SimTask *t, int *n)
{
  if (t->n_links) {
    *n = t->n_links;
    return r->extra + t->links_off;
  }
  return sim_machine_route(r->machine, t->device, t->peer, n);
}

static void meta(FILE *f, gboolean *first, const char *what, int pid, int tid, const char *name)
{
  fprintf(f, "%s\n{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
          *first ? "" : ",", what, pid, tid);
  put_escaped(f, name);
  fprintf(f, "}}");
  *first = FALSE;
}

/* Whether flow @t touches a kept device: its source or destination, or for a collective's
 * flow any of its members. */
static gboolean flow_kept(const SimReport *r, const SimTask *t, const uint8_t *keep)
{
  if (!keep)
    return TRUE;
  if (!t->n_links)
    return keep[t->device] || keep[t->peer];
  for (int k = 0; k < t->n_members; k++)
    if (keep[r->extra[t->links_off + t->n_links + k]])
      return TRUE;
  return FALSE;
}

gboolean sim_report_write_trace(const SimReport *r, const char *path, GError **error)
{
  return sim_report_write_trace_devices(r, path, NULL, 0, NULL, error);
}

/* Tracks: GPU d's compute stream is tid 2 * local, its communication 2 * local + 1; links
 * get tids from 1000 on, in the process of the node they start in (or the network's).
 * The file is written beside @path and renamed onto it at the end, so that a failure
 * leaves what was there. */
gboolean sim_report_write_trace_devices(const SimReport *r, const char *path, const int *devices,
                                        int n_devices, int64_t *n_events, GError **error)
{
  if (!r->tasks) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                "the report holds no timeline: simulate with the timeline kept");
    return FALSE;
  }
  g_autofree uint8_t *keep = NULL;
  if (devices) {
    keep = g_new0(uint8_t, MAX(r->n_devices, 1));
    for (int i = 0; i < n_devices; i++) {
      if (devices[i] < 0 || devices[i] >= r->n_devices) {
        g_set_error(error, SIM_ERROR, SIM_ERROR_INVALID,
                    "device %d does not exist; the machine has devices 0..%d", devices[i],
                    r->n_devices - 1);
        return FALSE;
      }
      keep[devices[i]] = 1;
    }
  }
  g_autofree char *tmp = g_strdup_printf("%s.partial-XXXXXX", path);
  int fd = g_mkstemp(tmp);
  /* mkstemp makes the file private; a trace is an ordinary output file. */
  if (fd >= 0)
    fchmod(fd, 0644);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s: %s", path, g_strerror(errno));
    if (fd >= 0)
      close(fd);
    return FALSE;
  }
  const SimMachine *m = r->machine;
  int nodes = sim_machine_n_nodes(m);
  int net_pid = nodes;
  gboolean first = TRUE;
  int64_t events = 0;
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  g_autofree uint8_t *node_kept = g_new0(uint8_t, MAX(nodes, 1));
  for (int d = 0; d < r->n_devices; d++)
    if (!keep || keep[d])
      node_kept[sim_machine_device_node(m, d)] = 1;
  for (int n = 0; n < nodes; n++) {
    if (!node_kept[n])
      continue;
    g_autofree char *name = g_strdup_printf("node %d", n);
    meta(f, &first, "process_name", n, 0, name);
  }
  meta(f, &first, "process_name", net_pid, 0, "network");
  for (int d = 0; d < r->n_devices; d++) {
    if (keep && !keep[d])
      continue;
    int pid = sim_machine_device_node(m, d), lr = sim_machine_device_local_rank(m, d);
    g_autofree char *c = g_strdup_printf("gpu %d compute", d);
    g_autofree char *k = g_strdup_printf("gpu %d comm", d);
    meta(f, &first, "thread_name", pid, 2 * lr, c);
    meta(f, &first, "thread_name", pid, 2 * lr + 1, k);
  }
  /* Link tracks, named once, for the links that carried something. */
  int nl = sim_machine_n_links(m);
  uint8_t *used = g_new0(uint8_t, nl > 0 ? nl : 1);
  for (int64_t i = 0; i < r->n_records; i++) {
    const SimTask *t = &r->tasks[i];
    if (t->kind != SIM_TASK_FLOW || t->device == t->peer || r->start[i] < 0 ||
        !flow_kept(r, t, keep))
      continue;
    int hops;
    const int *links = flow_links(r, t, &hops);
    for (int h = 0; h < hops; h++)
      used[links[h]] = 1;
  }
  int *link_pid = g_new(int, nl > 0 ? nl : 1);
  for (int l = 0; l < nl; l++) {
    link_pid[l] = net_pid;
    if (!used[l])
      continue;
    const char *name = sim_machine_link_name(m, l);
    /* Links named "nodeN/..." belong to node N's process. */
    int node;
    if (sscanf(name, "node%d", &node) == 1 && node >= 0 && node < nodes)
      link_pid[l] = node;
    meta(f, &first, "thread_name", link_pid[l], 1000 + l, name);
  }

  for (int64_t i = 0; i < r->n_records; i++) {
    const SimTask *t = &r->tasks[i];
    if (r->start[i] < 0 || t->kind == SIM_TASK_NOP)
      continue;
    double ts = r->start[i] * 1e6, dur = (r->end[i] - r->start[i]) * 1e6;
    const char *cls = sim_task_class_name(t->cls);
    const char *opname = t->op >= 0 && t->op < r->n_ops ? r->op_names[t->op] : "";
    if (t->kind == SIM_TASK_COMPUTE || t->kind == SIM_TASK_DELAY) {
      if (keep && !keep[t->device])
        continue;
      int pid = sim_machine_device_node(m, t->device);
      int tid = 2 * sim_machine_device_local_rank(m, t->device) + (t->kind == SIM_TASK_DELAY);
      fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", cls);
      g_autofree char *nm =
        t->kind == SIM_TASK_DELAY ? g_strdup(cls) : g_strdup_printf("%s %s", opname, cls);
      put_escaped(f, nm);
      fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"mb\":%d,\"shard\":%d}}",
              pid, tid, ts, dur, t->mb, t->shard);
      events++;
      continue;
    }
    if (t->device == t->peer || !flow_kept(r, t, keep))
      continue;
    /* A flow: on its source GPU's communication track and on every link it crosses; a
     * whole collective on every member's. */
    g_autofree char *nm = t->n_links
                            ? g_strdup_printf("%s over %d GPUs", cls, t->n_members)
                            : g_strdup_printf("%s %d->%d", cls, t->device, t->peer);
    int n_src = t->n_links ? t->n_members : 1;
    for (int k = 0; k < n_src; k++) {
      int dev = t->n_links ? r->extra[t->links_off + t->n_links + k] : t->device;
      if (keep && !keep[dev])
        continue;
      fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", cls);
      put_escaped(f, nm);
      fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"bytes\":%.0f,\"op\":",
              sim_machine_device_node(m, dev), 2 * sim_machine_device_local_rank(m, dev) + 1, ts,
              dur, t->bytes);
      put_escaped(f, opname);
      fprintf(f, ",\"mb\":%d}}", t->mb);
      events++;
    }
    int hops;
    const int *links = flow_links(r, t, &hops);
    for (int h = 0; h < hops; h++) {
      fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"link\",\"name\":");
      put_escaped(f, nm);
      fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", link_pid[links[h]],
              1000 + links[h], ts, dur);
      events++;
    }
  }
  fprintf(f, "\n]}\n");
  g_free(used);
  g_free(link_pid);
  gboolean ok = !ferror(f);
  int saved = 0;
  if (fclose(f) != 0 || !ok) {
    saved = errno;
    g_unlink(tmp);
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s: write failed%s%s", path,
                saved ? ": " : "", saved ? g_strerror(saved) : "");
    return FALSE;
  }
  if (g_rename(tmp, path) != 0) {
    saved = errno;
    g_unlink(tmp);
    g_set_error(error, SIM_ERROR, SIM_ERROR_IO, "%s: %s", path, g_strerror(saved));
    return FALSE;
  }
  if (n_events)
    *n_events = events;
  return TRUE;
}
