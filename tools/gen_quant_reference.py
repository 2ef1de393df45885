#!/usr/bin/env python3
"""Writes dequantization / activation-quantization fixtures for quant_test.

Expected values come from the upstream Python `gguf` package (llama.cpp's
gguf-py: gguf.quants.dequantize / quantize), an implementation independent of
engine/quant, so the C++ test checks our decoders against it.

Usage:
  python3 tools/gen_quant_reference.py \
      [--model ~/.cache/decoded/gemma-3-270m-q4_k_m.gguf] \
      [--q4_1-model ~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf] \
      [--out tests/data/quant_reference.json]

Output (JSON object):
  dequant: [{type (GGML name), type_id, source, k, hex (raw row bytes),
             values (k f32 from gguf.quants.dequantize)}]
    - real rows of every type in the model (q8_0, q5_0, q4_K, q6_K, f32),
      first and a middle row of one tensor each;
    - real q4_1 rows of SmolLM2-135M-Instruct Q4_1 (--q4_1-model);
    - synthesised rows: q4_0, q5_1 and bf16 from gguf.quants.quantize, f16
      via numpy (gguf's F16 path), q5_K from random bytes with finite fp16
      d/dmin (gguf-py has no q5_K quantizer), q4_1 / q5_1 from random bytes
      with finite fp16 d and m of either sign, all dequantized by gguf.
  matmul: [{type, type_id, source, k, rows, m, w_hex (rows weight rows),
            act_hex (m activation rows, gguf.quants.quantize(.., Q8_0)),
            want, mag (m*rows, activation-major: float64 dot and sum of
            |products| of the gguf-dequantized weight and activation rows)}]
    - q4_1: 7 real rows of blk.0.ffn_down.weight (k 1536, 48 blocks);
    - q4_1 / q5_1: 7 rows of k 288 (9 blocks: an odd count) quantized by gguf.
  q8_0_activation: {k, input (f32), hex (gguf.quants.quantize(.., Q8_0))}
      input includes blocks whose scaled values land exactly on k+0.5, to pin
      the half-away-from-zero rounding of ggml's reference quantizer.
"""

import argparse
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def f32_list(a):
    return [float(v) for v in np.asarray(a, dtype=np.float32).reshape(-1)]


def case(qtype, source, raw, k):
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(1, -1)
    if qtype in (T.F32, T.F16, T.BF16):
        view = raw.view({T.F32: np.float32, T.F16: np.float16, T.BF16: np.uint16}[qtype])
        values = gguf.quants.dequantize(view if qtype != T.BF16 else raw, qtype)
    else:
        values = gguf.quants.dequantize(raw, qtype)
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    assert values.size == k, (qtype, values.size, k)
    return {"type": qtype.name.lower().replace("_k", "_K"), "type_id": int(qtype), "source": source, "k": k,
            "hex": raw.tobytes().hex(), "values": f32_list(values)}


def matmul_case(qtype, source, w_rows, k, act):
    """w_rows: [rows, row_bytes] uint8; act: [m, k] f32 activations."""
    w_rows = np.ascontiguousarray(w_rows, dtype=np.uint8)
    rows = w_rows.shape[0]
    w = np.asarray(gguf.quants.dequantize(w_rows, qtype), dtype=np.float64).reshape(rows, k)
    aq = gguf.quants.quantize(act.astype(np.float32), T.Q8_0)
    a = np.asarray(gguf.quants.dequantize(aq, T.Q8_0), dtype=np.float64).reshape(act.shape[0], k)
    want = a @ w.T
    mag = np.abs(a) @ np.abs(w).T
    return {"type": qtype.name.lower(), "type_id": int(qtype), "source": source, "k": k, "rows": rows,
            "m": int(act.shape[0]), "w_hex": w_rows.tobytes().hex(), "act_hex": aq.tobytes().hex(),
            "want": [float(v) for v in want.reshape(-1)], "mag": [float(v) for v in mag.reshape(-1)]}


