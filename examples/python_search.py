#!/usr/bin/env python3
"""python_search.py [MODEL [MACHINE [BUDGET [LOG]]]]: a search algorithm written in Python.

Hill climbing with random restarts over per-operator configurations: from data
parallelism, it moves one operator at a time to a random candidate configuration and
keeps the move when the simulated iteration is faster; after `patience` moves without a
gain it starts again from a random strategy.  The C search driver runs it as it runs the
built-in algorithms: the same budget (seconds or evaluations), seed, CSV log of
improvements and Ctrl-C (which stops it and keeps the best).

    PYTHONPATH=python examples/python_search.py mlp dgx-a100 300evals hill.csv
"""
import math
import sys

import parasol


class HillClimb(parasol.SearchAlgorithm):
    name = "py-hill"
    description = "hill climbing with random restarts, one operator at a time (Python)"

    def run(self, ctx):
        p = ctx.problem
        rng = ctx.random                      # seeded from the run's seed
        patience = int(ctx.option("patience", "50"))
        current = p.data_parallel()
        cost = ctx.evaluate(current)
        stale = 0
        while not ctx.should_stop():
            op = rng.randrange(p.n_ops)
            k = rng.randrange(p.n_configs(op))
            old = p.config_of(current, op)
            p.apply(current, op, p.config(op, k))
            t = ctx.evaluate(current)
            if t < cost:
                cost, stale = t, 0
            else:
                if old >= 0:                  # undo the move
                    p.apply(current, op, p.config(op, old))
                stale += 1
            if stale >= patience:             # restart from a random strategy
                for o in range(p.n_ops):
                    p.apply(current, o, p.config(o, rng.randrange(p.n_configs(o))))
                cost, stale = ctx.evaluate(current), 0
            ctx.set_current(cost)


def main(argv):
    model = argv[1] if len(argv) > 1 else "mlp"
    machine = argv[2] if len(argv) > 2 else "dgx-a100"
    budget = argv[3] if len(argv) > 3 else "300evals"
    log = argv[4] if len(argv) > 4 else None
    r = parasol.search(model, machine, HillClimb(), budget=budget, seed=1, log=log)
    dp = parasol.search(model, machine, "data-parallel", budget="1evals").time
    print("%s on %s: %s found %.3f ms in %d evaluations (%.2f s); data parallel %.3f ms"
          % (r.model, r.machine, r.algorithm, r.time * 1e3, r.evals, r.elapsed, dp * 1e3))
    for wall, evals, best in r.improvements:
        print("  %8.3f s %6d evals  best %.3f ms" % (wall, evals, best * 1e3))
    if r.interrupted:
        print("interrupted: the best so far")
    return 0 if not math.isinf(r.time) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
