#!/usr/bin/env python3
"""compare.py [OUT.png [BUDGET [MACHINE]]]: two search algorithms over three models.

Runs MCMC (FlexFlow) and Unity's dynamic program on three models of the zoo with the same
budget and seeds, prints each best iteration time against data parallelism, and plots the
speedups (matplotlib, or gnuplot when matplotlib is missing).

    PYTHONPATH=python examples/compare.py compare.png 200evals dgx-a100
"""
import shutil
import statistics
import subprocess
import sys

import parasol

MODELS = ["mlp", "resnet-50", "transformer"]
ALGORITHMS = ["mcmc", "dp"]
SEEDS = [0, 1]


def main(argv):
    out = argv[1] if len(argv) > 1 else "compare.png"
    budget = argv[2] if len(argv) > 2 else "200evals"
    machine = parasol.Machine(argv[3] if len(argv) > 3 else "dgx-a100")
    rows = parasol.compare(MODELS, machine, ALGORITHMS, budget=budget, seeds=SEEDS)
    speedup = {}
    for name in MODELS:
        model = parasol.Model(name)
        base = parasol.search(model, machine, "data-parallel", budget="1evals").time
        for algo in ALGORITHMS:
            times = [r["time_s"] for r in rows if r["model"] == model.name
                     and r["algorithm"] == algo]
            best = statistics.median(times)
            speedup[(name, algo)] = base / best
            print("%-12s %-6s median %.3f ms over %d seeds, %.2fx over data parallel"
                  % (name, algo, best * 1e3, len(times), base / best))
    plot(out, speedup, machine.name, budget)
    print("plot:", out)
    return 0


def plot(out, speedup, machine, budget):
    title = "speedup over data parallelism on %s, budget %s" % (machine, budget)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        w = 0.8 / len(ALGORITHMS)
        for i, algo in enumerate(ALGORITHMS):
            ax.bar([m + i * w for m in range(len(MODELS))],
                   [speedup[(name, algo)] for name in MODELS], w, label=algo)
        ax.set_xticks([m + w * (len(ALGORITHMS) - 1) / 2 for m in range(len(MODELS))])
        ax.set_xticklabels(MODELS)
        ax.set_ylabel("speedup")
        ax.set_title(title, fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out)
        return
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        raise SystemExit("compare.py: neither matplotlib nor gnuplot found to plot")
    data = "\n".join("%s %s" % (name, " ".join("%g" % speedup[(name, a)] for a in ALGORITHMS))
                     for name in MODELS)
    # pngcairo where this gnuplot has it, png otherwise.
    terms = subprocess.run([gnuplot, "-e", "set terminal"], capture_output=True, text=True)
    term = "pngcairo" if "pngcairo" in terms.stdout + terms.stderr else "png"
    script = ("set terminal " + term + " size 600,350\nset output '%s'\nset title '%s'\n"
              "set style data histograms\nset style fill solid\nset ylabel 'speedup'\n"
              "$d << EOD\n%s\nEOD\nplot %s\n" % (
                  out, title, data, ", ".join("$d using %d:xtic(1) title '%s'" % (i + 2, a)
                                              for i, a in enumerate(ALGORITHMS))))
    subprocess.run([gnuplot], input=script.encode(), check=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
