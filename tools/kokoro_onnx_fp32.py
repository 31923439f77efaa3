#!/usr/bin/env python3
"""Rebuilds a float32 Kokoro ONNX graph from the int8 kokoro-onnx export, undoing ONNX Runtime's
dynamic quantization node by node, so kiln's reader of the fp32 export can be tested without
the real file. Needs the `onnx` package (and numpy).

    tools/kokoro_onnx_fp32.py kokoro-v1.0.int8.onnx kokoro-v1.0.fp32.onnx

What the quantizer made, and what it becomes again (names as the quantizer derived them from
the float graph's, so the float graph's names come back):
- DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q) -> Cast -> Mul(x_scale * W_scale):
  MatMul(x, W) with W = (W_q - W_zp) * W_scale, named without `_quantized`; where the
  float graph had a Linear as `.../fc/Gemm` (the quantizer's `Gemm_MatMul_quant` followed by
  `Add(bias)`): Gemm(x, W^T, bias, transB=1) under the weight's own name (`...fc.weight`);
- ConvInteger(x_q, W_q) [-> Add(quantized bias)] -> Cast -> Mul: Conv(x, W[, bias]) with the
  same attributes;
- DynamicQuantizeLSTM(x, W_q, R_q, B, ...): LSTM(x, W, R, B, ...) with W (2, 4h, in) and
  R (2, 4h, h) (the quantized op holds them transposed);
- Gather(table_q, ids) -> DequantizeLinear: Gather(table, ids);
- nodes and initializers nothing reads any more are removed.
"""
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def main(src, dst):
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    consumers = {}
    producer = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n

    def arr(name):
        return numpy_helper.to_array(inits[name])

    def dequant(q, scale, zp, axis):
        q, s = arr(q).astype(np.float32), arr(scale).astype(np.float32)
        z = arr(zp).astype(np.float32) if zp else np.zeros(1, np.float32)
        shape = [1] * q.ndim
        if s.size > 1 or z.size > 1:
            shape[axis] = -1
        return (q - z.reshape(shape)) * s.reshape(shape)

    new_inits = {}

    def add_init(name, a):
        new_inits[name] = numpy_helper.from_array(np.ascontiguousarray(a, np.float32), name)
        return name

    def only(out, op):
        c = consumers.get(out, [])
        if len(c) != 1 or c[0].op_type != op:
            sys.exit(f"{out}: expected one {op} consumer, found {[n.op_type for n in c]}")
        return c[0]

    def float_input(name):
        """The float tensor a DynamicQuantizeLinear output came from."""
        p = producer[name]
        if p.op_type != "DynamicQuantizeLinear":
            sys.exit(f"{name}: not a DynamicQuantizeLinear output ({p.op_type})")
        return p.input[0]

    drop = set()
    out_nodes = []
    for n in g.node:
        if id(n) in drop:
            continue
        if n.op_type == "MatMulInteger" and n.input[1] in inits:
            x = float_input(n.input[0])
            cast = only(n.output[0], "Cast")
            mul = only(cast.output[0], "Mul")
            wname = n.input[1]
            w = dequant(wname, wname[: -len("_quantized")] + "_scale", n.input[3] if len(n.input) > 3 else "", 1)
            base = wname[: -len("_quantized")]
            drop.update({id(cast), id(mul)})
            add = consumers.get(mul.output[0], [])
            if (
                n.name.endswith("Gemm_MatMul_quant")
                and len(add) == 1
                and add[0].op_type == "Add"
                and add[0].input[1] in inits
            ):
                drop.add(id(add[0]))
                out_nodes.append(
                    helper.make_node(
                        "Gemm",
                        [x, add_init(base, w.T), add[0].input[1]],
                        [add[0].output[0]],
                        name=n.name[: -len("_MatMul_quant")],
                        transB=1,
                    )
                )
            else:
                name = n.name[: -len("_quant")] if n.name.endswith("_quant") else n.name
                out_nodes.append(helper.make_node("MatMul", [x, add_init(base, w)], [mul.output[0]], name=name))
        elif n.op_type == "ConvInteger":
            x = float_input(n.input[0])
            wname = n.input[1]
            base = wname[: -len("_quantized")]
            w = dequant(wname, base + "_scale", n.input[3] if len(n.input) > 3 else "", 0)
            nxt = consumers[n.output[0]][0]
            bias = []
            if nxt.op_type == "Add":
                # The quantized bias: `<bias>_quantizedbias_add`, the float bias beside it.
                bname = nxt.name[: -len("_quantizedbias_add")]
                if bname not in inits:
                    sys.exit(f"{n.name}: no float bias '{bname}'")
                bias = [bname]
                drop.add(id(nxt))
                nxt = only(nxt.output[0], "Cast")
            cast = nxt
            mul = only(cast.output[0], "Mul")
            drop.update({id(cast), id(mul)})
            name = n.name[: -len("_quant")] if n.name.endswith("_quant") else n.name
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            out_nodes.append(
                helper.make_node("Conv", [x, add_init(base, w)] + bias, [mul.output[0]], name=name, **attrs)
            )
        elif n.op_type == "DynamicQuantizeLSTM":
            i = list(n.input) + [""] * (12 - len(n.input))
            wq, rq = i[1], i[2]
            w = dequant(wq, i[8], i[9], 0).transpose(0, 2, 1)
            r = dequant(rq, i[10], i[11], 0).transpose(0, 2, 1)
            ins = [i[0], add_init(wq[: -len("_quantized")], w), add_init(rq[: -len("_quantized")], r)] + i[3:8]
            while ins and ins[-1] == "":
                ins.pop()
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            name = n.name[: -len("_quant")] if n.name.endswith("_quant") else n.name
            out_nodes.append(helper.make_node("LSTM", ins, list(n.output), name=name, domain="", **attrs))
        elif n.op_type == "DequantizeLinear" and producer.get(n.input[0], n).op_type == "Gather":
            gth = producer[n.input[0]]
            tq = gth.input[0]
            table = add_init(tq[: -len("_quantized")], dequant(tq, n.input[1], n.input[2], 0))
            out_nodes = [o for o in out_nodes if o is not gth]
            out_nodes.append(
                helper.make_node("Gather", [table, gth.input[1]], [n.output[0]], name=gth.name, **{a.name: helper.get_attribute_value(a) for a in gth.attribute})
            )
        else:
            out_nodes.append(n)
    # Dead nodes (the activation quantizers, scale products), then unread initializers.
    graph_out = {o.name for o in g.output}
    while True:
        read = {i for n in out_nodes for i in n.input} | graph_out
        keep = [n for n in out_nodes if any(o in read for o in n.output)]
        if len(keep) == len(out_nodes):
            break
        out_nodes = keep
    read = {i for n in out_nodes for i in n.input}
    initializers = [t for name, t in {**inits, **new_inits}.items() if name in read]
    del g.node[:]
    g.node.extend(out_nodes)
    del g.initializer[:]
    g.initializer.extend(initializers)
    del g.value_info[:]
    left = sorted({n.op_type for n in out_nodes} & {"MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "DynamicQuantizeLinear", "DequantizeLinear"})
    if left:
        sys.exit(f"quantized ops left: {left}")
    onnx.save(m, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
