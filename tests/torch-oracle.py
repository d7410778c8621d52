#!/usr/bin/env python3
"""torch-oracle.py PARASOL [CASE...]: the executor against PyTorch, an independent
implementation of the same training steps.

For each case, `parasol exec --dump DIR` runs a model under a parallel strategy on the CPU
back end and writes its initial weights, each step's inputs and dropout masks, its losses,
gradients and updated weights (docs/exec-dump.md).  This script rebuilds the model from the
dumped graph in PyTorch, in float64, from the same initial weights, inputs and masks, runs
the same steps with PyTorch's own optimizers (torch.optim.SGD, torch.optim.Adam), and
compares, step by step:
  loss     |parasol - torch| / |torch|
  grads    max over tensors of max |a - b| / max(max |b|, 1% of the model's largest gradient)
           (a gradient that is zero in exact arithmetic holds only rounding noise)
  weights  max over tensors of max |a - b| / max |b|
The executor computes in fp32, so each differs from float64 by fp32 rounding: sums of a
few hundred products (relative 2^-24 each) give 1e-7 to 1e-6.  The tolerances, 1e-5 for
losses and weights and 1e-4 for gradients, leave ten to a hundred times that; a wrong
formula (a scale, a bias correction, a seed) moves them by 1e-3 or more.

Exit status 0 when every case agrees, 1 otherwise, 77 (skipped) when PyTorch cannot be
imported.  Cases: the names of CASES below (default: all).
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    # A pyenv or virtual-environment python3 first on PATH may lack Debian's python3-torch.
    for py in ("/usr/bin/python3",):
        if os.path.realpath(py) != os.path.realpath(sys.executable) and os.path.exists(py) and \
           subprocess.run([py, "-c", "import torch, numpy"], capture_output=True).returncode == 0:
            os.execv(py, [py] + sys.argv)
    print("SKIP: PyTorch (Debian's python3-torch) cannot be imported; the oracle tests need it")
    sys.exit(77)

torch.set_default_dtype(torch.float64)

TOL_LOSS, TOL_GRAD, TOL_WEIGHT = 1e-5, 1e-4, 1e-5

MLP = ("mlp", "layers=3,hidden=64,input=32,classes=16,batch=16")
GPT = ("gpt", "layers=4,hidden=64,heads=4,seq=16,vocab=128,batch=8")
PP = ["--tp", "2", "--pp", "2", "--dp", "2", "--microbatches", "4"]
# name, model, options of parasol exec
CASES = [
    ("mlp-dp2-tp2-sgd", MLP, ["--dp", "2", "--tp", "2", "--optimizer", "sgd"]),
    ("mlp-dp2-tp2-adam", MLP, ["--dp", "2", "--tp", "2", "--optimizer", "adam"]),
    ("mlp-load-weights", MLP, ["--dp", "2", "--tp", "2", "--optimizer", "sgd", "LOAD"]),
    ("gpt-tp2-pp2-dp2-1f1b", GPT, PP),
    ("gpt-gpipe", GPT, PP + ["--schedule", "gpipe"]),
    ("gpt-interleaved", GPT, PP + ["--schedule", "interleaved:2"]),
    ("gpt-recompute-full", GPT, PP + ["--recompute", "full"]),
    ("gpt-recompute-selective", GPT, PP + ["--recompute", "selective"]),
    ("gpt-sequence-parallel", GPT, PP + ["--sequence-parallel"]),
    ("gpt-scatter-gather", GPT, PP + ["--scatter-gather"]),
    ("gpt-zero1", GPT, ["--tp", "2", "--dp", "2", "--zero1"]),
    ("gpt-sgd", GPT, PP + ["--optimizer", "sgd"]),
]


def load(path):
    return torch.from_numpy(np.load(path))


class Model:
    """The graph of a dump in PyTorch: parameters by (op, index), a forward pass."""

    def __init__(self, dump):
        self.dump = dump
        self.man = json.load(open(os.path.join(dump, "manifest.json")))
        self.graph = json.load(open(os.path.join(dump, self.man["graph"])))
        self.ops = {o["name"]: o for o in self.graph["ops"]}
        self.params = {}
        for w in self.man["weights"]:
            t = load(os.path.join(dump, "init", w["file"])).double()
            self.params[(w["op"], w["index"])] = torch.nn.Parameter(t)
        consumed = {i for o in self.graph["ops"] for i in o["inputs"]}
        self.losses = [o["name"] for o in self.graph["ops"]
                       if o["type"] in ("cross_entropy", "mse_loss") and o["name"] not in consumed]

    def weight(self, op, i, shape):
        """Weight i of op, through the owner's tensor for shared weights."""
        o = self.ops[op]
        owner = o.get("shares_weights_of")
        if owner is None or (op, i) in self.params:
            return self.params[(op, i)]
        w = self.params[(owner, i)]
        if tuple(w.shape) == tuple(shape):
            return w
        if w.dim() == 2 and tuple(w.shape) == tuple(reversed(shape)):
            return w.t()
        return w.reshape(shape)

    def forward(self, inputs, masks):
        env = {}
        for o in self.graph["ops"]:
            name, typ, a = o["name"], o["type"], o["attrs"]
            x = [env[i] for i in o["inputs"]]
            if typ == "input":
                y = inputs[name]
            elif typ == "linear":
                n_in = x[0].shape[-1]
                W = self.weight(name, 0, (n_in, a["out_features"]))
                y = x[0] @ W
                if a.get("bias"):
                    y = y + self.weight(name, 1, (a["out_features"],))
                y = activation(a.get("activation", "identity"), y)
            elif typ == "unary":
                y = activation(a["kind"], x[0])
            elif typ == "binary":
                y = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[a["kind"]](x[0], x[1])
            elif typ == "dropout":
                y = x[0] * masks[name].double() / (1 - a["p"])
            elif typ == "layernorm":
                h = x[0].shape[-1]
                y = torch.nn.functional.layer_norm(x[0], (h,), self.weight(name, 0, (h,)),
                                                   self.weight(name, 1, (h,)), eps=1e-5)
            elif typ == "embedding":
                y = self.weight(name, 0, (a["vocab"], a["dim"]))[x[0]]
            elif typ == "attention":
                y = attention(self, name, a, x, masks.get(name))
            elif typ == "cross_entropy":
                logits = x[0]
                C = logits.shape[-1]
                y = torch.nn.functional.cross_entropy(logits.reshape(-1, C), x[1].reshape(-1),
                                                      reduction="none").reshape(x[1].shape)
            elif typ == "mse_loss":
                d = (x[0] - x[1]) ** 2
                y = d.reshape(d.shape[0], -1).mean(dim=1)
            else:
                raise SystemExit(f"torch-oracle: no PyTorch rendering of op type '{typ}' ({name})")
            env[name] = y
        return sum(env[l].mean() for l in self.losses)


