#!/usr/bin/python3
"""torch2parasol.py — a PyTorch nn.Module as a parasol graph.

Exports the module with example inputs through torch.onnx.export (without its weights:
only shapes are needed) and imports the ONNX file with `parasol import` (docs/import.md).

    tools/torch2parasol.py torchvision:resnet50 --batch 64 -o resnet50.json
    tools/torch2parasol.py encoder --batch 8 --seq 128 --onnx encoder.onnx

MODEL is `torchvision:NAME` (a torchvision classification model, random weights, nothing
downloaded), `encoder` (torch.nn.TransformerEncoder, see --layers, --hidden, --heads) or
`PACKAGE.MODULE:FUNCTION`, a function returning (module, example inputs).  The batch (and
for the encoder the sequence) is a symbolic dimension of the ONNX file, so the graph can
be imported again at any size (`parasol import FILE.onnx --param batch=N`).

From Python:
    from torch2parasol import export_onnx
    export_onnx(module, (x,), "model.onnx", dynamic={0: "batch"})

Prints the module's parameter count as PyTorch counts it, which the imported graph must
equal (`parasol model show`).  Needs torch, and onnx to list the buffers in the file (Debian:
python3-torch, python3-torchvision, python3-onnx).
"""
import argparse
import importlib
import os
import subprocess
import sys
import warnings


def export_onnx(module, inputs, path, dynamic=None, input_names=None, opset=17):
    """Writes @module applied to @inputs (a tuple) as ONNX without weights.

    The module is exported in training mode, so batch normalization stays an operator
    (eval mode folds it into the convolutions) and dropout is kept.  Stochastic depth
    (torchvision.ops.StochasticDepth, whose random draw has no ONNX export) is exported
    as the identity it is at inference: its per-sample mask and product are left out.
    @dynamic maps an input dimension to a symbolic name ({0: "batch"}) for every input,
    or is a dict of such dicts by input name.

    The module's buffers that the file holds (rotary tables, for instance) are listed in
    the model's metadata under "parasol.buffers", so that the importer counts a learned
    tensor used as data (a ViT's class token) as parameters and a buffer not.
    """
    import torch

    names = input_names or ["input%d" % i if len(inputs) > 1 else "input"
                            for i in range(len(inputs))]
    if dynamic and all(isinstance(k, int) for k in dynamic):
        dynamic = {n: dict(dynamic) for n in names}
    module.train()
    drops = [m for m in module.modules() if type(m).__name__ == "StochasticDepth"]
    kept = [m.p for m in drops]
    try:
        for m in drops:
            m.p = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, tuple(inputs), path, export_params=False,
                              training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, opset_version=opset,
                              input_names=names, output_names=["output"],
                              dynamic_axes=dynamic or {})
    finally:
        for m, p in zip(drops, kept):
            m.p = p
    mark_buffers(path, [n for n, _ in module.named_buffers()])
    return sum(p.numel() for p in module.parameters())


def mark_buffers(path, buffers):
    """Lists in ONNX file @path's metadata ("parasol.buffers") which of its graph inputs and
    initializers are among @buffers."""
    import onnx

    model = onnx.load(path)
    held = [v.name for v in model.graph.input] + [t.name for t in model.graph.initializer]
    named = sorted(set(held) & set(buffers))
    props = {p.key: p.value for p in model.metadata_props}
    props["parasol.buffers"] = ",".join(named)
    onnx.helper.set_model_props(model, props)
    onnx.save(model, path)


def torchvision_model(name, batch, image):
    import torch
    import torchvision

    kwargs = {"weights": None}
    if name == "inception_v3":
        # The zoo's Inception-v3, like most training recipes' figures, is without the
        # auxiliary classifier; init_weights=False skips scipy's truncated normal.
        kwargs.update(aux_logits=False, init_weights=False)
    elif name == "googlenet":
        # Likewise; its auxiliary classifiers' pooling to 4 x 4 has no ONNX export.
        kwargs.update(aux_logits=False, init_weights=False)
    module = getattr(torchvision.models, name)(**kwargs)
    size = image or (299 if name == "inception_v3" else 224)
    return module, (torch.randn(batch, 3, size, size),), {0: "batch"}


def encoder_model(batch, seq, layers, hidden, heads):
    import torch

    layer = torch.nn.TransformerEncoderLayer(d_model=hidden, nhead=heads,
                                             dim_feedforward=4 * hidden, dropout=0.1,
                                             activation="gelu", batch_first=True)
    module = torch.nn.TransformerEncoder(layer, num_layers=layers)
    return module, (torch.randn(batch, seq, hidden),), {0: "batch", 1: "seq"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="torchvision:NAME, encoder, or PACKAGE.MODULE:FUNCTION")
    ap.add_argument("--batch", type=int, default=2, help="batch of the example input")
    ap.add_argument("--image", type=int, default=0, help="image size (default: the model's)")
    ap.add_argument("--seq", type=int, default=16, help="encoder: sequence length")
    ap.add_argument("--layers", type=int, default=2, help="encoder: layers")
    ap.add_argument("--hidden", type=int, default=256, help="encoder: width")
    ap.add_argument("--heads", type=int, default=8, help="encoder: attention heads")
    ap.add_argument("--onnx", help="keep the ONNX file here")
    ap.add_argument("-o", "--output", help="write the parasol graph here (needs --parasol)")
    ap.add_argument("--parasol", default=os.environ.get("PARASOL", "parasol"),
                    help="the parasol program (default: $PARASOL or parasol)")
    ap.add_argument("--param", action="append", default=[],
                    help="sizes for the import, e.g. batch=64 (default: the example's)")
    args = ap.parse_args()

    import torch
    torch.manual_seed(0)
    if args.model.startswith("torchvision:"):
        module, inputs, dynamic = torchvision_model(args.model.split(":", 1)[1], args.batch,
                                                    args.image)
        params = ["batch=%d" % args.batch]
    elif args.model == "encoder":
        module, inputs, dynamic = encoder_model(args.batch, args.seq, args.layers, args.hidden,
                                                args.heads)
        params = ["batch=%d" % args.batch, "seq=%d" % args.seq]
    elif ":" in args.model:
        mod, fn = args.model.split(":", 1)
        module, inputs = getattr(importlib.import_module(mod), fn)()
        dynamic = {0: "batch"}
        params = ["batch=%d" % inputs[0].shape[0]]
    else:
        ap.error("MODEL: expected torchvision:NAME, encoder or PACKAGE.MODULE:FUNCTION")

    onnx_path = args.onnx or (os.path.splitext(args.output or "model")[0] + ".onnx")
    count = export_onnx(module, inputs, onnx_path, dynamic)
    print("%s: %d parameters in PyTorch -> %s" % (args.model, count, onnx_path))
    if args.output:
        cmd = [args.parasol, "import", onnx_path, "-o", args.output]
        for p in args.param or params:
            cmd += ["--param", p]
        return subprocess.call(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
