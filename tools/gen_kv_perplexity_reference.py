#!/usr/bin/env python3
"""Records llama.cpp's perplexity with an f32, f16 and q8_0 KV cache on the three real models, as the independent
reference for decoded's --kv_type (tests/models/kv_type_perplexity_test.cc, bench/run_kv_perplexity.py).

Text: the GNU GPL version 3 (/usr/share/common-licenses/GPL-3, Debian's base-files: on every machine this project
runs on, and plain English prose). Each model's tokenizer (llama.cpp's, add_bos=False, special=False) turns it into
ids; the first WINDOWS * N_CTX ids are scored as llama.cpp's llama-perplexity does (tools/perplexity/perplexity.cpp):
windows of N_CTX tokens, each on a cleared context with its first token replaced by BOS when the model adds one,
the second half scored: for i in [N_CTX/2, N_CTX-1), -log softmax(logits[i])[token[i+1]], in float64 here.
llama.cpp runs through llama-cpp-python with n_ctx = n_batch = n_ubatch = N_CTX, 2 threads, logits_all, type_k =
type_v = GGML_TYPE_F32 / F16 / Q8_0, and flash attention (FLASH_ATTN below) off for f32 and on for f16 and q8_0:
llama.cpp needs it for a quantized V cache, and its flash-attention graph casts an f32 cache to f16 before attending
(llama-graph.cpp build_attn_mha), so f32 with it on is f16; off is the only f32 path it has. (Its flash attention
also converts Q to the K cache's dot-product type, f16 or q8_0; decoded keeps Q in f32 and decodes K.)

Writes tests/data/kv_perplexity_llamacpp.json: per model the file's sha256, the token ids, and per type the
perplexity over all windows and per window (the test may score the first windows only: each window scores the same
count, so the perplexity of the first k is exp(mean(log(window_ppl[:k])))).

Interpreter: `python3` with tools/requirements-reference.txt and llama-cpp-python from tools/install_llama_cpp.sh.
Usage: python3 tools/gen_kv_perplexity_reference.py [--out PATH] [--windows 4] [--n-ctx 512]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
TEXT = Path("/usr/share/common-licenses/GPL-3")
MODELS = {  # name -> scripts/fetch_model.sh argument
    "gemma3": "",
    "smollm2": "smollm2",
    "qwen2": "qwen2",
}
TYPES = ("f32", "f16", "q8_0")
FLASH_ATTN = {"f32": False, "f16": True, "q8_0": True}


def fetch(arg: str) -> Path:
    cmd = ["bash", str(REPO_ROOT / "scripts" / "fetch_model.sh")] + ([arg] if arg else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ggml_type(llama_cpp, name: str) -> int:
    return {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}[name]


def open_model(llama_cpp, path: Path, kv: str, n_ctx: int, threads: int):
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, seed=1234, type_k=ggml_type(llama_cpp, kv),
                           type_v=ggml_type(llama_cpp, kv), flash_attn=FLASH_ATTN[kv], verbose=False)


def tokenize(llama_cpp, path: Path, n_ctx: int, windows: int) -> tuple[list[int], int]:
    """The text's ids (first windows * n_ctx) and the BOS id the model adds (-1: none)."""
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ids = llm.tokenize(TEXT.read_bytes(), add_bos=False, special=False)
    need = windows * n_ctx
    if len(ids) < need:
        sys.exit(f"{TEXT} gives {len(ids)} tokens, fewer than {need}")
    add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))
    bos = llm.token_bos() if add_bos else -1
    return ids[:need], bos


def window_nll(llm, window: list[int], n_ctx: int) -> float:
    llm.reset()
    llm.eval(window)
    logits = np.asarray(llm.scores[:n_ctx], dtype=np.float64)
    first = n_ctx // 2
    nll = 0.0
    for i in range(first, n_ctx - 1):
        row = logits[i]
        mx = row.max()
        nll -= row[window[i + 1]] - mx - math.log(np.exp(row - mx).sum())
    return nll


def perplexity(llm, ids: list[int], bos: int, n_ctx: int) -> tuple[float, list[float]]:
    scored = n_ctx - 1 - n_ctx // 2
    per = []
    for w in range(len(ids) // n_ctx):
        window = list(ids[w * n_ctx:(w + 1) * n_ctx])
        if bos >= 0:
            window[0] = bos
        per.append(window_nll(llm, window, n_ctx))
    total = sum(per) / (scored * len(per))
    return math.exp(total), [math.exp(x / scored) for x in per]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "data" / "kv_perplexity_llamacpp.json")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    import llama_cpp  # after argparse: --help works without it

    doc = {"generator": "tools/gen_kv_perplexity_reference.py", "llama_cpp_python": llama_cpp.__version__,
           "text": str(TEXT), "n_ctx": args.n_ctx, "windows": args.windows, "flash_attn": FLASH_ATTN, "models": {}}
    for name in args.models.split(","):
        path = fetch(MODELS[name])
        ids, bos = tokenize(llama_cpp, path, args.n_ctx, args.windows)
        entry = {"file": path.name, "sha256": sha256_file(path), "bos": bos, "tokens": ids, "ppl": {},
                 "window_ppl": {}}
        for kv in TYPES:
            llm = open_model(llama_cpp, path, kv, args.n_ctx, args.threads)
            ppl, per = perplexity(llm, ids, bos, args.n_ctx)
            del llm
            entry["ppl"][kv] = ppl
            entry["window_ppl"][kv] = per
            print(f"{name} {kv}: ppl {ppl:.4f} (windows {', '.join(f'{p:.3f}' for p in per)})", file=sys.stderr)
        doc["models"][name] = entry
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
