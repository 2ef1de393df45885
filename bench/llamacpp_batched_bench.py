#!/usr/bin/env python3
"""llama.cpp stepping B sequences per llama_decode call: the baseline for
batched decode (issue 8, part 5).

For each B, B different short prompts are prefilled into sequences 0..B-1 of
one context (n_seq_max = B, a KV cache with room for every sequence), then
every llama_decode call carries one token per sequence (a batch of B tokens,
logits for each) and each sequence's next token is its greedy argmax. Uses
llama.cpp's C API through llama-cpp-python's ctypes bindings (as
bench/run_bench.py's llamacpp() does for one sequence), so no Python-side
logits copies are charged to llama.cpp.

Reported per B (JSON, one object per thread count):
  decode_tok_s       B * steps / time of the steps, best of --repeats runs;
                     a step's time is the llama_decode call (on the CPU
                     backend it returns with the logits computed); the
                     greedy argmax runs outside it.
  step_ms_p50/p99    per-step latency over the steps of all repeats (the
                     inter-token latency each of the B sequences sees).
  prefill_ms         the one llama_decode call that prefills all B prompts.

Usage: python3 bench/llamacpp_batched_bench.py [--model PATH] [--threads 1 2]
       [--batch-sizes 1 2 4 8 16] [--prompt-tokens 16] [--decode-steps 64]
       [--repeats 3] [--kv-unified]
Import: from llamacpp_batched_bench import llamacpp_batched
        llamacpp_batched(model, threads, [1, 2, 4]) -> list of per-B dicts.
Install llama-cpp-python with tools/install_llama_cpp.sh (pinned version).
"""
import argparse
import ctypes
import json
import os
import sys
import time


def _prompts(n_vocab, bos, batch, n_prompt):
    """`batch` different prompts of `n_prompt` ids: BOS, then ids spread over
    the vocabulary (as bench/decode_bench.cc picks them), offset per sequence."""
    spread = max(1, min(50000, n_vocab - 1000))
    return [[bos] + [(1000 + (i * 7919 + s * 104729) % spread) % n_vocab for i in range(1, n_prompt)]
            for s in range(batch)]


def _quiet(level, text, user_data):
    pass


_QUIET = None  # the ctypes callback; kept alive for the process's life


