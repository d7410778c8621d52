#!/usr/bin/python3
"""Writes the small pattern files of tests/test-import.c from PyTorch modules (random
weights, none in the files):
  gelu-rmsnorm.onnx  a linear, gelu(approximate="tanh") as PyTorch 1.13 exports it
                     (x * x * x), a linear, and RMSNorm written as x / sqrt(mean(x^2) + eps)
  reducemean.onnx    a linear whose output is scaled by its own mean: a ReduceMean
                     outside RMSNorm, which the importer refuses
Needs python3-torch and python3-onnx."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))
import torch2parasol  # noqa: E402


class GeluRMSNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 64)
        self.proj = torch.nn.Linear(64, 16)
        self.weight = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        x = self.proj(torch.nn.functional.gelu(self.fc(x), approximate="tanh"))
        return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


class MeanScaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        x = self.fc(x)
        return x.mean(-1, keepdim=True) * x


if __name__ == "__main__":
    torch.manual_seed(0)
    for name, module in (("gelu-rmsnorm.onnx", GeluRMSNorm()), ("reducemean.onnx", MeanScaled())):
        n = torch2parasol.export_onnx(module, (torch.randn(2, 4, 16),), name, {0: "batch"})
        print("%s: %d parameters in PyTorch" % (name, n))