def random_min_blocks(rng, nb, block_bytes):
    """Random code bytes with finite fp16 d and m of either sign."""
    blocks = rng.integers(0, 256, size=(nb, block_bytes), dtype=np.uint8)
    d = (rng.standard_normal(nb) * 0.01).astype(np.float16)
    m = (rng.standard_normal(nb) * 0.1).astype(np.float16)
    blocks[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    blocks[:, 2:4] = m.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--q4_1-model", dest="q4_1_model",
                    default=os.path.expanduser("~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                  "quant_reference.json"))
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.model)
    wanted = {T.Q8_0: "blk.0.attn_v.weight", T.Q5_0: "blk.0.attn_q.weight", T.Q4_K: "blk.0.attn_output.weight",
              T.Q6_K: "blk.0.ffn_down.weight", T.F32: "blk.0.attn_norm.weight"}
    tensors = {t.name: t for t in reader.tensors}
    cases = []
    for qtype, name in wanted.items():
        t = tensors[name]
        assert t.tensor_type == qtype, (name, t.tensor_type)
        k = int(t.shape[0])
        data = np.asarray(t.data)
        if qtype == T.F32:
            cases.append(case(qtype, f"{name} (whole)", data.reshape(-1).view(np.uint8), k))
            continue
        rows = data.reshape(data.shape[0], -1)
        for r in (0, rows.shape[0] // 2 + 1):
            cases.append(case(qtype, f"{name} row {r}", rows[r], k))

    smol = {t.name: t for t in gguf.GGUFReader(args.q4_1_model).tensors}
    q4_1_rows = {}
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        t = smol[name]
        assert t.tensor_type == T.Q4_1, (name, t.tensor_type)
        q4_1_rows[name] = (int(t.shape[0]), np.asarray(t.data).reshape(int(t.shape[1]), -1))
    k, rows = q4_1_rows["blk.0.attn_q.weight"]
    for r in (0, rows.shape[0] // 2 + 1):
        cases.append(case(T.Q4_1, f"blk.0.attn_q.weight row {r} (SmolLM2 Q4_1)", rows[r], k))

    rng = np.random.default_rng(1234)
    # Q4_0 / BF16 / F16 through gguf's own quantizers.
    x = rng.standard_normal((2, 256)).astype(np.float32) * 0.05
    for r in range(2):
        cases.append(case(T.Q4_0, f"synthetic row {r}", gguf.quants.quantize(x[r:r + 1], T.Q4_0), 256))
    cases.append(case(T.BF16, "synthetic", gguf.quants.quantize(x[0:1] * 37.0, T.BF16).view(np.uint8), 256))
    xf16 = np.concatenate([x[1] * 300.0, np.array([6.0e-8, -6.0e-8, 1.0e-5, 65504.0], np.float32)])[:256]
    cases.append(case(T.F16, "synthetic", gguf.quants.quantize(xf16.reshape(1, -1), T.F16).view(np.uint8), 256))
    # Q5_1 through gguf's quantizer; Q4_1 / Q5_1 from random bytes.
    for r in range(2):
        cases.append(case(T.Q5_1, f"synthetic row {r}", gguf.quants.quantize(x[r:r + 1] + 0.02, T.Q5_1), 256))
    rng_min = np.random.default_rng(4321)  # own stream: the older cases stay as they were
    cases.append(case(T.Q4_1, "random bytes", random_min_blocks(rng_min, 8, 20), 256))
    cases.append(case(T.Q5_1, "random bytes", random_min_blocks(rng_min, 8, 24), 256))
    # Q5_K: random bytes with small positive fp16 super-block scales.
    for r in range(2):
        nb = 2
        blocks = rng.integers(0, 256, size=(nb, 176), dtype=np.uint8)
        d = (rng.random((nb, 2)) * 0.01 + 1e-4).astype(np.float16)
        blocks[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
        cases.append(case(T.Q5_K, f"random bytes row {r}", blocks.reshape(-1), 256 * nb))

    # Q8_0 activation quantization reference.
    act = rng.standard_normal(640).astype(np.float32) * 3.0
    # Block 1: amax 127 -> d = 1, id = 1, so k+0.5 inputs are exact ties.
    act[32:64] = np.linspace(-15.5, 15.5, 32, dtype=np.float32)
    act[32] = 127.0
    act[33] = -2.5
    act[34] = 0.5
    act[35] = -0.5
    act[64:96] = 0.0  # all-zero block: d = 0
    q = gguf.quants.quantize(act.reshape(1, -1), T.Q8_0)

    # Mat-vec references for the types with a min term (activations Q8_0).
    matmuls = []
    k, rows = q4_1_rows["blk.0.ffn_down.weight"]
    pick = [0, 1, 77, 200, 311, 402, rows.shape[0] - 1]
    matmuls.append(matmul_case(T.Q4_1, "blk.0.ffn_down.weight rows " + ",".join(map(str, pick)) + " (SmolLM2 Q4_1)",
                               rows[pick], k, rng_min.standard_normal((5, k)).astype(np.float32)))
    for qtype in (T.Q4_1, T.Q5_1):
        wf = (rng_min.standard_normal((7, 288)) * 0.05 + rng_min.standard_normal((7, 1)) * 0.02).astype(np.float32)
        wq = gguf.quants.quantize(wf, qtype).reshape(7, -1)
        matmuls.append(matmul_case(qtype, "synthetic 9 blocks", wq, 288,
                                   (rng_min.standard_normal((5, 288)) * 2.0).astype(np.float32)))

    out = {"dequant": cases, "q8_0_activation": {"k": 640, "input": f32_list(act), "hex": q.tobytes().hex()},
           "matmul": matmuls}
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.out}: {len(cases)} rows, {len(matmuls)} matmuls, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
