"""Shared by the paper-reproduction scripts (flexflow-throughput, unity-speedups,
optcnn-layerwise): running `parasol search`, and writing the CSV, the gnuplot figure and the
Markdown table of an experiment."""
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The default budget of a yardstick command (--yardstick-budget).
YARDSTICK_BUDGET = "60s"


def default_parasol():
    for build in ("build", "builddir"):
        p = os.path.join(ROOT, build, "cli", "parasol")
        if os.path.exists(p):
            return p
    return shutil.which("parasol") or "parasol"


def add_common_args(ap):
    """The options every reproduction script takes."""
    ap.add_argument("--parasol", default=os.environ.get("PARASOL") or default_parasol(),
                    help="the parasol program (default: build/cli/parasol)")
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--quick", action="store_true",
                    help="seconds per search and fewer GPU counts (the committed results "
                         "under experiments/results/ are the default runs)")
    ap.add_argument("--smoke", action="store_true",
                    help="with --quick: one model and one GPU count, evaluation budgets, "
                         "to check that the script works (the test suite's mode)")
    ap.add_argument("--threads", type=int, default=1,
                    help="search threads (default 1: the runs are sequential, and one "
                         "thread keeps them comparable on a shared machine)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--yardstick-budget", default=YARDSTICK_BUDGET,
                    help="bounds each yardstick command: data parallelism and the expert "
                         f"plans (default {YARDSTICK_BUDGET}; the expert plans not simulated "
                         "within it are reported)")


def run_search(args, model, machine, algo, budget, batch=None, devices=None, allow=None,
               own=False, opts=(), log=None, out=None, env=None, extra=()):
    """One `parasol search --json`; returns (result dict or None, error text, wall seconds)."""
    cmd = [args.parasol, "search", "--model", model, "--machine", machine, "--algo", algo,
           "--budget", budget, "--seed", str(args.seed), "--threads", str(args.threads),
           "--json", "--quiet"]
    if batch:
        cmd += ["--param", f"batch={batch}"]
    if devices:
        cmd += ["--devices", devices]
    if allow:
        cmd += ["--allow", allow]
    if own:
        cmd.append("--own")
    for o in opts:
        cmd += ["--opt", o]
    if log:
        cmd += ["--log", log]
    if out:
        cmd += ["--out", out]
    cmd += list(extra)
    full_env = dict(os.environ)
    full_env.update(env or {})
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
    wall = time.time() - start
    if proc.returncode != 0:
        lines = [x.strip() for x in proc.stderr.strip().splitlines() if x.strip()]
        text = "; ".join(lines) if lines else ""
        return None, f"exit {proc.returncode}" + (f": {text[:400]}" if text else ""), wall
    return json.loads(proc.stdout), "", wall


def yardsticks(args, model, machine, batch=None, devices=None):
    """Data parallelism and the best expert plan: {"dp", "dp_fits", "expert",
    "expert_complete", "expert_plans", "expert_simulated"}, or the error text.

    One `parasol search --algo expert` with the yardstick budget (--yardstick-budget) gives
    all three: the budget bounds the command, the expert plans are simulated in the order
    of their estimated time until it ends (the yardstick is then the best of those
    simulated, and "expert_complete" is false), and data parallelism is simulated to its
    end where it fits.  Where it does not fit, that simulation stops at the overflow: its
    time is then taken from `--algo data-parallel --no-memory-limit` with the same budget
    (which data parallelism's one simulation gets the most of)."""
    budget = getattr(args, "yardstick_budget", None) or YARDSTICK_BUDGET
    e, err, _ = run_search(args, model, machine, "expert", budget, batch=batch,
                           devices=devices)
    if not e:
        # No expert plan fits: data parallelism's time still comes from the next call.
        e = {}
    y = {"dp": e.get("data_parallel_s"), "dp_fits": e.get("data_parallel_fits"),
         "expert": e.get("expert_s"),
         "expert_complete": e.get("expert_complete"),
         "expert_plans": e.get("expert_plans"),
         "expert_simulated": e.get("expert_plans_simulated")}
    if not e or not y["dp_fits"] or y["dp"] is None:
        r, err, _ = run_search(args, model, machine, "data-parallel", budget, batch=batch,
                               devices=devices, extra=["--no-memory-limit"])
        if not r:
            return err
        y["dp"] = r.get("iteration_time_s")
        y["dp_fits"] = (r.get("report") or {}).get("fits")
    return y


def machine_for(base, gpus_per_node, gpus):
    """The library machine and --devices of @gpus GPUs of @base's node type: whole nodes
    (base:N) from one node up, the first GPUs of one node below."""
    if gpus >= gpus_per_node:
        if gpus % gpus_per_node:
            raise ValueError(f"{gpus} GPUs are not whole nodes of {gpus_per_node}")
        return f"{base}:{gpus // gpus_per_node}", None
    return f"{base}:1", f"0-{gpus - 1}"


def no_feasible(status):
    """Whether a run's status says the search found no plan that fits (a result, as the
    tables show it, not a failure of the run)."""
    return "found no feasible strategy" in (status or "")


def own_time(r):
    """The algorithm's own best iteration time (the search keeps a faster yardstick's plan
    and reports its own beside it)."""
    if not r:
        return None
    return r.get("search_iteration_time_s", r.get("iteration_time_s"))


def time_to_best(log_path, final, frac=0.95):
    """Wall seconds of the first improvement within 1/frac of @final, from a search log."""
    if not final or not os.path.exists(log_path):
        return None
    with open(log_path) as f:
        for row in csv.DictReader(f):
            if row.get("best_s") and float(row["best_s"]) * frac <= final:
                return float(row["wall_s"])
    return None


def fmt(x, spec=".2f"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def ratio(a, b):
    return a / b if a and b else None


def write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def md_table(header, rows):
    out = "| " + " | ".join(header) + " |\n"
    out += "|" + "---|" * len(header) + "\n"
    for r in rows:
        out += "| " + " | ".join(str(c) for c in r) + " |\n"
    return out


def relativize(script_path):
    """Makes a gnuplot script name its files relative to its own folder, so that it runs
    wherever the folder is copied; returns the folder."""
    folder = os.path.dirname(os.path.abspath(script_path))
    with open(script_path) as f:
        text = f.read()
    for prefix in {os.path.dirname(script_path), folder}:
        if prefix:
            text = text.replace(f"'{prefix}/", "'")
    with open(script_path, "w") as f:
        f.write(text)
    return folder


def gnuplot(script_path):
    """Runs gnuplot on a script; says so where gnuplot is missing or fails."""
    if not shutil.which("gnuplot"):
        print(f"gnuplot is not installed: run 'gnuplot {script_path}' where it is",
              file=sys.stderr)
        return False
    folder = relativize(script_path)
    proc = subprocess.run(["gnuplot", os.path.basename(script_path)], capture_output=True,
                          text=True, cwd=folder)
    if proc.returncode != 0:
        print(f"gnuplot {script_path}: {proc.stderr.strip()}", file=sys.stderr)
        return False
    return True


def published_section(claims):
    """Markdown for the paper's published claims: (claim, value, where) triples."""
    return md_table(["the paper's claim", "published", "where"], claims)
