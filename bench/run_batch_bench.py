#!/usr/bin/env python3
"""Batched decode against llama.cpp, in one run (issue 8, part 5): aggregate
decode tok/s of N concurrent sequences for each N, our engine in-process,
our daemon over gRPC, and llama.cpp stepping N sequences per llama_decode, on
the same GGUF file, thread counts and machine.

Usage: python3 bench/run_batch_bench.py [--model PATH] [--build build]
       [--threads 1 2] [--concurrency 1 2 4 8 16] [--prompt-tokens 16]
       [--decode-steps 64] [--repeats 3] [--json OUT.json]

For each thread count T:
  (a) ours in-process: bench/batch_decode_bench (B sessions stepped together
      by BatchDecoder; tok/s = B * steps / time of the Decode calls).
  (b) ours through the daemon: build/server/decoded --threads T --workers 1
      --max_batch 16 --max_sessions 32 on a free port, then
      bench/grpc_concurrency_bench with N concurrent streams (decode_tok_s:
      tokens arriving while all N streams decode / that window's length; see
      that file's header), then the daemon is stopped.
  (c) llama.cpp: bench/llamacpp_batched_bench.llamacpp_batched (N sequences
      per llama_decode call; tok/s = N * steps / time of the calls).
  (d) read bandwidth with T threads (bench/read_bandwidth_bench, 1 GiB).
All three use the same prompts (BOS, then ids spread over the vocabulary,
offset per sequence), greedy decoding and the same number of decode steps.

Columns of the printed table, per T and N:
  in-proc / daemon / llama.cpp   aggregate decode tok/s.
  ours/llama                     in-process tok/s / llama.cpp tok/s (and the
                                 daemon's in parentheses).
  x N=1                          our in-process tok/s / our in-process tok/s at
                                 the first --concurrency level, N = 1 by
                                 default (daemon's in parentheses).
  ITL p50/p99 daemon             inter-token latency one stream sees through
                                 the daemon (client clock, gaps while all N
                                 decode; pooled over streams).
  step p50/p99 llama             llama.cpp's llama_decode time for the N-row
                                 step (the inter-token latency of each sequence).
  BW frac (in-proc / llama)      fraction of the read-bandwidth limit: a step
                                 reads every weight once whatever N is, so
                                 steps/s = tok/s / N and the fraction is
                                 steps/s * weight bytes / (GB/s with T threads).
                                 KV-cache reads are not counted (small at these
                                 lengths), so it is a lower bound of the bytes.
Prefill against llama.cpp is bench/run_bench.py's job.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_batched_bench import llamacpp_batched  # noqa: E402
from run_bench import read_bandwidth_gbs, weight_bytes_per_token  # noqa: E402
from daemon import cpu_model_name, running_daemon  # noqa: E402


def ours_inprocess(build, model, threads, sizes, n_prompt, n_steps, repeats):
    out = subprocess.run([os.path.join(build, "bench", "batch_decode_bench"), f"--model={model}",
                          f"--threads={threads}", "--batch_sizes=" + ",".join(str(b) for b in sizes),
                          f"--prompt_tokens={n_prompt}", f"--decode_steps={n_steps}", f"--repeats={repeats}"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ours_daemon(build, model, threads, sizes, n_prompt, n_steps, repeats, max_batch=16, max_sessions=32):
    """Starts `decoded` with `threads` compute threads and one worker, runs
    grpc_concurrency_bench at every N and stops the daemon."""
    flags = [f"--threads={threads}", "--workers=1", f"--max_batch={max_batch}", f"--max_sessions={max_sessions}"]
    with running_daemon(build, model, flags) as (addr, _):
        out = subprocess.run([os.path.join(build, "bench", "grpc_concurrency_bench"), f"--server={addr}",
                              "--streams=" + ",".join(str(n) for n in sizes), f"--prompt_tokens={n_prompt}",
                              f"--tokens={n_steps + 1}", f"--repeats={repeats}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"grpc_concurrency_bench failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the report (JSON) to this file; '-': to stdout")
    args = ap.parse_args()
    if max(args.concurrency) > 16:
        sys.exit("run_batch_bench: --concurrency above 16 exceeds the daemon's --max_batch 16 and "
                 "batch_decode_bench's largest plan")

    import llama_cpp
    wbytes = weight_bytes_per_token(args.model)
    bandwidth = read_bandwidth_gbs(args.build, args.threads)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    report = {"model": args.model, "cpu": cpu_model_name(), "llama_cpp_python": llama_cpp.__version__,
              "weight_bytes_per_step": wbytes, "prompt_tokens": args.prompt_tokens,
              "decode_steps": args.decode_steps, "repeats": args.repeats,
              "load_average_at_start": load,
              "read_bandwidth_gb_s": {str(t): round(bw, 2) for t, bw in bandwidth.items()}, "runs": []}
    for t in args.threads:
        print(f"threads={t}: in-process ...", file=sys.stderr, flush=True)
        inproc = ours_inprocess(args.build, args.model, t, args.concurrency, args.prompt_tokens,
                                args.decode_steps, args.repeats)
        print(f"threads={t}: daemon ...", file=sys.stderr, flush=True)
        # --tokens = steps + 1: the first token comes from prefill, the other
        # `steps` from decode steps, as in the in-process and llama.cpp runs.
        daemon = ours_daemon(args.build, args.model, t, args.concurrency, args.prompt_tokens,
                             args.decode_steps, args.repeats)
        print(f"threads={t}: llama.cpp ...", file=sys.stderr, flush=True)
        llama = llamacpp_batched(args.model, t, args.concurrency, args.prompt_tokens, args.decode_steps,
                                 args.repeats)
        by_n_in = {r["batch"]: r for r in inproc["results"]}
        by_n_d = {r["streams"]: r for r in daemon["results"]}
        by_n_l = {r["batch"]: r for r in llama}
        bw = bandwidth[t] * 1e9
        rows = []
        for n in args.concurrency:
            i, d, l = by_n_in[n], by_n_d[n], by_n_l[n]
            rows.append({
                "n": n,
                "inprocess_tok_s": i["decode_tok_s"], "daemon_tok_s": d["decode_tok_s"],
                "llama_cpp_tok_s": l["decode_tok_s"],
                "inprocess_over_llama_cpp": ratio(i["decode_tok_s"], l["decode_tok_s"]),
                "daemon_over_llama_cpp": ratio(d["decode_tok_s"], l["decode_tok_s"]),
                "inprocess_scaling_vs_n1": ratio(i["decode_tok_s"], by_n_in[args.concurrency[0]]["decode_tok_s"]),
                "daemon_scaling_vs_n1": ratio(d["decode_tok_s"], by_n_d[args.concurrency[0]]["decode_tok_s"]),
                "llama_cpp_scaling_vs_n1": ratio(l["decode_tok_s"], by_n_l[args.concurrency[0]]["decode_tok_s"]),
                "inprocess_step_ms_p50": i["step_ms_p50"], "inprocess_step_ms_p99": i["step_ms_p99"],
                "daemon_inter_token_ms_p50": d["steady_inter_token_ms_p50"],
                "daemon_inter_token_ms_p99": d["steady_inter_token_ms_p99"],
                "daemon_ttft_ms_p50": d["ttft_ms_p50"], "daemon_ttft_ms_p99": d["ttft_ms_p99"],
                "llama_cpp_step_ms_p50": l["step_ms_p50"], "llama_cpp_step_ms_p99": l["step_ms_p99"],
                "inprocess_fraction_of_bandwidth": round(i["decode_tok_s"] / n * wbytes / bw, 3),
                "daemon_fraction_of_bandwidth": round(d["decode_tok_s"] / n * wbytes / bw, 3),
                "llama_cpp_fraction_of_bandwidth": round(l["decode_tok_s"] / n * wbytes / bw, 3),
            })
        report["runs"].append({"threads": t, "cpu_isa": inproc.get("cpu_isa"), "rows": rows,
                               "inprocess": inproc, "daemon": daemon, "llama_cpp": llama})

    print(f"{report['cpu']}, {os.path.basename(args.model)} ({wbytes / 1e6:.1f} MB of weights per step), "
          f"{args.prompt_tokens}-token prompts, {args.decode_steps} decode steps, best of {args.repeats}; "
          f"load average at start {load[0]:.2f}" if load else "load average unknown")
    for run in report["runs"]:
        t = run["threads"]
        print(f"\nthreads={t} ({run['cpu_isa']} kernels), read bandwidth {bandwidth[t]:.2f} GB/s")
        print("|  N | tok/s in-proc / daemon / llama.cpp | ours/llama (daemon) | x N=1 (daemon) | "
              "ITL p50/p99 daemon ms | step p50/p99 llama ms | BW frac in-proc / llama |")
        print("|---|---|---|---|---|---|---|")
        for r in run["rows"]:
            print(f"| {r['n']:2d} | {r['inprocess_tok_s']:.1f} / {r['daemon_tok_s']:.1f} / {r['llama_cpp_tok_s']:.1f} "
                  f"| {r['inprocess_over_llama_cpp']} ({r['daemon_over_llama_cpp']}) "
                  f"| {r['inprocess_scaling_vs_n1']} ({r['daemon_scaling_vs_n1']}) "
                  f"| {r['daemon_inter_token_ms_p50']:.1f} / {r['daemon_inter_token_ms_p99']:.1f} "
                  f"| {r['llama_cpp_step_ms_p50']:.1f} / {r['llama_cpp_step_ms_p99']:.1f} "
                  f"| {r['inprocess_fraction_of_bandwidth']:.2f} / {r['llama_cpp_fraction_of_bandwidth']:.2f} |")
    if args.json == "-":
        print(json.dumps(report, indent=1))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nJSON report: {args.json}")


if __name__ == "__main__":
    sys.exit(main())
