#!/usr/bin/python3
"""Writes conv1d.onnx and vit-tiny.onnx (tests/test-import.c, tests/torch-import.py) with
random weights, without them in the files:

  conv1d.onnx    a 1-D CNN over 16 channels: Conv1d, BatchNorm1d and ReLU, MaxPool1d in
                 ceil mode, a strided, dilated, grouped Conv1d without bias and ReLU6,
                 global average pooling and a classifier
  vit-tiny.onnx  torchvision's VisionTransformer at 32 x 32 in patches of 8, one layer of
                 width 32 with 2 heads: a class token and a position embedding, learned
                 tensors used as data

Needs python3-torch, python3-torchvision and python3-onnx."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools"))


class Conv1d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(16, 32, 5, padding=2)
        self.bn = torch.nn.BatchNorm1d(32)
        self.pool = torch.nn.MaxPool1d(3, 2, ceil_mode=True)
        self.c2 = torch.nn.Conv1d(32, 64, 3, stride=2, dilation=2, groups=2, bias=False)
        self.act = torch.nn.ReLU6()  # one Clip (the functional relu6 exports Relu, Clip)
        self.gp = torch.nn.AdaptiveAvgPool1d(1)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.c1(x))))
        x = self.act(self.c2(x))
        return self.fc(self.gp(x).flatten(1))


def conv1d():
    """(module, example inputs, symbolic dimensions) for torch2parasol.export_onnx."""
    return Conv1d(), (torch.randn(2, 16, 100),), {0: "batch"}


def vit_tiny():
    import torchvision

    module = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1,
                                                  num_heads=2, hidden_dim=32, mlp_dim=64,
                                                  num_classes=10)
    return module, (torch.randn(2, 3, 32, 32),), {0: "batch"}


if __name__ == "__main__":
    import torch2parasol
    torch.manual_seed(0)
    for name, make in (("conv1d", conv1d), ("vit-tiny", vit_tiny)):
        module, inputs, dynamic = make()
        n = torch2parasol.export_onnx(module, inputs, name + ".onnx", dynamic)
        print("%s.onnx: %d parameters in PyTorch" % (name, n))
