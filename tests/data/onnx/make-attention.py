#!/usr/bin/python3
"""Writes gqa.onnx and padding-mask.onnx (tests/test-import.c, tests/torch-import.py) with
random weights, without them in the files:

  gqa.onnx           grouped-query attention written out as LLaMA implementations write
                     it: 4 query heads of 16 over 2 key and value heads, the keys and
                     values repeated by x[:, :, None].expand(...).reshape(...)
  padding-mask.onnx  torch.nn.MultiheadAttention (width 64, 4 heads) under a key padding
                     mask [batch, seq]

Needs python3-torch and python3-onnx."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))


class GQA(torch.nn.Module):
    def __init__(self, d=64, h=4, kv=2):
        super().__init__()
        self.h, self.kv = h, kv
        hd = d // h
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv * hd, bias=False)
        self.v = torch.nn.Linear(d, kv * hd, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        hd, r = d // self.h, self.h // self.kv
        q = self.q(x).view(b, s, self.h, hd).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, hd).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv, hd).transpose(1, 2)
        k = k[:, :, None].expand(b, self.kv, r, s, hd).reshape(b, self.h, s, hd)
        v = v[:, :, None].expand(b, self.kv, r, s, hd).reshape(b, self.h, s, hd)
        a = (q @ k.transpose(-2, -1)) / hd ** 0.5
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)


class PaddingMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x, mask):
        return self.attn(x, x, x, key_padding_mask=mask, need_weights=False)[0]


def gqa():
    """(module, example inputs, symbolic dimensions) for torch2parasol.export_onnx."""
    return GQA(), (torch.randn(2, 8, 64),), {0: "batch", 1: "seq"}


def padding_mask():
    return (PaddingMask(), (torch.randn(2, 8, 64), torch.zeros(2, 8, dtype=torch.bool)),
            {"input0": {0: "batch", 1: "seq"}, "input1": {0: "batch", 1: "seq"}})


if __name__ == "__main__":
    import torch2parasol
    torch.manual_seed(0)
    for name, make in (("gqa", gqa), ("padding-mask", padding_mask)):
        module, inputs, dynamic = make()
        n = torch2parasol.export_onnx(module, inputs, name + ".onnx", dynamic)
        print("%s.onnx: %d parameters in PyTorch" % (name, n))
