#!/usr/bin/env python3
"""Writes tests/data/ggml_type_sizes.json: GGML type id -> (name, elements per
block, bytes per block) as llama.cpp's own gguf-py declares them
(gguf/constants.py GGML_QUANT_SIZES, which mirrors the static_asserts on the
block structs in ggml/src/ggml-common.h).

Use the gguf-py of the llama.cpp source tree tools/install_llama_cpp.sh
unpacks, not the PyPI `gguf` package: gguf 0.19.0 on PyPI still lists Q8_1 as
40 bytes (two f32 scales), while ggml's block_q8_1 has been two f16 scales
(36 bytes) for a long time.

Usage: tools/gen_ggml_type_sizes.py LLAMA_CPP_DIR [OUT]
  LLAMA_CPP_DIR  e.g. ~/.cache/decoded/llama-cpp-python/src-0.3.36/vendor/llama.cpp
"""
import json
import os
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "ggml_type_sizes.json")
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
    with open(os.path.join(src, "ggml", "src", "ggml-common.h")) as f:
        common = f.read()
    # The C header is the ground truth; refuse a gguf-py that disagrees on Q8_1.
    if "sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1" in common:
        assert GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1] == (32, 36), "gguf-py out of date"
    rows = [{"id": t.value, "name": t.name, "block_size": GGML_QUANT_SIZES[t][0],
             "block_bytes": GGML_QUANT_SIZES[t][1]} for t in GGMLQuantizationType]
    with open(out, "w") as f:
        json.dump({"source": "llama.cpp gguf-py/gguf/constants.py GGML_QUANT_SIZES", "types": rows}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
