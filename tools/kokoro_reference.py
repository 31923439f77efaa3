#!/usr/bin/env python3
"""Reference activations of Kokoro-82M (int8 ONNX) from ONNX Runtime, for kiln's tests.

Runs the golden case (../shared/assets/golden/kokoro_int8_jf_alpha_case.json) through ONNX
Runtime with a few intermediate tensors exposed as graph outputs, and writes them to
crates/kiln-models/tests/fixtures/kokoro_jf_alpha_ort.npz (np.savez, uncompressed):

  asr       (512, frames)  aligned text-encoder features (decoder input)
  f0, n     (2 frames,)    predicted F0 and energy curves (decoder inputs)
  dur_sum   (tokens,)      sum of sigmoid(duration logits): durations before rounding
  durations (tokens,)      rounded durations (frames per token)

Usage: pip install onnxruntime==1.32.0 onnx numpy; python3 tools/kokoro_reference.py MODEL_DIR
(MODEL_DIR: the kokoro-82m entry of kiln's cache, e.g. ~/.cache/kiln/models/kokoro-82m).
"""
import json, os, sys

import numpy as np
import onnx
import onnxruntime as ort

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model_dir = sys.argv[1]
case = json.load(open(os.path.join(root, "..", "shared", "assets", "golden", "kokoro_int8_jf_alpha_case.json")))
m = onnx.load(os.path.join(model_dir, "kokoro-v1.0.int8.onnx"))
taps = {
    "asr": "/encoder/MatMul_1_output_0",
    "f0": "/encoder/F0_proj/Conv_output_0",
    "n": "/encoder/N_proj/Conv_output_0",
    "logits": "/encoder/predictor/duration_proj/linear_layer/Add_output_0",
    "durations": "/encoder/Round_output_0",
}
for t in taps.values():
    m.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
voice = np.load(os.path.join(model_dir, "voices.npz"))[case["voice"]]
style = voice[case["style_row"]].reshape(1, 256).astype(np.float32)
outs = sess.run(["audio"] + list(taps.values()), {
    "tokens": np.array([case["input_ids"]], dtype=np.int64),
    "style": style,
    "speed": np.array([case["speed"]], dtype=np.float32),
})
got = dict(zip(["audio"] + list(taps.keys()), outs))
golden = np.load(os.path.join(root, "..", "shared", "assets", "golden", "kokoro_int8_jf_alpha_out_f32.npy"))
assert np.array_equal(got["audio"], golden), "ONNX Runtime no longer reproduces the golden waveform"
dur_sum = (1.0 / (1.0 + np.exp(-got["logits"][0].astype(np.float64)))).sum(-1) / case["speed"]
out = os.path.join(root, "crates", "kiln-models", "tests", "fixtures", "kokoro_jf_alpha_ort.npz")
np.savez(out,
         asr=got["asr"][0].astype(np.float32),
         f0=got["f0"].reshape(-1).astype(np.float32),
         n=got["n"].reshape(-1).astype(np.float32),
         dur_sum=dur_sum.astype(np.float32),
         durations=got["durations"].reshape(-1).astype(np.float32))
print("wrote", out, {k: v.shape for k, v in got.items()})
