"""The Python binding against the library and the program (PARASOL_BIN: the program
`parasol simulate` is compared with; PARASOL_SOURCE: the source tree, for the examples)."""
import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import parasol

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("PARASOL_SOURCE", os.path.join(HERE, "..", ".."))
PARASOL = os.environ.get("PARASOL_BIN")
ENV = dict(os.environ, PYTHONPATH=os.path.join(HERE, ".."))


def cli_json(*args):
    if not PARASOL:
        pytest.skip("PARASOL_BIN is not set")
    out = subprocess.run([PARASOL, *args, "--json"], capture_output=True)
    report = json.loads(out.stdout)
    # Exit status 3: simulated, but the plan does not fit (docs/inputs.md).
    assert out.returncode == (0 if report["fits"] else 3), out.stderr
    return report


def test_zoo_and_library():
    names = [n for n, _ in parasol.models()]
    assert "resnet-50" in names and "gpt3-1.3b" in names
    assert "dgx-a100" in parasol.machines()
    assert {"mcmc", "dp", "data-parallel"} <= {n for n, _ in parasol.algorithms()}
    m = parasol.Machine("dgx-a100:2")
    assert (m.n_devices, m.n_nodes) == (16, 2)


def test_model_parameters():
    small = parasol.Model("mlp", layers=2)
    big = parasol.Model("mlp")
    assert small.n_ops < big.n_ops
    assert parasol.Model("resnet-50", batch=32).batch_size == 32


def test_bad_input_names_it():
    with pytest.raises(parasol.Error, match="no-such-model"):
        parasol.Model("no-such-model")
    with pytest.raises(parasol.Error, match="no-such-machine"):
        parasol.Machine("no-such-machine")
    with pytest.raises(parasol.Error, match="precision"):
        parasol.Model("mlp", precision="fp64")
    with pytest.raises(parasol.Error, match="no-such-algo"):
        parasol.search("mlp", "dgx-a100", "no-such-algo")


def test_simulate_equals_the_program():
    # The same defaults: fp16 under mixed precision, data parallelism over every GPU
    # with 25 MB buckets; the same Megatron plan from the same degrees.
    machine = parasol.Machine("dgx-a100")
    model = parasol.Model("resnet-50")
    padded = parasol.Model("gpt3-1.3b", tp=2)  # the library's padding: 50,432 tokens
    for mine, args in [
            (parasol.simulate(model, machine), ["--model", "resnet-50"]),
            (parasol.simulate("resnet-50"), ["--model", "resnet-50"]),
            (parasol.simulate(parasol.Model("gpt3-1.3b", vocab=50432), machine,
                              parasol.Strategy.megatron(parasol.Model("gpt3-1.3b", vocab=50432),
                                                        machine, tp=2, pp=2)),
             ["--model", "gpt3-1.3b", "--param", "vocab=50432", "--tp", "2", "--pp", "2"]),
            (parasol.simulate(padded, machine,
                              parasol.Strategy.megatron(padded, machine, tp=2, pp=2)),
             ["--model", "gpt3-1.3b", "--tp", "2", "--pp", "2"])]:
        theirs = cli_json("simulate", "--machine", "dgx-a100", *args)
        assert mine["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=1e-12)
        assert mine["peak_memory_bytes"] == theirs["peak_memory_bytes"]
        assert mine["fits"] == theirs["fits"]


def test_files_round_trip(tmp_path):
    model = parasol.Model("mlp", layers=2)
    machine = parasol.Machine("dgx-a100")
    gfile = tmp_path / "model.json"
    gfile.write_text(json.dumps(model.to_json()))
    again = parasol.Model(str(gfile))
    assert (again.n_ops, again.n_params) == (model.n_ops, model.n_params)
    mfile = tmp_path / "machine.json"
    mfile.write_text(json.dumps(machine.to_json()))
    assert parasol.Machine(str(mfile)).n_devices == 8
    s = parasol.Strategy.megatron(model, machine, tp=2)
    sfile = tmp_path / "strategy.json"
    s.save(str(sfile))
    a = parasol.simulate(model, machine, s)
    b = parasol.simulate(again, machine, str(sfile))
    assert a["iteration_time_s"] == b["iteration_time_s"]


def test_search_budget_seed_log(tmp_path):
    log = tmp_path / "log.csv"
    r1 = parasol.search("mlp", "dgx-a100", "mcmc", budget="60evals", seed=3, log=str(log))
    r2 = parasol.search("mlp", "dgx-a100", "mcmc", budget="60evals", seed=3)
    assert r1.evals == 60
    assert r1.time == r2.time
    rows = list(csv.DictReader(open(log)))
    assert rows and float(rows[-1]["best_s"]) == pytest.approx(r1.time, rel=1e-9)
    # The improvements decrease and end at the result.
    bests = [b for _, _, b in r1.improvements]
    assert bests == sorted(bests, reverse=True) and bests[-1] == r1.time
    # The strategy found simulates to the time found.
    assert r1.strategy is not None


class Recorder(parasol.SearchAlgorithm):
    """Data parallelism, then random configurations; records every time it was given."""
    name = "py-test-recorder"
    description = "test: random strategies, every time recorded"

    def __init__(self):
        self.times = []

    def run(self, ctx):
        p = ctx.problem
        s = p.data_parallel()
        self.times.append(ctx.evaluate(s))
        while not ctx.should_stop():
            for op in range(p.n_ops):
                p.apply(s, op, p.config(op, ctx.random.randrange(p.n_configs(op))))
            self.times.append(ctx.evaluate(s))


def test_python_algorithm_runs_in_the_driver(tmp_path):
    a = Recorder()
    log = tmp_path / "py.csv"
    r = parasol.search("mlp", "dgx-a100", a, budget="40evals", seed=5, log=str(log))
    # The driver kept its budget and the best of what the algorithm evaluated.
    assert r.evals == 40 and len(a.times) == 40
    assert r.time == min(a.times)
    assert r.algorithm == "py-test-recorder"
    assert len(list(csv.DictReader(open(log)))) == len(r.improvements) + 1
    # The same seed, the same strategies.
    b = Recorder()
    parasol.search("mlp", "dgx-a100", b, budget="40evals", seed=5)
    assert b.times == a.times
    c = Recorder()
    parasol.search("mlp", "dgx-a100", c, budget="40evals", seed=6)
    assert c.times != a.times
    # Registered like a built-in: compare() runs it by name.
    rows = parasol.compare(["mlp"], "dgx-a100", ["py-test-recorder"], budget="5evals")
    assert rows[0]["evals"] == 5


class Failing(parasol.SearchAlgorithm):
    name = "py-test-failing"
    description = "test: raises"

    def run(self, ctx):
        ctx.evaluate(ctx.problem.data_parallel())
        raise ValueError("no idea")


def test_python_algorithm_exception_comes_back():
    with pytest.raises(ValueError, match="no idea"):
        parasol.search("mlp", "dgx-a100", Failing(), budget="10evals")


def test_ctrl_c_stops_a_python_search_with_its_best(tmp_path):
    script = tmp_path / "long.py"
    script.write_text(textwrap.dedent("""
        import sys, parasol
        sys.path.insert(0, %r)
        from test_parasol import Recorder
        print("started", flush=True)
        r = parasol.search("mlp", "dgx-a100", Recorder(), budget="600s", seed=1)
        print("interrupted" if r.interrupted else "not interrupted", r.evals, r.time, flush=True)
    """ % HERE))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         env=ENV)
    assert p.stdout.readline().strip() == "started"
    import time
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    word, evals, best = out.split()[0], int(out.split()[1]), float(out.split()[2])
    assert word == "interrupted" and evals > 0 and math.isfinite(best)


