#!/usr/bin/env python3
"""Does llama.cpp reproduce its own greedy continuations when only its summation
order changes? Re-runs the prompts of tests/data/gemma3_270m_llamacpp.json with
the generator's own settings (tools/gen_llamacpp_reference.py: 2 threads, F32 KV
cache, weight repacking on), changing one thing at a time: repacking off,
1 thread, or the prompt evaluated a token at a time; counts identical 32-token
continuations.

Measured: see docs/reference-data.md ("llama.cpp agreement"). An earlier
version of this script passed `use_extra_bufts=False`, which llama_cpp.Llama
silently ignores, and left the KV cache at its F16 default, so its variants
differed from the reference in the KV cache type, not in the summation order.

llama-cpp-python comes from tools/install_llama_cpp.sh.
Usage: python3 tools/llamacpp_self_consistency.py [MODEL]
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_llamacpp_reference as gen  # noqa: E402  (exits 77 when llama_cpp is missing)


def main():
    model = Path(sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ref = json.loads((gen.REPO_ROOT / "tests" / "data" / "gemma3_270m_llamacpp.json").read_text(encoding="utf-8"))
    for label, kw, one_by_one in [("as recorded", {}, False), ("repack off", {"repack": False}, False),
                                  ("1 thread", {"n_threads": 1}, False), ("prompt token by token", {}, True)]:
        llm = gen.open_model(model, **kw)
        same, diverged = 0, []
        for case in ref["cases"]:
            out, _ = gen.decode(llm, case["prompt_ids"], len(case["generated_ids"]), prompt_one_by_one=one_by_one)
            if out == case["generated_ids"]:
                same += 1
            else:
                step = next(i for i, (a, b) in enumerate(zip(out, case["generated_ids"])) if a != b)
                diverged.append(f"{case['name']}@{step} (gap {case['top1_top2_gap'][step]:.3f})")
        print(f"{label}: {same} of {len(ref['cases'])} continuations identical; diverged: {', '.join(diverged)}")
        del llm


if __name__ == "__main__":
    main()
