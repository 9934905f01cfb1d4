"""Moonshine's packaged ONNX models made fast for onnxruntime's CPU, once, into the cache.

``moonshine-cpp`` (MIT) ships Moonshine base English as ORT-format files for its own C++ runtime. Loaded as they
are, every decoder step turns all the weights from int8 back into float (a ``Cast``, ``Mul`` and ``Add`` per
matrix, which the format keeps from being folded) and transposes the 32768-word output matrix: 50 ms a token
on one core. :func:`convert` writes what onnxruntime runs well instead:

- the weights computed once (those chains folded into float initializers, the transpose too);
- the merged decoder's two branches as two models, ``decoder_first`` (the first token: it also projects the
  encoder's output for the cross-attention) and ``decoder_step`` (every later token, from the cache);
- every matrix product with a weight quantized to 8 bits (unsigned: :data:`WEIGHTS`) by onnxruntime's own dynamic
  quantizer, and the embedding's lookup table kept in float16.

On a 2-core AMD EPYC a token then takes 5-6 ms and the encoder 0.04-0.09 s for 3-7 s of speech, and the real
recordings are heard as well as by moonshine-cpp's own runtime (normalised WER 0.025 here, 0.031 there).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

FILES = {"encoder": "encoder_model", "decoder": "decoder_model_merged"}  # the package's names, .ort or .onnx
TOKENIZER = "tokenizer.bin"
OUTPUTS = ("encoder.onnx", "decoder_first.onnx", "decoder_step.onnx", TOKENIZER)
# unsigned 8-bit weights (onnxruntime's U8U8 products): its U8S8 ones saturate on CPUs without VNNI (its
# documentation), so their words would depend on the CPU; these are exact on every CPU. On an AVX-512 VNNI EPYC,
# against U8S8: the real set's normalised WER 0.025 against 0.037, espeak 0.124 against 0.101 (whole clips), 25 % slower; 7-bit
# U8S8 weights (exact too) heard the real set as well but espeak at 0.20
WEIGHTS = "QUInt8"
VERSION = 3  # of the conversion: part of the cached folder's name, so a changed conversion is made again


def source_file(folder: Path, stem: str) -> Path | None:
    """``stem``.onnx or ``stem``.ort in ``folder``, whichever is there."""
    return next((path for suffix in (".onnx", ".ort") if (path := folder / (stem + suffix)).is_file()), None)


def missing(folder: Path) -> list[str]:
    """The files of a Moonshine folder (moonshine-cpp's layout) that ``folder`` lacks."""
    wanted = [stem + ".ort|.onnx" for stem in FILES.values() if source_file(folder, stem) is None]
    return wanted + ([TOKENIZER] if not (folder / TOKENIZER).is_file() else [])


def convert(source: Path, out: Path) -> None:
    """Write :data:`OUTPUTS` into the new folder ``out`` from the Moonshine folder ``source``."""
    import onnx

    out.mkdir()
    encoder = _plain(source_file(source, FILES["encoder"]), out / "encoder.tmp.onnx", onnx)
    _quantize(_folded(encoder, onnx), out / "encoder.onnx", out)
    decoder = _folded(_plain(source_file(source, FILES["decoder"]), out / "decoder.tmp.onnx", onnx), onnx)
    for branch, name in (("else_branch", "decoder_first.onnx"), ("then_branch", "decoder_step.onnx")):
        _quantize(_half_tables(_folded(_branch(decoder, branch, onnx), onnx)), out / name, out)
    shutil.copyfile(source / TOKENIZER, out / TOKENIZER)
    for path in out.glob("*.tmp.onnx"):
        path.unlink()


def _plain(path: Path | None, target: Path, onnx: Any) -> Any:
    """The model as an ONNX graph: onnxruntime reads the ORT format and writes it back out with only the basic
    (portable) rewrites; the subgraphs it leaves unnamed are named, as ONNX requires."""
    import onnxruntime

    assert path is not None, "missing() was checked"
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(str(target))
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH and not attribute.g.name:
                attribute.g.name = f"{node.name}_{attribute.name}"
    return model


def _cast(inputs: list[np.ndarray], node: Any) -> np.ndarray:
    from onnx import helper

    to = next(attribute.i for attribute in node.attribute if attribute.name == "to")
    return inputs[0].astype(helper.tensor_dtype_to_np_dtype(to))


def _transpose(inputs: list[np.ndarray], node: Any) -> np.ndarray:
    perm = next((list(attribute.ints) for attribute in node.attribute if attribute.name == "perm"), None)
    return np.ascontiguousarray(inputs[0].transpose(perm) if perm else inputs[0].T)


# the operations folded where every input is a weight: how the ORT files rebuild a float matrix from int8
_FOLD = {"Cast": _cast,
         "Mul": lambda inputs, node: inputs[0] * inputs[1],
         "Add": lambda inputs, node: inputs[0] + inputs[1],
         "Transpose": _transpose}


def _folded(model: Any, onnx: Any) -> Any:
    """``model`` with its top-level graph's constant chains computed once into initializers, and the
    initializers no node uses any more (in any subgraph) dropped."""
    from onnx import numpy_helper

    graph = model.graph
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    kept = []
    for node in graph.node:
        if node.op_type in _FOLD and node.input and all(name in values for name in node.input):
            values[node.output[0]] = np.asarray(_FOLD[node.op_type]([values[n] for n in node.input], node))
        else:
            kept.append(node)
    used = _used(kept, onnx) | {output.name for output in graph.output}
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in values.items() if name in used)
    return model


