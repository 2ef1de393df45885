#!/usr/bin/env python3
"""How far llama.cpp moves from its own recorded reference when only its attention's rounding changes: the noise
floor the llama.cpp agreement tests (tests/models/llama_llamacpp_test.cc) must allow a rounding-level change in
decoded's kernels.

Re-runs the prompts of tests/data/{smollm2,qwen2}_llamacpp.json (recorded with an f32 KV cache, no flash attention,
2 threads: tools/gen_llamacpp_family_reference.py) teacher-forced over the recorded tokens, with llama.cpp's f16 and
bf16 KV caches under flash attention (which round Q, K and V to those types for the products), and with 1 thread
(summation order only), and scores each run by the tests' rule: argmaxes equal, violations (a different argmax where
the recorded top-1/top-2 gap or the run's own margin exceeds 0.5, the tests' kNoise), and mean / max |d| over the
recorded top-20 logits of the first 4 steps of each prompt.

Measured: docs/benchmarks.md, "2026-12-08 (sixth session)". llama-cpp-python comes from tools/install_llama_cpp.sh.
Usage: python3 tools/llamacpp_rounding_noise.py [--models smollm2,qwen2]
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llamacpp_reference as gen  # noqa: E402  (exits 77 when llama_cpp is missing)
import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

NOISE = 0.5  # the tests' kNoise
GGML_TYPE_BF16 = 30  # ggml.h; llama-cpp-python 0.3.36 names F32 and F16 only
FILES = {"smollm2": "smollm2-135m-instruct-q4_1.gguf", "qwen2": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
VARIANTS = {
    "f32 KV, 1 thread": dict(n_threads=1),
    "f16 KV, flash attention": dict(type_k=llama_cpp.GGML_TYPE_F16, type_v=llama_cpp.GGML_TYPE_F16, flash_attn=True),
    "bf16 KV, flash attention": dict(type_k=GGML_TYPE_BF16, type_v=GGML_TYPE_BF16, flash_attn=True),
}


def run(path: Path, ref: dict, n_threads: int = 2, type_k: int = llama_cpp.GGML_TYPE_F32,
        type_v: int = llama_cpp.GGML_TYPE_F32, flash_attn: bool = False) -> str:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=n_threads,
                          n_threads_batch=n_threads, logits_all=True, seed=gen.SEED, type_k=type_k, type_v=type_v,
                          flash_attn=flash_attn, verbose=False)
    equal = steps = 0
    violations, diffs = [], []
    for case in ref["cases"]:
        rows = gen.teacher_forced(llm, case["prompt_ids"], case["generated_ids"])
        for step, (row, tok, gap) in enumerate(zip(rows, case["generated_ids"], case["top1_top2_gap"])):
            steps += 1
            best = int(np.argmax(row))
            if best == tok:
                equal += 1
            elif gap > NOISE or float(row[best] - row[tok]) > NOISE:
                violations.append(f"{case['name']}@{step} (gap {gap:.3f})")
        for entry in case["top_logits"][:4]:
            diffs += [abs(float(rows[entry["step"]][i]) - v) for i, v in entry["top"][:20]]
    return (f"argmax equal {equal}/{steps}, violations {len(violations)} {violations}, "
            f"top-20 mean |d| {np.mean(diffs):.3f}, max {np.max(diffs):.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,qwen2")
    args = ap.parse_args()
    print(f"llama-cpp-python {llama_cpp.__version__}")
    for name in args.models.split(","):
        ref = json.loads((gen.REPO_ROOT / "tests" / "data" / f"{name}_llamacpp.json").read_text(encoding="utf-8"))
        path = Path.home() / ".cache" / "decoded" / FILES[name]
        for label, kw in VARIANTS.items():
            print(f"{name} | {label}: {run(path, ref, **kw)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
