#!/usr/bin/env python3
"""Batched decode of two (or more) builds of bench/batch_decode_bench on one
host, alternating: each round runs every build once (the order reversed every
other round, so a host that drifts during the run favours nobody) and the
table gives each build's median and best over the rounds of its best-of-3
decode tok/s per batch size, and each build's median over the first build's.

On a shared VM single runs of one binary spread by 10-20%; a difference
smaller than the rounds' spread is not a difference.

Usage: python3 bench/compare_batch_decode.py [--model PATH] [--threads 2]
       [--rounds 4] [--batch-sizes 1,2,4,8,16]
       NAME=PATH[:EXTRA_FLAG:...] NAME=PATH[:EXTRA_FLAG:...] ...
e.g.   python3 bench/compare_batch_decode.py \\
         before=/tmp/old/build/bench/batch_decode_bench \\
         after=build/bench/batch_decode_bench \\
         paged_f16=build/bench/batch_decode_bench:--kv_type=f16:--kv_block_tokens=16
Flags after a path (':'-separated) go to that build's runs only, e.g. a
longer context with --prompt_tokens=128:--decode_steps=384.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("builds", nargs="+", help="NAME=PATH[:EXTRA_FLAG...]")
    args = ap.parse_args()

    builds = {}
    for spec in args.builds:
        name, _, rest = spec.partition("=")
        path, *extra = rest.split(":")
        if not name or not path:
            ap.error(f"expected NAME=PATH, got {spec!r}")
        builds[name] = (path, extra)
    rates = {name: {} for name in builds}
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for name in order:
            path, extra = builds[name]
            out = subprocess.run([path, f"--model={args.model}", f"--threads={args.threads}",
                                  f"--batch_sizes={args.batch_sizes}", "--repeats=3"] + extra,
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{name}: {path} failed: {out.stderr[-2000:]}")
            for row in json.loads(out.stdout.strip().splitlines()[-1])["results"]:
                rates[name].setdefault(row["batch"], []).append(row["decode_tok_s"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    names = list(builds)
    print(f"host CPU: {cpu_model_name()}; {args.threads} threads; {args.rounds} rounds; "
          f"model {os.path.basename(args.model)}")
    for n in rates[names[0]]:
        base = statistics.median(rates[names[0]][n])
        cells = [f"{name} {statistics.median(rates[name][n]):7.1f} (best {max(rates[name][n]):7.1f})" for name in names]
        ratios = " ".join(f"{statistics.median(rates[name][n]) / base:.3f}" for name in names[1:])
        print(f"N={n:3d} | " + " | ".join(cells) + f" | x {names[0]}: {ratios}")


if __name__ == "__main__":
    main()
