#!/usr/bin/env python3
"""Dumps facts about a GGUF file, read with the upstream Python `gguf` package.

The C++ GGUF reader's test (tests/gguf/gguf_file_test.cc) compares its own
parse of the real model against this JSON, so the expected values come from an
independent implementation (llama.cpp's gguf-py), never from our reader.

Usage:
  python3 tools/gen_gguf_reference.py \
      [--model ~/.cache/decoded/gemma-3-270m-q4_k_m.gguf] \
      [--out tests/data/gemma3_270m_gguf_reference.json]

Output (JSON object):
  file_size, version, tensor_count, kv_count (as the header declares them),
  alignment, data_offset (absolute byte offset of the tensor-data section),
  kv:      {key: {"type": <gguf value type name>, "value": <scalar>}} for
           scalars; arrays as {"type": "array", "elem_type": ..., "length": N,
           "head": [first 8], "tail": [last 4], "samples": {"<index>": value}}
  tensors: [{name, type_id, type_name, ne (GGML order, ne[0] contiguous),
             offset (relative to the data section), nbytes, head_hex (first
             16 data bytes)}] for every tensor, in file order.
"""

import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType

# Type names as GGUF spells them (and as the C++ test maps GgufType).
_TYPE_NAMES = {
    GGUFValueType.UINT8: "uint8", GGUFValueType.INT8: "int8",
    GGUFValueType.UINT16: "uint16", GGUFValueType.INT16: "int16",
    GGUFValueType.UINT32: "uint32", GGUFValueType.INT32: "int32",
    GGUFValueType.FLOAT32: "float32", GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "string", GGUFValueType.ARRAY: "array",
    GGUFValueType.UINT64: "uint64", GGUFValueType.INT64: "int64",
    GGUFValueType.FLOAT64: "float64",
}

# Fixed indices sampled from long arrays (the tokenizer vocab is 262144).
_SAMPLE_INDICES = [0, 1, 2, 3, 100, 1000, 4242, 65535, 100000, 262143]


def _py(v):
    """numpy scalar -> plain JSON-able Python value (float32 widens exactly)."""
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    return v


def _field_entry(field):
    main = field.types[0]
    if main != GGUFValueType.ARRAY:
        value = field.contents()
        if main == GGUFValueType.BOOL:
            value = bool(value)
        return {"type": _TYPE_NAMES[main], "value": _py(value)}
    if len(field.types) > 2:
        raise SystemExit(f"{field.name}: nested arrays are not dumped by this tool")
    elem = field.types[-1] if len(field.types) > 1 else GGUFValueType.UINT8
    values = [_py(v) for v in field.contents()]
    n = len(values)
    return {
        "type": "array",
        "elem_type": _TYPE_NAMES[elem],
        "length": n,
        "head": values[:8],
        "tail": values[-4:] if n >= 4 else values,
        "samples": {str(i): values[i] for i in _SAMPLE_INDICES if i < n},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
        "gemma3_270m_gguf_reference.json"))
    args = ap.parse_args()

    reader = GGUFReader(args.model, "r")
    header = {f.name: f.contents() for f in reader.fields.values()
              if f.name.startswith("GGUF.")}
    kv = {name: _field_entry(f) for name, f in reader.fields.items()
          if not name.startswith("GGUF.")}
    if len(kv) != header["GGUF.kv_count"]:
        raise SystemExit(f"kv count mismatch: {len(kv)} vs header {header['GGUF.kv_count']}")

    tensors = []
    for t in reader.tensors:
        ne = [int(d) for d in t.shape]  # gguf-py keeps GGML order here
        raw = reader.data[t.data_offset:t.data_offset + 16].tobytes()
        tensors.append({
            "name": t.name,
            "type_id": int(t.tensor_type),
            "type_name": t.tensor_type.name,
            "ne": ne,
            "offset": int(t.data_offset - reader.data_offset),
            "nbytes": int(t.n_bytes),
            "head_hex": raw.hex(),
        })

    out = {
        "generator": "tools/gen_gguf_reference.py (Python gguf package GGUFReader)",
        "model_file": os.path.basename(args.model),
        "file_size": os.path.getsize(args.model),
        "version": int(header["GGUF.version"]),
        "tensor_count": int(header["GGUF.tensor_count"]),
        "kv_count": int(header["GGUF.kv_count"]),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "kv": kv,
        "tensors": tensors,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}: {len(kv)} kv, {len(tensors)} tensors", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