def _percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def llamacpp_batched(model, threads, batch_sizes=(1, 2, 4, 8, 16), n_prompt=16, n_steps=64, repeats=3,
                     kv_unified=False):
    """Runs the measurement for one thread count; returns one dict per B."""
    global _QUIET
    try:
        import llama_cpp
        import numpy as np
    except ImportError as exc:
        sys.exit(f"llamacpp_batched_bench: {exc}; install llama-cpp-python with tools/install_llama_cpp.sh")
    if _QUIET is None:
        _QUIET = llama_cpp.llama_log_callback(_quiet)
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(_QUIET, None)
    mparams = llama_cpp.llama_model_default_params()
    lmodel = llama_cpp.llama_model_load_from_file(model.encode(), mparams)
    if not lmodel:
        raise RuntimeError(f"llama.cpp could not load {model}")
    vocab = llama_cpp.llama_model_get_vocab(lmodel)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    bos = llama_cpp.llama_vocab_bos(vocab)
    results = []
    try:
        for batch in batch_sizes:
            # Room per sequence for its prompt and every step, rounded up to
            # llama.cpp's 256-cell granularity; n_ctx is shared by the B
            # sequences (split evenly unless kv_unified).
            per_seq = (n_prompt + n_steps + 2 + 255) // 256 * 256
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = per_seq * batch
            cparams.n_batch = cparams.n_ubatch = max(batch * n_prompt, 32)
            cparams.n_seq_max = batch
            cparams.n_threads = cparams.n_threads_batch = threads
            cparams.kv_unified = kv_unified
            cparams.no_perf = True
            ctx = llama_cpp.llama_init_from_model(lmodel, cparams)
            if not ctx:
                raise RuntimeError(f"llama.cpp could not create a context for B={batch}")
            lbatch = llama_cpp.llama_batch_init(batch * n_prompt, 0, 1)
            try:
                prompts = _prompts(n_vocab, bos, batch, n_prompt)
                best_s, prefill_best, steps_ms = 1e30, 1e30, []
                outputs = None
                for _ in range(repeats):
                    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                    k = 0
                    for s, p in enumerate(prompts):
                        for i, t in enumerate(p):
                            lbatch.token[k] = t
                            lbatch.pos[k] = i
                            lbatch.n_seq_id[k] = 1
                            lbatch.seq_id[k][0] = s
                            lbatch.logits[k] = i == len(p) - 1
                            k += 1
                    lbatch.n_tokens = k
                    t0 = time.perf_counter()
                    if llama_cpp.llama_decode(ctx, lbatch) != 0:
                        raise RuntimeError("llama_decode failed (prefill)")
                    prefill_best = min(prefill_best, time.perf_counter() - t0)
                    # llama_get_logits_ith takes the token's index in the batch:
                    # sequence s's last prompt token is at s * n_prompt + n_prompt - 1.
                    def argmax_rows(indices):
                        return [int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, j),
                                                                    shape=(n_vocab,))))
                                for j in indices]
                    nxt = argmax_rows([s * n_prompt + n_prompt - 1 for s in range(batch)])
                    generated = [[t] for t in nxt]
                    total = 0.0
                    for step in range(n_steps):
                        for s in range(batch):
                            lbatch.token[s] = nxt[s]
                            lbatch.pos[s] = n_prompt + step
                            lbatch.n_seq_id[s] = 1
                            lbatch.seq_id[s][0] = s
                            lbatch.logits[s] = True
                        lbatch.n_tokens = batch
                        t0 = time.perf_counter()
                        if llama_cpp.llama_decode(ctx, lbatch) != 0:
                            raise RuntimeError(f"llama_decode failed (B={batch}, step {step})")
                        dt = time.perf_counter() - t0
                        total += dt
                        steps_ms.append(dt * 1e3)
                        nxt = argmax_rows(range(batch))
                        for s in range(batch):
                            generated[s].append(nxt[s])
                    best_s = min(best_s, total)
                    outputs = generated
                steps_ms.sort()
                results.append({"batch": batch, "threads": threads, "prompt_tokens": n_prompt,
                                "decode_steps": n_steps, "kv_unified": kv_unified,
                                "decode_tok_s": round(batch * n_steps / best_s, 2),
                                "step_ms_p50": round(_percentile(steps_ms, 0.50), 3),
                                "step_ms_p99": round(_percentile(steps_ms, 0.99), 3),
                                "prefill_ms": round(prefill_best * 1e3, 3),
                                # The first greedy ids of sequence 0: a check that the
                                # sequences decode real text, and that runs agree.
                                "seq0_first_ids": outputs[0][:8]})
            finally:
                llama_cpp.llama_batch_free(lbatch)
                llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(lmodel)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-unified", action="store_true", help="one KV buffer shared by all sequences")
    args = ap.parse_args()
    import llama_cpp
    report = {"model": args.model, "llama_cpp_python": llama_cpp.__version__, "runs": []}
    for t in args.threads:
        rows = llamacpp_batched(args.model, t, args.batch_sizes, args.prompt_tokens, args.decode_steps,
                                args.repeats, args.kv_unified)
        for r in rows:
            print(f"threads={t} B={r['batch']:2d}: {r['decode_tok_s']:7.1f} tok/s, step p50 {r['step_ms_p50']:.2f} ms "
                  f"p99 {r['step_ms_p99']:.2f} ms, prefill {r['prefill_ms']:.1f} ms", file=sys.stderr, flush=True)
        report["runs"].append({"threads": t, "batches": rows})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    sys.exit(main())