def activation(kind, y):
    if kind == "identity":
        return y
    if kind == "relu":
        return torch.relu(y)
    if kind == "gelu":
        return torch.nn.functional.gelu(y)
    if kind == "tanh":
        return torch.tanh(y)
    if kind == "sigmoid":
        return torch.sigmoid(y)
    raise SystemExit(f"torch-oracle: no PyTorch rendering of activation '{kind}'")


def attention(m, name, a, x, mask):
    """Multi-head attention with its four projections (sim/ops/attention.c)."""
    q, k, v = x
    H, hd = a["heads"], a["head_dim"]
    dm = q.shape[-1]
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    Wq, Wk, Wv = (m.weight(name, i, (dm, H * hd)) for i in range(3))
    Wo = m.weight(name, 3, (H * hd, dm))
    Q, K, V = q @ Wq, k @ Wk, v @ Wv
    if a.get("bias"):
        Q = Q + m.weight(name, 4, (H * hd,))
        K = K + m.weight(name, 5, (H * hd,))
        V = V + m.weight(name, 6, (H * hd,))
    Q = Q.reshape(b, sq, H, hd).transpose(1, 2)
    K = K.reshape(b, skv, H, hd).transpose(1, 2)
    V = V.reshape(b, skv, H, hd).transpose(1, 2)
    S = Q @ K.transpose(-1, -2) / hd ** 0.5
    if a.get("causal"):
        S = S.masked_fill(torch.ones(sq, skv, dtype=torch.bool).triu(1), float("-inf"))
    P = torch.softmax(S, dim=-1)
    if a.get("dropout", 0) > 0:
        P = P * mask.double() / (1 - a["dropout"])
    O = (P @ V).transpose(1, 2).reshape(b, sq, H * hd) @ Wo
    if a.get("bias"):
        O = O + m.weight(name, 7, (dm,))
    return O


def rel(a, b, floor=0.0):
    return float((a - b).abs().max() / max(float(b.abs().max()), floor, 1e-300))


