#!/usr/bin/env python3
"""Records llama.cpp's greedy decode of the real SmolLM2-135M-Instruct (arch llama) and Qwen2.5-Coder-0.5B-Instruct
(arch qwen2) GGUFs, as an independent reference for the llama-style families.

Settings as tools/gen_llamacpp_reference.py (Gemma 3): llama-cpp-python, n_threads=2, n_ctx=512, logits_all=True,
F32 KV cache, flash attention off. For each prompt: tokenize with add_bos=True, special=True (SmolLM2 adds BOS,
Qwen2.5's vocabulary says not to; llama.cpp follows tokenizer.ggml.add_bos_token), prefill, then greedy-decode
N tokens one at a time on the raw logits (np.argmax), never stopping early. Records prompt ids, generated ids,
the top-1/top-2 gap and argmax logit of every step and the top-20 (id, logit) pairs of the first 4 steps.
Also the perplexity of tests/data/perplexity_text.txt (tokenized with BOS, evaluated in one pass with logits for
every position): exp of the mean of -log softmax(logits[i])[ids[i + 1]] over every token after the first.

Writes tests/data/<model>_llamacpp.json. Model paths: DECODED_SMOLLM2_PATH / DECODED_QWEN2_PATH, else
~/.cache/decoded/<file>.
Interpreter: `python3` (pyenv CPython 3.11) with llama-cpp-python from tools/install_llama_cpp.sh.
Usage: python3 tools/gen_llamacpp_family_reference.py [--only smollm2,qwen2] [--n-gen 16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

try:
    import numpy as np
    import llama_cpp
except ImportError as exc:
    sys.exit(f"gen_llamacpp_family_reference: missing dependency ({exc}); run tools/install_llama_cpp.sh")

REPO_ROOT = Path(__file__).resolve().parent.parent
TOP_K = 20
TOP_POSITIONS = 4

MODELS = {
    "smollm2": ("DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf"),
    "qwen2": ("DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
}


def chatml(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    {"name": "plain_capital", "text": "The capital of France is"},
    {"name": "chat_math", "text": chatml("What is 12 times 7? Answer with just the number.")},
    {"name": "code_python", "text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
]


def f32(x: float) -> float:
    return float(str(np.float32(x)))


def model_path(name: str) -> Path:
    env, file_name = MODELS[name]
    if os.environ.get(env):
        return Path(os.environ[env])
    return Path.home() / ".cache" / "decoded" / file_name


def run_case(llm, text: str, n_gen: int) -> dict:
    prompt = llm.tokenize(text.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(prompt)
    generated, gaps, argmax_logit, top = [], [], [], []
    for step in range(n_gen):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-row, kind="stable")
        tok = int(np.argmax(row))
        generated.append(tok)
        gaps.append(f32(row[order[0]] - row[order[1]]))
        argmax_logit.append(f32(row[tok]))
        if step < TOP_POSITIONS:
            top.append({"step": step, "top": [[int(i), f32(row[i])] for i in order[:TOP_K]]})
        llm.eval([tok])
    return {"prompt_ids": [int(t) for t in prompt], "generated_ids": generated, "top1_top2_gap": gaps,
            "argmax_logit": argmax_logit, "top_logits": top,
            "generated_text": llm.detokenize(generated).decode("utf-8", errors="replace")}


def perplexity(llm, text: str) -> dict:
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
    m = logits.max(axis=1, keepdims=True)
    logz = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))
    nll = logz[:-1] - logits[np.arange(len(ids) - 1), ids[1:]]
    return {"text_file": "perplexity_text.txt", "ids": [int(t) for t in ids], "mean_nll": float(nll.mean()),
            "perplexity": float(np.exp(nll.mean()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "data")
    args = ap.parse_args()
    wanted = {s for s in args.only.split(",") if s} or set(MODELS)
    for name in MODELS:
        if name not in wanted:
            continue
        path = model_path(name)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                              seed=1234, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                              flash_attn=False)
        cases = []
        for p in PROMPTS:
            c = run_case(llm, p["text"], args.n_gen)
            c = {"name": p["name"], "prompt": p["text"], **c}
            print(f"[{name}] {p['name']}: {c['generated_text']!r} min gap {min(c['top1_top2_gap']):.3f}")
            cases.append(c)
        ppl = perplexity(llm, (REPO_ROOT / "tests" / "data" / "perplexity_text.txt").read_text())
        print(f"[{name}] perplexity {ppl['perplexity']:.4f} over {len(ppl['ids'])} tokens")
        doc = {"description": f"llama.cpp greedy decode of {path.name} (raw-logit argmax, teacher-forcing reference)",
               "generator": "tools/gen_llamacpp_family_reference.py",
               "versions": {"llama_cpp_python": llama_cpp.__version__, "numpy": np.__version__},
               "model": {"file": path.name, "bytes": path.stat().st_size},
               "settings": {"n_threads": 2, "n_ctx": 512, "kv_type": "f32", "flash_attn": False},
               "cases": cases, "perplexity": ppl}
        out = args.out_dir / f"{name}_llamacpp.json"
        out.write_text(json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n")
        print(f"[{name}] wrote {out} ({out.stat().st_size} B)")
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