def test_examples(tmp_path):
    ex = os.path.join(SOURCE, "examples")
    log = tmp_path / "hill.csv"
    out = subprocess.run([sys.executable, os.path.join(ex, "python_search.py"), "mlp",
                          "dgx-a100", "100evals", str(log)], env=ENV, check=True,
                         capture_output=True, text=True).stdout
    assert "py-hill found" in out and "in 100 evaluations" in out
    assert log.read_text().startswith("wall_s,evals,best_s,current_s\n")
    png = tmp_path / "compare.png"
    out = subprocess.run([sys.executable, os.path.join(ex, "compare.py"), str(png), "4evals"],
                         env=ENV, check=True, capture_output=True, text=True).stdout
    assert out.count("over data parallel") == 6
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_example_files():
    # The graph, machine and strategy files of examples/ (docs/formats.md).
    ex = os.path.join(SOURCE, "examples")
    files = [os.path.join(ex, f) for f in
             ("mlp.graph.json", "two-servers.machine.json", "mlp-hybrid.strategy.json")]
    model, machine = parasol.Model(files[0]), parasol.Machine(files[1])
    assert (model.name, machine.name, machine.n_devices) == ("mlp-example", "two-servers", 8)
    mine = parasol.simulate(model, machine, files[2])
    theirs = cli_json("simulate", "--model", files[0], "--machine", files[1],
                      "--strategy", files[2])
    assert mine["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=1e-12)


def test_vocabulary_padded_as_the_program_pads_it():
    tiny = dict(layers=1, hidden=64, heads=4, seq=16, batch=8)
    model = parasol.Model("gpt", tp=2, **tiny)
    assert model.vocab_padding == (50257, 50432)
    assert parasol.Model("gpt", **tiny).vocab_padding == (50257, 50304)
    assert parasol.Model("gpt", vocab=1000, **tiny).vocab_padding is None
    assert parasol.Model("resnet-50").vocab_padding is None
    machine = parasol.Machine("dgx-a100:1")
    mine = parasol.simulate(model, machine, parasol.Strategy.megatron(model, machine, tp=2))
    theirs = cli_json("simulate", "--model", "gpt", "--param",
                      "layers=1,hidden=64,heads=4,seq=16,batch=8", "--machine", "dgx-a100:1",
                      "--tp", "2")
    assert mine["iteration_time_s"] == pytest.approx(theirs["iteration_time_s"], rel=1e-12)
    assert theirs["vocab_padding"] == {"model_vocab": 50257, "padded_vocab": 50432, "tp": 2}
