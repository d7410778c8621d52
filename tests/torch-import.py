#!/usr/bin/env python3
"""torch-import.py PARASOL: PyTorch modules exported by tools/torch2parasol.py and imported
by `parasol import` keep PyTorch's parameter count exactly, and the torchvision models the
zoo also has (ResNet-50, Inception-v3) predict the zoo's iteration time within 2% under
data parallelism over a DGX A100; the others' data-parallel plans simulate.

The torchvision models (also MobileNetV2, SqueezeNet 1.0, GoogLeNet, EfficientNet-B0,
ViT-B/16, AlexNet, VGG-16 and DenseNet-121) have the multiply-adds per image that torchvision publishes for them within 2%:
the "GFLOPS" column of https://pytorch.org/vision/stable/models.html (the multiply-adds of
convolutions, linear layers and matrix products, at 224 x 224, 299 x 299 for
Inception-v3), here half the forward FLOPs of parasol's conv2d, linear, matmul and
attention operators at batch 1.  Each also simulates a two-stage pipeline over two
DGX A100 (--pp 2) and is searched (parasol search, 50 evaluations), the search's plan no
slower than data parallelism.

The modules are made here with random weights (nothing is downloaded): torchvision's
classification models, a torch.nn.TransformerEncoder, and a small module of
embedding, layer norm, SiLU and a linear layer, a TransformerDecoder, GPT-style models,
a LLaMA-style decoder (RMSNorm, rotary attention, SwiGLU, GPT-2's tanh GELU:
tests/data/onnx/make-llama.py), grouped-query attention written out and a
MultiheadAttention under a key padding mask (tests/data/onnx/make-attention.py), a small
ViT and a 1-D CNN whose multiply-adds must equal those counted from PyTorch's shapes
(tests/data/onnx/make-vision.py).

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
make_vision = __import__("make-vision")
make_attention = __import__("make-attention")


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


def torch_macs(module, inputs):
    """Multiply-adds of @module's Conv1d, Conv2d and Linear layers on @inputs, counted from
    the shapes PyTorch computes (output elements x inputs per output)."""
    total = [0]

    def hook(m, _, out):
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)):
            per = m.in_channels // m.groups
            for k in m.kernel_size:
                per *= k
            total[0] += out.numel() * per
        elif isinstance(m, torch.nn.Linear):
            total[0] += out.numel() * m.in_features

    hooks = [m.register_forward_hook(hook) for m in module.modules()]
    with torch.no_grad():
        module.eval()(*inputs)
    for h in hooks:
        h.remove()
    return total[0]


def parasol_json(parasol, *args):
    out = subprocess.run([parasol] + list(args) + ["--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("parasol %s: %s" % (" ".join(args), out.stderr.strip()))
    return json.loads(out.stdout)


# torchvision's published multiply-adds per image, in billions (see the docstring).
PUBLISHED_GMACS = {"resnet-50": 4.09, "inception-v3": 5.71, "mobilenet-v2": 0.30,
                   "squeezenet-1.0": 0.82, "googlenet": 1.50, "efficientnet-b0": 0.39,
                   "vit-b-16": 17.56, "alexnet": 0.71, "vgg-16": 15.47, "densenet-121": 2.83}
MAC_OPS = ("conv2d", "linear", "matmul", "attention", "gated_mlp")


def check_vision(parasol, name, path):
    """The multiply-adds against torchvision's figure, --pp 2 and a short search; returns
    (ok, text)."""
    show = parasol_json(parasol, "model", "show", path, "--param", "batch=1")
    gmacs = sum(o["forward_flops"] for o in show["operators"] if o["type"] in MAC_OPS) / 2e9
    want = PUBLISHED_GMACS[name]
    ok = abs(gmacs / want - 1) <= 0.02
    text = "; %.3f GMACs, torchvision %.2f (%+.1f%%)" % (gmacs, want, (gmacs / want - 1) * 100)
    pp = parasol_json(parasol, "simulate", "-m", path, "-p", "batch=256", "-x", "dgx-a100:2",
                      "--pp", "2")["iteration_time_s"]
    text += "; --pp 2 on 2 x dgx-a100: %.4f ms" % (pp * 1e3)
    ok = ok and pp > 0
    s = parasol_json(parasol, "search", "-m", path, "-p", "batch=256", "-x", "dgx-a100",
                     "-b", "50evals", "-q")
    text += "; search %.4f ms (data parallel %.4f ms)" % (s["iteration_time_s"] * 1e3,
                                                         s["data_parallel_s"] * 1e3)
    ok = ok and 0 < s["iteration_time_s"] <= s["data_parallel_s"]
    return ok, text


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
    cases.append(("conv1d",) + make_vision.conv1d() + ("batch=64",))
    cases.append(("vit-tiny",) + make_vision.vit_tiny() + ("batch=64",))
    cases.append(("gqa",) + make_attention.gqa() + ("batch=16,seq=128",))
    cases.append(("padding-mask",) + make_attention.padding_mask() + ("batch=16,seq=128",))
    for name, tv in (("mobilenet-v2", "mobilenet_v2"), ("squeezenet-1.0", "squeezenet1_0"),
                     ("googlenet", "googlenet"), ("efficientnet-b0", "efficientnet_b0"),
                     ("vit-b-16", "vit_b_16"), ("alexnet", "alexnet"), ("vgg-16", "vgg16"),
                     ("densenet-121", "densenet121")):
        cases.append((name,) + torch2parasol.torchvision_model(tv, 2, 0) + ("batch=256",))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, module, inputs, dynamic, params in cases:
            path = os.path.join(tmp, name + ".onnx")
            want = torch2parasol.export_onnx(module, inputs, path, dynamic)
            got = parasol_json(parasol, "model", "show", path, "--param", params)["parameters"]
            line = "%-15s parameters: PyTorch %d, imported %d" % (name, want, got)
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
            if name == "conv1d":
                # The 1-D layers are 2-D ones of height 1: the same multiply-adds, counted
                # from PyTorch's shapes at batch 1.
                show = parasol_json(parasol, "model", "show", path, "--param", "batch=1")
                macs = sum(o["forward_flops"] for o in show["operators"]
                           if o["type"] in MAC_OPS) / 2
                want_macs = torch_macs(module, (inputs[0][:1],))
                line += "; %d multiply-adds, PyTorch's shapes %d" % (macs, want_macs)
                ok = ok and macs == want_macs
            if name in PUBLISHED_GMACS:
                vok, text = check_vision(parasol, name, path)
                ok = ok and vok
                line += text
            print(("ok    " if ok else "FAIL  ") + line)
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
