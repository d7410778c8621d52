#!/usr/bin/env python3
"""torch-import.py PARASOL: PyTorch modules exported by tools/torch2parasol.py and imported
by `parasol import` keep PyTorch's parameter count exactly, and the torchvision models the
zoo also has (ResNet-50, Inception-v3) predict the zoo's iteration time within 2% under
data parallelism over a DGX A100; the others' data-parallel plans simulate.

The modules are made here with random weights (nothing is downloaded): torchvision's
resnet50 and inception_v3, a torch.nn.TransformerEncoder, and a small module of
embedding, layer norm, SiLU and a linear layer, a TransformerDecoder, GPT-style models, and
a LLaMA-style decoder (RMSNorm, rotary attention, SwiGLU, GPT-2's tanh GELU:
tests/data/onnx/make-llama.py).

Exit status 0 when all agree, 1 otherwise, 77 (skipped) when torch, torchvision or onnx
cannot be imported or parasol was built without ONNX support.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torchvision  # noqa: F401
    import onnx  # noqa: F401
except ImportError:
    # A pyenv or virtual-environment python3 first on PATH may lack Debian's packages.
    py = "/usr/bin/python3"
    if os.path.realpath(py) != os.path.realpath(sys.executable) and os.path.exists(py) and \
       subprocess.run([py, "-c", "import torch, torchvision, onnx"],
                      capture_output=True).returncode == 0:
        os.execv(py, [py] + sys.argv)
    print("SKIP: torch, torchvision or onnx (Debian's python3-torch, python3-torchvision, "
          "python3-onnx) cannot be imported")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import torch2parasol  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "data", "onnx"))
make_llama = __import__("make-llama")


class Small(torch.nn.Module):
    """Token embedding, layer norm, a SiLU MLP and a classifier."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.up = torch.nn.Linear(64, 256)
        self.act = torch.nn.SiLU()
        self.down = torch.nn.Linear(256, 64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, ids):
        x = self.norm(self.emb(ids))
        x = x + self.down(self.act(self.up(x)))
        return self.head(x)


class Decoder(torch.nn.Module):
    """torch.nn.TransformerDecoder: self-attention under a causal mask given as an input,
    cross-attention to a memory of another length."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerDecoderLayer(d_model=128, nhead=4, dim_feedforward=512,
                                                 batch_first=True)
        self.dec = torch.nn.TransformerDecoder(layer, num_layers=2)

    def forward(self, tgt, memory, mask):
        return self.dec(tgt, memory, tgt_mask=mask)


class GPT(torch.nn.Module):
    """A GPT-style decoder: token and position embeddings, pre-norm blocks under a causal
    mask built inside (arange, full, triu), a final norm and an untied head."""

    def __init__(self, vocab=1000, d=128, heads=4, layers=2, ctx=256):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True,
                                                 activation="gelu", norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        mask = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
        x = self.tok(ids) + self.pos(pos)
        return self.head(self.ln(self.blocks(x, mask=mask)))


class HandAttention(torch.nn.Module):
    """Attention written out as GPT-2 and LLaMA implementations write it: separate q, k, v
    and output projections, heads by view and transpose, a causal mask by masked_fill."""

    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.h
        q, k, v = (p(x).view(b, s, self.h, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = (q @ k.transpose(-2, -1)) / hd ** 0.5
        a = a.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1),
                          float("-inf"))
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)


class HandGPT(torch.nn.Module):
    def __init__(self, d=128, h=4):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, d)
        self.ln1 = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(2))
        self.attn = torch.nn.ModuleList(HandAttention(d, h) for _ in range(2))
        self.ln2 = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(2))
        self.fc = torch.nn.ModuleList(torch.nn.Linear(d, 4 * d) for _ in range(2))
        self.proj = torch.nn.ModuleList(torch.nn.Linear(4 * d, d) for _ in range(2))
        self.head = torch.nn.Linear(d, 1000, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for i in range(2):
            x = x + self.attn[i](self.ln1[i](x))
            x = x + self.proj[i](torch.nn.functional.gelu(self.fc[i](self.ln2[i](x))))
        return self.head(x)


def parasol_json(parasol, *args):
    out = subprocess.run([parasol] + list(args) + ["--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("parasol %s: %s" % (" ".join(args), out.stderr.strip()))
    return json.loads(out.stdout)


def main():
    parasol = sys.argv[1]
    if subprocess.run([parasol, "import", "--check", "/dev/null"], capture_output=True,
                      text=True).stderr.find("without ONNX") >= 0:
        print("SKIP: parasol was built without ONNX support")
        return 77
    torch.manual_seed(0)
    cases = [
        ("resnet-50",) + torch2parasol.torchvision_model("resnet50", 2, 0) + ("batch=256",),
        ("inception-v3",) + torch2parasol.torchvision_model("inception_v3", 2, 0)
        + ("batch=256",),
        ("encoder",) + torch2parasol.encoder_model(2, 16, 2, 256, 8) + ("batch=32,seq=128",),
        ("small", Small(), (torch.randint(0, 1000, (2, 16)),), {0: "batch", 1: "seq"},
         "batch=32,seq=128"),
        ("decoder", Decoder(), (torch.randn(2, 8, 128), torch.randn(2, 10, 128),
                                torch.nn.Transformer.generate_square_subsequent_mask(8)),
         {"input0": {0: "batch", 1: "seq"}, "input1": {0: "batch", 1: "src"},
          "input2": {0: "seq", 1: "seq"}}, "batch=16,seq=64,src=80"),
        ("gpt", GPT(), (torch.randint(0, 1000, (2, 16)),), {0: "batch", 1: "seq"},
         "batch=16,seq=128"),
        ("hand-gpt", HandGPT(), (torch.randint(0, 1000, (2, 16)),), {0: "batch", 1: "seq"},
         "batch=16,seq=128"),
        ("llama",) + make_llama.example() + ("batch=16,seq=128",),
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, module, inputs, dynamic, params in cases:
            path = os.path.join(tmp, name + ".onnx")
            want = torch2parasol.export_onnx(module, inputs, path, dynamic)
            got = parasol_json(parasol, "model", "show", path, "--param", params)["parameters"]
            line = "%-13s parameters: PyTorch %d, imported %d" % (name, want, got)
            ok = got == want
            if name in ("resnet-50", "inception-v3"):
                t = parasol_json(parasol, "simulate", "-m", path, "-p", params, "-x",
                                 "dgx-a100")["iteration_time_s"]
                z = parasol_json(parasol, "simulate", "-m", name, "-p", params, "-x",
                                 "dgx-a100")["iteration_time_s"]
                line += "; data parallel on dgx-a100 at %s: %.4f ms, zoo %.4f ms (%+.2f%%)" % (
                    params, t * 1e3, z * 1e3, (t / z - 1) * 100)
                ok = ok and abs(t / z - 1) < 0.02
            else:
                # The others have no zoo twin: their plans must at least run.
                t = parasol_json(parasol, "simulate", "-m", path, "-p", params, "-x",
                                 "dgx-a100")["iteration_time_s"]
                line += "; data parallel on dgx-a100 at %s: %.4f ms" % (params, t * 1e3)
                ok = ok and t > 0
            print(("ok    " if ok else "FAIL  ") + line)
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
