#!/usr/bin/env python3
"""Bursts of arriving clients while others decode (issue 18, part 6a), through
the daemon, in one run: for each thread count T and burst prompt length P,
build/server/decoded --threads T --workers 1 is started with room for the
sessions (--max_sessions) and the bound's prompt (--context_length), and
bench/burst_bench measures (see that file's header for each figure):

  TTFT p50/p99 of the burst's clients, the burst's last first token, the
  bound (one client sending the burst's prefill work as one prompt on the
  quiet daemon, in the same run), last/bound (target <= 1.25; the median of
  each repeat's own ratio, and its range), the decoding
  sessions' inter-token gap p99/max during the burst against their p50 before
  it, aggregate tok/s in the burst window against the decoding sessions' tok/s
  before it. Each (T, P) runs with --background decoding sessions and again
  with none (the burst on a quiet daemon, as the bound).

Usage: python3 bench/run_burst_bench.py [--model PATH] [--build build]
       [--threads 1 2] [--prompt-tokens 16 256] [--burst 16] [--background 8]
       [--repeats 3] [--daemon-flag=--name=value ...] [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name, running_daemon  # noqa: E402


def burst(build, model, threads, n_prompt, n_burst, n_background, repeats, extra_flags):
    context = n_burst * n_prompt + 64
    flags = [f"--threads={threads}", "--workers=1", f"--max_sessions={n_burst + n_background + 8}",
             f"--context_length={context}"] + extra_flags
    with running_daemon(build, model, flags) as (addr, log_tail):
        out = subprocess.run([os.path.join(build, "bench", "burst_bench"), f"--server={addr}",
                              f"--burst={n_burst}", f"--prompt_tokens={n_prompt}",
                              f"--background={n_background}", f"--repeats={repeats}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"burst_bench failed: {out.stderr[-2000:]}\n{log_tail()}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--burst", type=int, default=16)
    ap.add_argument("--background", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--daemon-flag", action="append", default=[],
                    help="an extra flag for the daemon, e.g. --daemon-flag=--max_batch=32 (repeatable)")
    ap.add_argument("--json", help="also write the report (JSON) to this file")
    args = ap.parse_args()

    report = {"model": args.model, "cpu": cpu_model_name(), "daemon_flags": args.daemon_flag, "runs": []}
    print(f"host CPU: {report['cpu']}; model {os.path.basename(args.model)}; burst {args.burst} clients, "
          f"{args.background} decoding; median of {args.repeats} bursts")
    print(f"{'T':>2} {'P':>4} {'bg':>2} | {'TTFT p50':>8} {'p99':>8} {'last':>8} {'bound':>8} {'last/bound':>10} {'range':>11} | "
          f"{'ITL p50 before':>14} {'ITL p99 during':>14} {'max':>8} | {'tok/s before':>12} {'during':>8}")
    runs = [(t, p, bg) for t in args.threads for p in args.prompt_tokens
            for bg in sorted({args.background, 0}, reverse=True)]
    for t, p, bg in runs:
        r = burst(args.build, args.model, t, p, args.burst, bg, args.repeats, args.daemon_flag)
        r["threads"] = t
        report["runs"].append(r)
        print(f"{t:>2} {p:>4} {bg:>2} | {r['ttft_ms_p50']:>8.1f} {r['ttft_ms_p99']:>8.1f} {r['last_ttft_ms']:>8.1f} "
              f"{r['bound_ttft_ms']:>8.1f} {r['last_over_bound']:>10.3f} "
              f"{r['last_over_bound_min']:>5.2f}-{r['last_over_bound_max']:<5.2f} | "
              f"{r['background_itl_ms_p50_before']:>14.1f} {r['background_itl_ms_p99']:>14.1f} "
              f"{r['background_itl_ms_max']:>8.1f} | {r['background_tok_s_before']:>12.1f} "
              f"{r['burst_window_tok_s']:>8.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
