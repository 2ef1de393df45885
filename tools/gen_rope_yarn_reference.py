#!/usr/bin/env python3
"""Writes tests/data/rope_yarn_reference.json: YaRN inverse frequencies and attention factors from Hugging Face.

For each case a config is built and HF's own YaRN init (transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"],
i.e. _compute_yarn_parameters) returns inv_freq (float32) and the cos/sin attention factor; DeepSeek-V2's softmax
scale multiplier comes from transformers.models.deepseek_v2.modeling_deepseek_v2.yarn_apply_mscale. The cases:
published configurations (Qwen2.5's YaRN, DeepSeek-V2's), the repository's tiny YaRN fixtures, partial rotary, and
a ramp whose truncated bounds coincide (HF widens it by 0.001). engine/rope_yarn.cc is tested against these values
(tests/engine/decode_plans_test.cc); nothing here reads decoded's code.

Usage: python3 tools/gen_rope_yarn_reference.py [--out tests/data/rope_yarn_reference.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import numpy as np
    import torch
    import transformers
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import yarn_apply_mscale
except ImportError as exc:
    sys.exit(f"gen_rope_yarn_reference: missing dependency ({exc}); pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent

# name, head_dim, rope_parameters (rope_theta and the yarn keys)
CASES = [
    ("qwen2.5_yarn", 128, {"rope_theta": 1_000_000.0, "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("deepseek_v2", 64, {"rope_theta": 10_000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
    ("qwen2yarn_tiny", 16, {"rope_theta": 10_000.0, "factor": 4.0, "original_max_position_embeddings": 32}),
    ("llamayarn_tiny", 16, {"rope_theta": 1_000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                            "beta_fast": 2.0, "beta_slow": 0.1, "attention_factor": 1.25}),
    ("partial_rotary", 32, {"rope_theta": 10_000.0, "factor": 8.0, "original_max_position_embeddings": 256,
                            "partial_rotary_factor": 0.5}),
    ("equal_bounds", 8, {"rope_theta": 10.0, "factor": 4.0, "original_max_position_embeddings": 14800}),
]


def f32_text(x) -> str:
    """The shortest decimal that reads back as the same float32."""
    return repr(float(np.float32(x)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "data" / "rope_yarn_reference.json")
    args = ap.parse_args()
    cases = []
    for name, head_dim, params in CASES:
        rope_parameters = {"rope_type": "yarn", **params}
        cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                          max_position_embeddings=int(params["factor"] * params["original_max_position_embeddings"]),
                          rope_parameters=dict(rope_parameters))
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
        assert inv_freq.dtype == torch.float32
        rot_dims = int(head_dim * params.get("partial_rotary_factor", 1.0))
        assert inv_freq.numel() == rot_dims // 2
        cases.append({
            "name": name,
            "rot_dims": rot_dims,
            "rope_parameters": rope_parameters,
            "inv_freq": [f32_text(v) for v in inv_freq.tolist()],
            "attention_factor": float(attention_factor),
            "deepseek_v2_softmax_scale_factor": float(yarn_apply_mscale(rope_parameters, 1.0)),
        })
    doc = {
        "description": ("HF transformers YaRN: inv_freq (float32, as decimal strings) and the cos/sin attention factor "
                        "from ROPE_INIT_FUNCTIONS['yarn']; deepseek_v2_softmax_scale_factor = "
                        "yarn_apply_mscale(rope_parameters, 1.0) (1 unless mscale_all_dim is set)"),
        "generator": "tools/gen_rope_yarn_reference.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
