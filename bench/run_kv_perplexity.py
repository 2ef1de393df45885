#!/usr/bin/env python3
"""What --kv_type costs in quality (issue 18, part 4): perplexity of the three real models with f32, f16 and q8_0 KV
caches (bench/kv_perplexity, llama-perplexity's definition: engine/perplexity.h) on the ids llama.cpp's tokenizer
gives for the GNU GPL v3, next to llama.cpp's own perplexity with the same cache types on the same ids, and the KV
bytes per token of each type.

llama.cpp's figures: measured in this run with --llamacpp (llama-cpp-python from tools/install_llama_cpp.sh, the
settings of tools/gen_kv_perplexity_reference.py: f32 without flash attention, f16 and q8_0 with it), else read
from tests/data/kv_perplexity_llamacpp.json (that tool's output; its ids are used either way).

Usage: python3 bench/run_kv_perplexity.py [--build build] [--threads 2] [--llamacpp] [--models gemma3,smollm2,qwen2]
       [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tools"))
from daemon import cpu_model_name  # noqa: E402

REFERENCE = REPO / "tests" / "data" / "kv_perplexity_llamacpp.json"
TYPES = ("f32", "f16", "q8_0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp", action="store_true", help="measure llama.cpp in this run")
    ap.add_argument("--models", default="gemma3,smollm2,qwen2")
    ap.add_argument("--json")
    args = ap.parse_args()
    ref = json.loads(REFERENCE.read_text())
    import gen_kv_perplexity_reference as gen  # noqa: E402
    rows = []
    for name in args.models.split(","):
        entry = ref["models"][name]
        path = gen.fetch(gen.MODELS[name])
        theirs = dict(entry["ppl"])
        if args.llamacpp:
            import llama_cpp
            for kv in TYPES:
                llm = gen.open_model(llama_cpp, path, kv, ref["n_ctx"], args.threads)
                theirs[kv], _ = gen.perplexity(llm, entry["tokens"], entry["bos"], ref["n_ctx"])
                del llm
        for kv in TYPES:
            out = subprocess.run([os.path.join(args.build, "bench", "kv_perplexity"), f"--model={path}",
                                  f"--tokens={REFERENCE}", f"--entry={name}", f"--kv_type={kv}",
                                  f"--n_ctx={ref['n_ctx']}", f"--threads={args.threads}"],
                                 check=True, capture_output=True, text=True)
            ours = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"model": name, "kv_type": kv, "ppl": ours["ppl"], "llamacpp_ppl": theirs[kv],
                         "kv_bytes_per_token": ours["kv_bytes_per_token"], "seconds": ours["seconds"]})
    print(f"host: {cpu_model_name()}; {ref['windows']} windows of {ref['n_ctx']} tokens of {ref['text']}; "
          f"llama.cpp figures {'measured in this run' if args.llamacpp else 'from ' + str(REFERENCE.name)}")
    print("| model | KV type | bytes/token | ppl (ours) | vs f32 | llama.cpp ppl | vs f32 | ours / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next(b for b in rows if b["model"] == r["model"] and b["kv_type"] == "f32")
        print(f"| {r['model']} | {r['kv_type']} | {r['kv_bytes_per_token']:,} | {r['ppl']:.4f} | "
              f"{100 * (r['ppl'] / base['ppl'] - 1):+.2f}% | {r['llamacpp_ppl']:.4f} | "
              f"{100 * (r['llamacpp_ppl'] / base['llamacpp_ppl'] - 1):+.2f}% | {r['ppl'] / r['llamacpp_ppl']:.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"host": cpu_model_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