def _used(nodes: Any, onnx: Any) -> set[str]:
    """Every name the nodes read, their subgraphs' nodes and outputs included."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                names |= _used(attribute.g.node, onnx) | {output.name for output in attribute.g.output}
    return names


def _branch(merged: Any, branch: str, onnx: Any) -> Any:
    """One branch of the merged decoder's ``If`` (on ``use_cache_branch``) as a model of its own: the graph
    inputs and weights it reads from outside, and the ``If``'s outputs as its outputs."""
    from onnx import helper

    graph = merged.graph
    [switch] = [node for node in graph.node if node.op_type == "If"]
    body = next(attribute.g for attribute in switch.attribute if attribute.name == branch)
    outside = _used(body.node, onnx) - {name for node in body.node for name in node.output}
    nodes = list(body.node)
    for inner, outer in zip(body.output, switch.output):
        if inner.name != outer:
            nodes.append(helper.make_node("Identity", [inner.name], [outer]))
    inputs = [value for value in graph.input if value.name in outside]
    weights = [init for init in graph.initializer if init.name in outside] + list(body.initializer)
    made = helper.make_graph(nodes, branch, inputs, list(graph.output), initializer=weights)
    return helper.make_model(made, opset_imports=merged.opset_import, ir_version=merged.ir_version)


def _half_tables(model: Any) -> Any:
    """Lookup tables (``Gather`` of a weight: the 32768-word embedding, 54 MB in float) kept in float16 and made
    float after the lookup: each decoder half holds one, and a looked-up row loses nothing that matters."""
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {init.name: init for init in graph.initializer}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        table = weights.get(node.input[0]) if node.op_type == "Gather" and node.input else None
        values = numpy_helper.to_array(table) if table is not None and table.data_type == 1 else None
        if values is None or values.size < (1 << 20):
            continue
        graph.initializer.remove(table)
        graph.initializer.append(numpy_helper.from_array(values.astype(np.float16), table.name))
        looked_up = node.output[0]
        node.output[0] = looked_up + "_half"
        nodes.append(helper.make_node("Cast", [node.output[0]], [looked_up], to=1))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _quantize(model: Any, target: Path, scratch: Path) -> None:
    """``model`` with its weights' matrix products in int8 (onnxruntime's dynamic quantizer), saved to ``target``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    plain = scratch / (target.stem + ".float.tmp.onnx")
    onnx.save(model, str(plain))
    quantize_dynamic(str(plain), str(target), weight_type=getattr(QuantType, WEIGHTS), op_types_to_quantize=["MatMul"])
