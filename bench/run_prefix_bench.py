#!/usr/bin/env python3
"""Sessions sharing a 1,000-token system prompt (issue 18, part 6b), through
the daemon, in one run: for each thread count T, build/server/decoded
--threads T --workers 1 is started with --prefix_cache=true and again with
--prefix_cache=false, and bench/prefix_bench runs 16 sessions whose first
turn is the shared system prompt plus a short user turn and whose later turns
are short user turns (see that file's header for each figure). Reported per
T: prefill tokens computed and aggregate tok/s with the cache on and off, and
their ratios (issue targets: >= 4x less prefill work, >= 2x throughput).
With --llama-server, llama.cpp's own server runs the same sessions and turns
in the same run (`llama-server -np <sessions> -t T`, each turn the whole
conversation as token ids with cache_prompt: bench/llama_server_client.py);
build it with tools/install_llama_cpp.sh --server.

Usage: python3 bench/run_prefix_bench.py [--model PATH] [--build build]
       [--threads 1 2] [--sessions 16] [--system-tokens 1000] [--user-tokens 16]
       [--turns 3] [--new-tokens 16] [--daemon-flag=--name=value ...] [--llama-server [PATH]]
       [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name, running_daemon  # noqa: E402
import llama_server_client  # noqa: E402


def run(build, model, threads, cache, args, salt):
    context = args.system_tokens + args.turns * (args.user_tokens + args.new_tokens) + 64
    flags = [f"--threads={threads}", "--workers=1", f"--max_sessions={args.sessions + 4}",
             f"--context_length={context}", f"--prefix_cache={'true' if cache else 'false'}"] + args.daemon_flag
    with running_daemon(build, model, flags) as (addr, log_tail):
        out = subprocess.run([os.path.join(build, "bench", "prefix_bench"), f"--server={addr}",
                              f"--sessions={args.sessions}", f"--system_tokens={args.system_tokens}",
                              f"--user_tokens={args.user_tokens}", f"--turns={args.turns}",
                              f"--new_tokens={args.new_tokens}", f"--salt={salt}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"prefix_bench failed: {out.stderr[-2000:]}\n{log_tail()}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--user-tokens", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--daemon-flag", action="append", default=[],
                    help="an extra flag for the daemon (repeatable)")
    ap.add_argument("--llama-server", nargs="?", const="auto",
                    help="also run llama.cpp's server (its binary; default: tools/install_llama_cpp.sh --server's)")
    ap.add_argument("--json", help="also write the report (JSON) to this file")
    args = ap.parse_args()
    if args.llama_server == "auto":
        args.llama_server = llama_server_client.llama_server_binary()
        if args.llama_server is None:
            sys.exit("no llama-server: run tools/install_llama_cpp.sh --server first")

    report = {"model": args.model, "cpu": cpu_model_name(), "daemon_flags": args.daemon_flag, "runs": []}
    print(f"host CPU: {report['cpu']}; model {os.path.basename(args.model)}; {args.sessions} sessions, "
          f"{args.system_tokens}-token shared system prompt, {args.turns} turns of {args.user_tokens} tokens, "
          f"{args.new_tokens} generated each")
    print(f"{'threads':>7} {'cache':>5} {'prefilled':>9} {'cached':>7} {'wall s':>7} {'tok/s':>7} "
          f"{'ttft p50':>8} {'ttft p99':>8}")
    for t in args.threads:
        on = run(args.build, args.model, t, True, args, salt=t)
        off = run(args.build, args.model, t, False, args, salt=t)
        for name, r in (("on", on), ("off", off)):
            print(f"{t:>7} {name:>5} {r['prefilled_tokens']:>9} {r['cached_tokens']:>7} {r['wall_s']:>7.2f} "
                  f"{r['aggregate_tok_s']:>7.1f} {r['first_ttft_ms_p50']:>8.0f} {r['first_ttft_ms_p99']:>8.0f}")
        work = off["prefilled_tokens"] / max(1, on["prefilled_tokens"])
        speed = on["aggregate_tok_s"] / max(1e-9, off["aggregate_tok_s"])
        print(f"{t:>7}  prefill work off/on {work:.2f}x (target >= 4), throughput on/off {speed:.2f}x "
              f"(target >= 2)")
        run_report = {"threads": t, "cache_on": on, "cache_off": off, "prefill_work_ratio": work,
                      "throughput_ratio": speed}
        if args.llama_server:
            vocab, bos = llama_server_client.vocab_and_bos(args.model)
            slot_context = args.system_tokens + args.turns * (args.user_tokens + args.new_tokens) + 64
            with llama_server_client.running_llama_server(args.llama_server, args.model, t, args.sessions,
                                                          args.sessions * slot_context) as (url, _):
                ls = llama_server_client.run(url, vocab, bos, args.sessions, args.system_tokens, args.user_tokens,
                                             args.turns, args.new_tokens, salt=t)
            print(f"{t:>7} {'l.cpp':>5} {ls['prefilled_tokens']:>9} {ls['cached_tokens']:>7} {ls['wall_s']:>7.2f} "
                  f"{ls['aggregate_tok_s']:>7.1f} {ls['first_ttft_ms_p50']:>8.0f} {ls['first_ttft_ms_p99']:>8.0f}")
            print(f"{t:>7}  against llama-server: prefill work {ls['prefilled_tokens'] / max(1, on['prefilled_tokens']):.2f}x "
                  f"less, throughput {on['aggregate_tok_s'] / max(1e-9, ls['aggregate_tok_s']):.2f}x")
            run_report["llama_server"] = ls
        report["runs"].append(run_report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
