#!/usr/bin/python3
"""Writes unsupported.onnx: a Conv whose output goes through Einsum, an operator the
importer does not support (tests/test-import.c).  Needs python3-onnx."""
import onnx
from onnx import TensorProto, helper

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3, 3, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 6, 6])
conv = helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3])
ein = helper.make_node("Einsum", ["c"], ["y"], name="mix", equation="bchw->bchw")
graph = helper.make_graph([conv, ein], "unsupported", [x, w], [y])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
          "unsupported.onnx")
