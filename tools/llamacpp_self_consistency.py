#!/usr/bin/env python3
"""Does llama.cpp reproduce its own greedy continuations when only its summation
order changes? Re-runs the prompts of tests/data/gemma3_270m_llamacpp.json
(made with 2 threads and weight repacking on) with repacking off, and with 1
thread, and counts identical 32-token continuations.

Measured 2026-11-30 (llama-cpp-python 0.3.36): 4 of 7 in both variants; the
others diverge at steps 6, 18 and 27, where the top-2 gap is < 0.03. This is
why gemma3_llamacpp_test compares argmaxes only beyond the quantization noise.

Usage: python3 tools/llamacpp_self_consistency.py [MODEL]
"""
import json
import os
import sys

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/decoded/gemma-3-270m-q4_k_m.gguf")
    ref = json.load(open(os.path.join(HERE, "..", "tests", "data", "gemma3_270m_llamacpp.json")))
    for label, kw in [("repack off, 2 threads", dict(use_extra_bufts=False, n_threads=2)),
                      ("repack on, 1 thread", dict(n_threads=1))]:
        llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, logits_all=True, verbose=False,
                              seed=1234, **kw)
        same, diverged = 0, []
        for case in ref["cases"]:
            llm.reset()
            llm.eval(list(case["prompt_ids"]))
            out = []
            for _ in range(len(case["generated_ids"])):
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                out.append(tok)
                llm.eval([tok])
            if out == case["generated_ids"]:
                same += 1
            else:
                step = next(i for i, (a, b) in enumerate(zip(out, case["generated_ids"])) if a != b)
                diverged.append(f"{case['name']}@{step}")
        print(f"{label}: {same} of {len(ref['cases'])} continuations identical; diverged: {', '.join(diverged)}")


if __name__ == "__main__":
    main()
