#!/usr/bin/env python3
"""Sessions held at 2,048 tokens of context per GiB of KV (issue 18, part 6c):
build/server/decoded --kv_budget_mb B --context_length C is started and
bench/kv_capacity_bench opens sessions that each fill C tokens of context
(prompt + 8 generated tokens) and stay open, until the daemon refuses one
with RESOURCE_EXHAUSTED (a contiguous cache per session, --kv_block_tokens=0)
or, with paged KV, until a session's turn made the daemon take blocks back
from an idle one (decoded_kv_preemptions_total, scraped from the daemon's
metrics). Prints sessions held and sessions per GiB, with the
KV bytes one such session needs from the model's geometry (for comparison:
n_layers x C x (K + V floats per token) x bytes per element).

Usage: python3 bench/run_kv_capacity_bench.py [--model PATH] [--build build]
       [--kv-budget-mb 1024] [--context 2048] [--threads 2] [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name, free_port, running_daemon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--kv-budget-mb", type=int, default=1024)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--daemon-flag", action="append", default=[],
                    help="an extra flag for the daemon, e.g. --daemon-flag=--kv_type=f16 (repeatable)")
    ap.add_argument("--json", help="also write the report (JSON) to this file")
    args = ap.parse_args()
    metrics = f"127.0.0.1:{free_port()}"
    flags = [f"--threads={args.threads}", "--workers=1", f"--kv_budget_mb={args.kv_budget_mb}",
             f"--context_length={args.context}", "--max_sessions=4096", f"--metrics_listen={metrics}"] + args.daemon_flag
    with running_daemon(args.build, args.model, flags) as (addr, log_tail):
        out = subprocess.run([os.path.join(args.build, "bench", "kv_capacity_bench"), f"--server={addr}",
                              f"--context_tokens={args.context}", f"--metrics={metrics}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"kv_capacity_bench failed: {out.stderr[-2000:]}\n{log_tail()}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update({"model": args.model, "cpu": cpu_model_name(), "kv_budget_mb": args.kv_budget_mb,
              "daemon_flags": args.daemon_flag})
    r["sessions_per_gib"] = round(r["sessions_held"] / (args.kv_budget_mb / 1024), 2)
    print(f"host CPU: {r['cpu']}; {os.path.basename(args.model)}; --kv_budget_mb {args.kv_budget_mb}, "
          f"{args.context}-token sessions: {r['sessions_held']} held ({r['sessions_per_gib']} per GiB) in "
          f"{r['seconds']} s; the next refused: {r['refusal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
