#!/usr/bin/env python3
"""Benchmarks decoded against llama.cpp (llama-cpp-python) on the same GGUF file,
the same thread counts and the same machine, in one run, and prints ratios.
Install llama-cpp-python with tools/install_llama_cpp.sh (pinned version and
instruction sets; a plain pip install builds for the build host only and can
die with SIGILL on another).

Usage: python3 bench/run_bench.py [--model PATH] [--build build] [--threads 1 2]
       [--decode-tokens 128] [--prompt-tokens 128] [--grpc]

Reported per thread count:
  prefill tok/s, decode tok/s (ours: D2 held plan; llama.cpp: llama_decode of one
  token), ratios ours/llama.cpp, D2 vs D1 step time, heap allocations per rebind
  step, and decode tok/s against the memory-bandwidth limit for that thread
  count (measured read bandwidth with as many threads, bench/read_bandwidth_bench,
  / weight bytes read per token).
With --grpc: inter-token latency through the daemon vs in-process.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def ours(build, model, threads, n_prompt, n_decode):
    out = subprocess.run([os.path.join(build, "bench", "decode_bench"), f"--model={model}",
                          f"--threads={threads}", f"--prompt_tokens={n_prompt}",
                          f"--decode_tokens={n_decode}", "--repeats=3"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def llamacpp(model, threads, n_prompt, n_decode):
    """llama.cpp through its C API (llama_decode on a preallocated batch, via
    llama-cpp-python's ctypes bindings), so no Python-side logits copies are
    charged to it: the prompt as one batch, then one-token decodes."""
    try:
        import llama_cpp
    except ImportError as exc:
        sys.exit(f"run_bench: llama-cpp-python is missing ({exc}); install it with tools/install_llama_cpp.sh")
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads,
                          n_ctx=n_prompt + n_decode + 16, n_batch=n_prompt, verbose=False)
    ctx = llm.ctx
    batch = llama_cpp.llama_batch_init(n_prompt, 0, 1)

    def decode(tokens, pos0):
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        llama_cpp.llama_get_logits_ith(ctx, -1)  # waits for the result

    # The same ids as bench/decode_bench.cc: spread over this model's vocabulary.
    n_vocab = llm.n_vocab()
    spread = max(1, min(50000, n_vocab - 1000))
    prompt = [2] + [(1000 + (i * 7919) % spread) % n_vocab for i in range(1, n_prompt)]
    best_pp, best_tg = 1e30, 1e30
    for _ in range(3):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        decode(prompt, 0)
        t1 = time.perf_counter()
        decode([3000], n_prompt)
        t2 = time.perf_counter()
        for i in range(n_decode):
            decode([3000], n_prompt + 1 + i)
        t3 = time.perf_counter()
        best_pp = min(best_pp, t1 - t0)
        best_tg = min(best_tg, t3 - t2)
    llama_cpp.llama_batch_free(batch)
    return {"prefill_tok_s": n_prompt / best_pp, "decode_tok_s": n_decode / best_tg,
            "llama_cpp_python": llama_cpp.__version__}


def grpc_latency(build, model, threads, n_decode, port=50991):
    """Starts the daemon with `threads` compute threads and streams n_decode
    tokens through grpc_latency_bench."""
    daemon = subprocess.Popen([os.path.join(build, "server", "decoded"), f"--model={model}",
                               f"--listen=127.0.0.1:{port}", "--metrics_listen=", f"--threads={threads}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cli = os.path.join(build, "client", "decoded-cli")
        for _ in range(240):
            if subprocess.run([cli, f"--server=127.0.0.1:{port}", "--info"], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        bench = os.path.join(build, "bench", "grpc_latency_bench")
        subprocess.run([bench, f"--server=127.0.0.1:{port}", "--tokens=16"], capture_output=True)  # warm
        out = subprocess.run([bench, f"--server=127.0.0.1:{port}", f"--tokens={n_decode}"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    finally:
        daemon.terminate()
        daemon.wait()


def weight_bytes_per_token(model):
    """Bytes of weights a decode step reads: every matrix once (the tied
    embedding is read whole by the output projection; its row lookup is
    negligible)."""
    from gguf import GGUFReader
    r = GGUFReader(model)
    return sum(int(t.n_bytes) for t in r.tensors)


def read_bandwidth_gbs(build, threads):
    """Streaming read bandwidth (GB/s) for each thread count in `threads`, from
    bench/read_bandwidth_bench (a 1 GiB buffer, several times the LLC, summed by
    that many threads; best of 7): {threads: GB/s}."""
    out = subprocess.run([os.path.join(build, "bench", "read_bandwidth_bench"),
                          "--threads=" + ",".join(str(t) for t in threads), "--mib=1024"],
                         check=True, capture_output=True, text=True).stdout
    measured = json.loads(out.strip().splitlines()[-1])["buffers"][0]["read_gb_s"]
    return {int(t): gbs for t, gbs in measured.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    args = ap.parse_args()

    wbytes = weight_bytes_per_token(args.model)
    bandwidth = read_bandwidth_gbs(args.build, args.threads)
    report = {"model": args.model, "weight_bytes_per_token": wbytes,
              "read_bandwidth_gb_s": {str(t): round(bw, 2) for t, bw in bandwidth.items()},
              "runs": []}
    for t in args.threads:
        limit = bandwidth[t] * 1e9 / wbytes
        o = ours(args.build, args.model, t, args.prompt_tokens, args.decode_tokens)
        l = llamacpp(args.model, t, args.prompt_tokens, args.decode_tokens)
        g = grpc_latency(args.build, args.model, t, args.decode_tokens)
        run = {"threads": t, "ours": o, "llama_cpp": l, "grpc": g,
               "grpc_over_inprocess_token_latency": round(g["client_inter_token_ms_mean"] / o["d2_step_ms"], 3),
               "decode_ratio_vs_llama_cpp": round(o["decode_tok_s"] / l["decode_tok_s"], 3),
               "prefill_ratio_vs_llama_cpp": round(o["prefill_tok_s"] / l["prefill_tok_s"], 3),
               "bandwidth_limit_tok_s": round(limit, 1),
               "decode_fraction_of_bandwidth_limit": round(o["decode_tok_s"] / limit, 3)}
        report["runs"].append(run)
        print(f"threads={t}, {o.get('cpu_isa', '?')} kernels: decode {o['decode_tok_s']:.1f} tok/s vs llama.cpp {l['decode_tok_s']:.1f} "
              f"(x{run['decode_ratio_vs_llama_cpp']}), prefill {o['prefill_tok_s']:.0f} vs {l['prefill_tok_s']:.0f} "
              f"(x{run['prefill_ratio_vs_llama_cpp']}), D2 step {o['d2_step_ms']:.2f} ms vs D1 {o['d1_step_ms']:.2f} ms "
              f"(x{o['d2_over_d1_speedup']:.2f}), allocs/rebind {o['heap_allocations_per_rebind_step']}, "
              f"{run['decode_fraction_of_bandwidth_limit']:.2f} of the {t}-thread bandwidth limit "
              f"({limit:.0f} tok/s); token latency in-process {o['d2_step_ms']:.2f} ms vs through gRPC "
              f"{g['client_inter_token_ms_mean']:.2f} ms (p99 {g['client_inter_token_ms_p99']:.2f})", flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
