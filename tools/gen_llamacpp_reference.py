#!/usr/bin/env python3
"""Records llama.cpp's greedy decode of the real Gemma 3 270M Q4_K_M model as an independent reference.

Runs llama.cpp through llama-cpp-python on the GGUF that scripts/fetch_model.sh provides, with
  n_threads=2, n_ctx=512, logits_all=True, one sequence, fixed seed, F32 KV cache, flash attention off,
and for each prompt
  - tokenizes with add_bos=True, special=True (so "<start_of_turn>" etc. become control tokens),
  - prefills the prompt, then greedy-decodes N tokens one at a time: next id = argmax of the *raw* logits row
    (no temperature, no penalties, no sampler chain at all; np.argmax takes the lowest id on an exact tie),
    never stopping early (EOS / <end_of_turn> are recorded and fed back like any other token),
  - records the prompt ids, the generated ids, the top-40 (id, logit) pairs of the raw logits for the first 4
    generated positions, and the detokenized text.
It also records tokenizer cases (text -> ids, with and without special-token parsing) and runs every prompt twice
to check that the decode is reproducible.

Writes tests/data/gemma3_270m_llamacpp.json (see docs/reference-data.md for the layout).

--check instead re-runs a few recorded prompts (default: plain_capital, chat_math) teacher-forced with the recorded
tokens and compares with the committed JSON (ctest gemma3_llamacpp_reference_check): prompt ids exactly, the argmax
wherever the recorded top-1/top-2 gap exceeds CHECK_GAP, and every recorded logit (top-40 of steps 0..3, the argmax
logit of every step) within CHECK_LOGIT_TOL. The same comparison of the prompt without its BOS token must exceed the
tolerance, so the check can fail. Exit 0 pass, 1 fail, 77 skip (llama-cpp-python missing, or the model missing while
DECODED_REQUIRE_MODEL is not 1). `--variant` reruns with a different summation order (weight repacking off, 1
thread, or the prompt evaluated a token at a time), which is how the tolerance was measured (docs/reference-data.md).

Interpreter: `python3` (pyenv CPython 3.11) with tools/requirements-reference.txt installed, and llama-cpp-python
installed by tools/install_llama_cpp.sh (never a plain `pip install llama-cpp-python`: its native build dies with
SIGILL on hosts other than the one it was built on).
Usage: python3 tools/gen_llamacpp_reference.py [--model PATH] [--out PATH] [--n-gen 32]
       python3 tools/gen_llamacpp_reference.py --check [--cases a,b] [--variant V] [--model PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

SKIP = 77  # ctest SKIP_RETURN_CODE
try:
    import numpy as np
    import llama_cpp
except ImportError as exc:
    print(f"gen_llamacpp_reference: SKIP: missing dependency ({exc}); install llama-cpp-python with "
          "tools/install_llama_cpp.sh (numpy comes with it)", file=sys.stderr)
    sys.exit(SKIP)

REPO_ROOT = Path(__file__).resolve().parent.parent

N_CTX = 512
N_THREADS = 2
SEED = 1234
TOP_K_RECORDED = 40
TOP_POSITIONS = 4

# --check tolerances, measured with --variant over all 7 cases (docs/reference-data.md): the same build reproduces
# the recorded logits exactly (also with 1 thread); repacking off or the prompt fed a token at a time moves a
# recorded logit by up to 1.36 and flips no argmax whose recorded top-1/top-2 gap exceeds CHECK_GAP. Dropping the
# BOS token moves them by 9.8 to 47.6 and flips 1 to 18 such argmaxes per case.
CHECK_CASES = ("plain_capital", "chat_math")
CHECK_GAP = 0.5
CHECK_LOGIT_TOL = 2.5


def chat(user: str) -> str:
    """Gemma's chat format for one user turn, ending where the model's reply starts (no BOS: add_bos adds it)."""
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


PROMPTS = [
    {"name": "plain_capital", "text": "The capital of France is"},
    {"name": "plain_story", "text": "Once upon a time, in a small village at the edge of the forest,"},
    {"name": "chat_haiku", "text": chat("Write a haiku about the sea.")},
    {"name": "chat_math", "text": chat("What is 12 times 7? Answer with just the number.")},
    {"name": "code_python", "text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
    {"name": "unicode_mixed", "text": "Café naïve — 東京タワー 🙂 and numbers 1234567 + 89 ="},
    {"name": "list_format", "text": "Three primary colors:\n1."},
]

# Strings for tokenizer tests: spaces, tabs, newlines, bytes fallback, digits, specials written inline.
TOKENIZER_CASES = [
    "Hello world",
    " Hello  world ",
    "   leading and trailing   ",
    "tab\tseparated\tvalues",
    "line one\nline two\n\nline four",
    "naïve café — 東京 🙂",
    "1234567890 3.14159 -42",
    "<start_of_turn>user\nhi<end_of_turn>\n",
    "<bos>already has bos",
    "don't stop-me now!!!",
    "\u00a0non-breaking\u2009thin space",
    "🙂🙂🙂",
]


def model_path_from_fetch_script() -> Path:
    out = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "fetch_model.sh")], check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def f32(x: float) -> float:
    """Shortest decimal that parses back to the same float32."""
    return float(str(np.float32(x)))


def open_model(path: Path, repack: bool = True, **overrides) -> "llama_cpp.Llama":
    """The generator's settings; `repack`=False turns llama.cpp's weight repacking off (use_extra_bufts), which
    llama_cpp.Llama does not expose (it silently ignores a use_extra_bufts keyword), so the default model
    parameters are patched while it loads."""
    threads = overrides.pop("n_threads", N_THREADS)
    if not repack:
        lib = llama_cpp.llama_cpp
        default_params = lib.llama_model_default_params

        def without_repack():
            params = default_params()
            params.use_extra_bufts = False
            return params

        lib.llama_model_default_params = without_repack
        try:
            return open_model(path, **overrides, n_threads=threads)
        finally:
            lib.llama_model_default_params = default_params
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        seed=SEED,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
        **overrides,
    )


def decode(llm: "llama_cpp.Llama", prompt_ids: list[int], n_steps: int, forced: list[int] | None = None,
           prompt_one_by_one: bool = False) -> tuple[list[int], list[np.ndarray]]:
    """Prefill, then n_steps one-token decodes on a fresh context; returns the ids fed and the raw logits row of each
    step. Each fed id is the row's argmax (greedy), or forced[step] when `forced` is given (teacher forcing).
    `prompt_one_by_one` evaluates the prompt a token at a time (matrix-vector instead of matrix-matrix kernels)."""
    llm.reset()  # n_tokens = 0; eval() then drops every cached position >= n_tokens before decoding
    for chunk in ([[t] for t in prompt_ids] if prompt_one_by_one else [prompt_ids]):
        llm.eval(chunk)
    fed: list[int] = []
    rows: list[np.ndarray] = []
    for step in range(n_steps):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
        tok = int(np.argmax(row)) if forced is None else forced[step]
        rows.append(row)
        fed.append(tok)
        llm.eval([tok])
    return fed, rows


def greedy(llm: "llama_cpp.Llama", prompt_ids: list[int], n_gen: int) -> tuple[list[int], list[np.ndarray]]:
    """Prefill + greedy decode on a fresh context; returns generated ids and the raw logits row of each step."""
    return decode(llm, prompt_ids, n_gen)


def teacher_forced(llm: "llama_cpp.Llama", prompt_ids: list[int], forced: list[int],
                   prompt_one_by_one: bool = False) -> list[np.ndarray]:
    """Like greedy(), but feeds `forced` instead of its own argmaxes; returns one raw logits row per forced token."""
    return decode(llm, prompt_ids, len(forced), forced, prompt_one_by_one)[1]


def compare(case: dict, rows: list[np.ndarray]) -> tuple[float, list[int]]:
    """Max |logit - recorded| over the recorded logits, and the steps whose argmax differs where the gap is clear."""
    diffs = [abs(float(rows[s][case["generated_ids"][s]]) - v) for s, v in enumerate(case["argmax_logit"])]
    for entry in case["top_logits"]:
        diffs += [abs(float(rows[entry["step"]][i]) - v) for i, v in entry["top"]]
    flips = [s for s, (row, tok, gap) in enumerate(zip(rows, case["generated_ids"], case["top1_top2_gap"]))
             if gap > CHECK_GAP and int(np.argmax(row)) != tok]
    return max(diffs), flips


def check(args: argparse.Namespace) -> int:
    """Re-runs recorded prompts and compares with the committed reference (see the module docstring)."""
    model_path = args.model or Path(os.environ.get("DECODED_MODEL_PATH") or
                                    Path.home() / ".cache" / "decoded" / "gemma-3-270m-q4_k_m.gguf")
    if not model_path.is_file():
        if os.environ.get("DECODED_REQUIRE_MODEL") == "1":
            print(f"FAIL: model missing at {model_path}", file=sys.stderr)
            return 1
        print(f"SKIP: model missing at {model_path}", file=sys.stderr)
        return SKIP
    ref = json.loads(args.out.read_text(encoding="utf-8"))
    variant = {"none": {}, "repack-off": {"repack": False}, "1-thread": {"n_threads": 1}}.get(args.variant, {})
    one_by_one = args.variant == "prompt-1by1"
    llm = open_model(model_path, **variant)
    print(f"llama-cpp-python {llama_cpp.__version__}: {llama_cpp.llama_print_system_info().decode().strip()}")
    failed = False
    cases = {c["name"]: c for c in ref["cases"]}
    for name in args.cases.split(","):
        case = cases[name]
        ids = [int(t) for t in llm.tokenize(case["prompt"].encode("utf-8"), add_bos=True, special=True)]
        if ids != case["prompt_ids"]:
            print(f"[{name}] FAIL: prompt ids {ids} != recorded {case['prompt_ids']}")
            failed = True
            continue
        worst, flips = compare(case, teacher_forced(llm, ids, case["generated_ids"], one_by_one))
        ok = worst <= CHECK_LOGIT_TOL and not flips
        print(f"[{name}] {'ok' if ok else 'FAIL'}: max |logit - recorded| {worst:.4f} (tolerance {CHECK_LOGIT_TOL}), "
              f"argmax differs at clear steps {flips}")
        # A broken input (no BOS) must fail the same comparison, or the check could not catch anything.
        broken_worst, broken_flips = compare(case, teacher_forced(llm, ids[1:], case["generated_ids"]))
        caught = broken_worst > CHECK_LOGIT_TOL or bool(broken_flips)
        print(f"[{name}] without BOS: max diff {broken_worst:.4f}, argmax differs at {len(broken_flips)} clear steps "
              f"({'caught' if caught else 'NOT caught'})")
        failed |= not ok or not caught
    return 1 if failed else 0


def top_k(row: np.ndarray, k: int) -> list[list]:
    # Stable sort on (-logit, id) so equal logits list the lower id first.
    order = np.lexsort((np.arange(row.size), -row))[:k]
    return [[int(i), f32(row[i])] for i in order]


def piece(llm: "llama_cpp.Llama", tok: int) -> str:
    return llm.detokenize([tok], special=True).decode("utf-8", errors="backslashreplace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF path (default: output of scripts/fetch_model.sh)")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "data" / "gemma3_270m_llamacpp.json",
                    help="the JSON written; with --check, the JSON compared against")
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--check", action="store_true",
                    help="compare a fresh run with --out instead of writing it (model: DECODED_MODEL_PATH or the cache)")
    ap.add_argument("--cases", default=",".join(CHECK_CASES), help="--check: comma-separated case names")
    ap.add_argument("--variant", choices=["none", "repack-off", "1-thread", "prompt-1by1"], default="none",
                    help="--check: change llama.cpp's summation order (to measure the tolerance)")
    args = ap.parse_args()
    if args.check:
        return check(args)

    model_path = args.model or model_path_from_fetch_script()
    llm = open_model(model_path)
    eos = int(llm.token_eos())
    bos = int(llm.token_bos())

    cases = []
    for spec in PROMPTS:
        prompt_ids = [int(t) for t in llm.tokenize(spec["text"].encode("utf-8"), add_bos=True, special=True)]
        if len(prompt_ids) + args.n_gen > N_CTX:
            raise SystemExit(f"prompt {spec['name']} too long for n_ctx {N_CTX}")
        generated, rows = greedy(llm, prompt_ids, args.n_gen)
        again, rows2 = greedy(llm, prompt_ids, args.n_gen)
        if again != generated:
            raise SystemExit(f"prompt {spec['name']}: llama.cpp decode is not reproducible: {generated} vs {again}")
        rerun_diff = max(float(np.abs(a - b).max()) for a, b in zip(rows, rows2))
        top2_gaps = [float(np.sort(r)[-1] - np.sort(r)[-2]) for r in rows]
        text = llm.detokenize(generated, special=True).decode("utf-8", errors="backslashreplace")
        cases.append({
            "name": spec["name"],
            "prompt": spec["text"],
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "generated_pieces": [piece(llm, t) for t in generated],
            "generated_text": text,
            "top_logits": [{"step": s, "top": top_k(rows[s], TOP_K_RECORDED)} for s in range(TOP_POSITIONS)],
            "argmax_logit": [f32(r.max()) for r in rows],
            # Per step: a small gap marks where a correct engine with different (but valid) rounding may pick
            # another token; compare ids only up to the first step whose gap is below the test's tolerance.
            "top1_top2_gap": [f32(g) for g in top2_gaps],
            "rerun_max_abs_diff": rerun_diff,
            "eos_positions": [i for i, t in enumerate(generated) if t == eos],
        })
        print(f"[{spec['name']}] {len(prompt_ids)} prompt tokens -> {generated[:12]}... {text[:60]!r} "
              f"(min gap {min(top2_gaps):.4f}, rerun diff {rerun_diff:.1e})")

    tokenizer_cases = []
    for text in TOKENIZER_CASES:
        b = text.encode("utf-8")
        tokenizer_cases.append({
            "text": text,
            "ids_add_bos_special": [int(t) for t in llm.tokenize(b, add_bos=True, special=True)],
            "ids_no_bos_special": [int(t) for t in llm.tokenize(b, add_bos=False, special=True)],
            "ids_no_bos_plain": [int(t) for t in llm.tokenize(b, add_bos=False, special=False)],
        })

    md = llm.metadata
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    ggml_libs = sorted(p.name for p in lib_dir.glob("libggml-base.so.*")) if lib_dir.is_dir() else []
    doc = {
        "description": ("llama.cpp (via llama-cpp-python) greedy decode of Gemma 3 270M Q4_K_M: argmax over raw "
                        "logits, no sampler, no penalties, no early stop"),
        "generator": "tools/gen_llamacpp_reference.py",
        "versions": {
            "python": sys.version.split()[0],
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp": llama_cpp.llama_version().decode() if hasattr(llama_cpp, "llama_version") else None,
            "ggml_lib": ggml_libs[-1] if ggml_libs else None,
            "numpy": np.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        },
        "model": {
            "file": model_path.name,
            "size": model_path.stat().st_size,
            "sha256": sha256_file(model_path),
            "n_vocab": int(llm.n_vocab()),
            "bos_id": bos,
            "eos_id": eos,
            "metadata": {k: v for k, v in md.items() if not k.startswith("tokenizer.chat_template")},
        },
        "settings": {
            "n_ctx": N_CTX, "n_batch": N_CTX, "n_threads": N_THREADS, "seed": SEED, "logits_all": True,
            "kv_cache_type": "f32", "flash_attn": False, "n_gen": args.n_gen,
            "tokenize": "add_bos=True, special=True", "selection": "np.argmax over the raw logits row",
            "top_logits": f"top {TOP_K_RECORDED} (id, logit) of the raw logits row for generated steps "
                          f"0..{TOP_POSITIONS - 1}; step s is the row that produced generated_ids[s] "
                          f"(step 0 = last prompt position)",
        },
        "cases": cases,
        "tokenizer_cases": tokenizer_cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