def compare(dump):
    m = Model(dump)
    opt = m.man["optimizer"]
    params = list(m.params.values())
    if opt["name"] == "adam":
        o = torch.optim.Adam(params, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]),
                             eps=opt["eps"], weight_decay=opt["weight_decay"])
    else:
        o = torch.optim.SGD(params, lr=opt["lr"], momentum=opt["momentum"],
                            weight_decay=opt["weight_decay"])
    worst = {"loss": 0.0, "grads": 0.0, "weights": 0.0}
    where = {}
    for st in m.man["steps"]:
        sdir = os.path.join(dump, st["dir"])
        inputs = {i["tensor"]: load(os.path.join(sdir, i["file"])) for i in m.man["inputs"]}
        inputs = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
        masks = {d["op"]: load(os.path.join(sdir, d["file"])) for d in m.man["dropout"]}
        o.zero_grad()
        loss = m.forward(inputs, masks)
        loss.backward()
        e = abs(st["loss"] - loss.item()) / abs(loss.item())
        if e >= worst["loss"]:
            worst["loss"], where["loss"] = e, f"step {st['step']}"
        gmax = max(float(p.grad.abs().max()) for p in params)
        for (op, i), p in m.params.items():
            f = os.path.join(sdir, f"grad.{file_stem(m, op, i)}")
            e = rel(load(f).double(), p.grad, 0.01 * gmax)
            if e >= worst["grads"]:
                worst["grads"], where["grads"] = e, f"step {st['step']} {op} #{i}"
        o.step()
        for (op, i), p in m.params.items():
            f = os.path.join(sdir, file_stem(m, op, i))
            e = rel(load(f).double(), p.detach())
            if e >= worst["weights"]:
                worst["weights"], where["weights"] = e, f"step {st['step']} {op} #{i}"
    return worst, where


def file_stem(m, op, i):
    for w in m.man["weights"]:
        if w["op"] == op and w["index"] == i:
            return w["file"]
    raise KeyError((op, i))


def write_random_weights(src, dst):
    """A dump directory whose initial weights are drawn here, not by parasol."""
    man = json.load(open(os.path.join(src, "manifest.json")))
    os.makedirs(os.path.join(dst, "init"), exist_ok=True)
    rng = np.random.default_rng(7)
    for w in man["weights"]:
        np.save(os.path.join(dst, "init", w["file"]),
                rng.uniform(-0.2, 0.2, size=w["shape"]).astype("<f4"))


def run_case(parasol, tmp, name, model, opts):
    dump = os.path.join(tmp, name)
    opts = list(opts)
    extra = []
    if "LOAD" in opts:
        opts.remove("LOAD")
        seed_dump = os.path.join(tmp, name + "-seed")
        subprocess.run([parasol, "exec", "--model", model[0], "--param", model[1], "--steps",
                        "1", "--dump", seed_dump] + opts, check=True, capture_output=True)
        src = os.path.join(tmp, name + "-weights")
        write_random_weights(seed_dump, src)
        extra = ["--load-weights", src]
    cmd = [parasol, "exec", "--backend", "cpu", "--model", model[0], "--param", model[1],
           "--machine", "dgx-a100", "--steps", "3", "--adam-eps", "1e-3", "--dump", dump] + \
        opts + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"parasol exec failed ({r.returncode}): {r.stderr.strip()[-300:]}"
    if extra:
        man = json.load(open(os.path.join(dump, "manifest.json")))
        for w in man["weights"]:
            a = np.load(os.path.join(dump, "init", w["file"]))
            b = np.load(os.path.join(src, "init", w["file"]))
            if not np.array_equal(a, b):
                return None, f"--load-weights: {w['file']} was not loaded as written"
    return compare(dump), None


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    parasol = sys.argv[1]
    want = sys.argv[2:]
    unknown = [w for w in want if w not in [c[0] for c in CASES]]
    if unknown:
        raise SystemExit(f"torch-oracle: unknown case {unknown[0]}; cases: "
                         + ", ".join(c[0] for c in CASES))
    bad = 0
    print(f"parasol's CPU executor (fp32) against PyTorch {torch.__version__} (float64), "
          f"3 steps; tolerances loss {TOL_LOSS:g}, gradients {TOL_GRAD:g}, weights {TOL_WEIGHT:g}")
    print(f"{'case':26s} {'loss':>9s} {'gradients':>9s} {'weights':>9s}  verdict")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, opts in CASES:
            if want and name not in want:
                continue
            res, err = run_case(parasol, tmp, name, model, opts)
            if err:
                print(f"{name:26s} {'-':>9s} {'-':>9s} {'-':>9s}  FAIL: {err}")
                bad += 1
                continue
            worst, where = res
            ok = worst["loss"] <= TOL_LOSS and worst["grads"] <= TOL_GRAD and \
                worst["weights"] <= TOL_WEIGHT
            verdict = "ok" if ok else "MISMATCH (worst gradient: %s; weight: %s)" % (
                where.get("grads"), where.get("weights"))
            print(f"{name:26s} {worst['loss']:9.2e} {worst['grads']:9.2e} "
                  f"{worst['weights']:9.2e}  {verdict}", flush=True)
            bad += not ok
    print(f"{bad} case(s) disagree" if bad else "every case agrees with PyTorch")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
