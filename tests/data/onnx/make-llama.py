#!/usr/bin/python3
"""Writes llama.onnx: a LLaMA-style decoder written in PyTorch as LLaMA implementations
write it (RMSNorm by pow, mean and rsqrt; causal attention with rotary embeddings from
cos and sin tables and rotate_half; a SwiGLU MLP; GPT-2's tanh GELU in a second MLP),
with random weights and without them in the file (tests/test-import.c,
tests/torch-import.py).  Needs python3-torch and python3-onnx."""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(torch.nn.Module):
    """Causal attention with rotary position embeddings; the cos and sin tables are
    buffers (not parameters)."""

    def __init__(self, d, h, ctx):
        super().__init__()
        self.h = h
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))
        hd = d // h
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        f = torch.outer(torch.arange(ctx).float(), inv)
        e = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", e.cos())
        self.register_buffer("sin", e.sin())

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.h
        q, k, v = (p(x).view(b, s, self.h, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        a = a.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1),
                          float("-inf"))
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        return self.o(y)


class SwiGLU(torch.nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.w1 = torch.nn.Linear(d, ffn, bias=False)
        self.w3 = torch.nn.Linear(d, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class NewGELUMLP(torch.nn.Module):
    """GPT-2's MLP with its gelu_new written out."""

    def __init__(self, d):
        super().__init__()
        self.fc = torch.nn.Linear(d, 4 * d)
        self.proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(h)


class Block(torch.nn.Module):
    def __init__(self, d, h, ffn, ctx):
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, h, ctx)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, ffn)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(torch.nn.Module):
    """Token embedding, LLaMA blocks, a GPT-2 MLP (tanh GELU), a final RMSNorm, a head."""

    def __init__(self, vocab=1000, d=128, h=4, ffn=344, layers=2, ctx=256):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, h, ffn, ctx) for _ in range(layers))
        self.gpt2_mlp = NewGELUMLP(d)
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        x = x + self.gpt2_mlp(x)
        return self.head(self.norm(x))


def example():
    """(module, example inputs, symbolic dimensions) for torch2parasol.export_onnx."""
    return Llama(), (torch.randint(0, 1000, (2, 16)),), {0: "batch", 1: "seq"}


if __name__ == "__main__":
    import torch2parasol
    torch.manual_seed(0)
    module, inputs, dynamic = example()
    n = torch2parasol.export_onnx(module, inputs, "llama.onnx", dynamic)
    print("llama.onnx: %d parameters in PyTorch" % n)
