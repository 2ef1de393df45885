#!/usr/bin/env python3
"""A 10-turn chat conversation sent the OpenAI way (every request carries the
whole conversation, a fresh session each time) through the daemon's HTTP API,
with the prefix cache on and off (issue 19, part 4): per turn, the prompt
tokens, the tokens served from cached KV (usage.prompt_tokens_details.
cached_tokens), the tokens prefilled (prompt - cached) and the time to the
first streamed token. The official `openai` SDK is the client.

Usage: python3 bench/openai_conversation_bench.py [--model PATH] [--build build]
       [--turns 10] [--threads 2] [--json OUT.json]
(default model SmolLM2-135M-Instruct: the default Gemma 3 270M has no chat template)
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name, free_port, running_daemon  # noqa: E402

USER_TURNS = [
    "Hello! I'm planning a trip to Lisbon next spring.",
    "What neighbourhoods should I stay in?",
    "Which one is best for food?",
    "And how do I get there from the airport?",
    "Is the metro easy to use?",
    "What about day trips nearby?",
    "Tell me more about Sintra.",
    "How long should I spend there?",
    "What should I pack for April?",
    "Thanks! Can you summarise the plan?",
]


def run(build, model, threads, turns, prefix_cache):
    import openai
    http = f"127.0.0.1:{free_port()}"
    flags = [f"--threads={threads}", "--workers=1", f"--http_listen={http}", "--context_length=4096",
             f"--prefix_cache={'true' if prefix_cache else 'false'}"]
    with running_daemon(build, model, flags) as (_, log_tail):
        client = openai.OpenAI(base_url=f"http://{http}/v1", api_key="-", max_retries=0, timeout=600)
        name = client.models.list().data[0].id
        messages = [{"role": "system", "content": "You are a helpful travel assistant."}]
        rows = []
        for turn in range(turns):
            messages.append({"role": "user", "content": USER_TURNS[turn % len(USER_TURNS)]})
            start = time.monotonic()
            ttft, text, usage = None, "", None
            for chunk in client.chat.completions.create(model=name, messages=messages, max_tokens=48, temperature=0,
                                                        stream=True, stream_options={"include_usage": True}):
                if chunk.usage is not None:
                    usage = chunk.usage
                for c in chunk.choices:
                    if c.delta.content and ttft is None:
                        ttft = time.monotonic() - start
                    text += c.delta.content or ""
            messages.append({"role": "assistant", "content": text})
            cached = usage.prompt_tokens_details.cached_tokens
            rows.append({"turn": turn + 1, "prompt_tokens": usage.prompt_tokens, "cached_tokens": cached,
                         "prefilled_tokens": usage.prompt_tokens - cached, "ttft_ms": round(1000 * (ttft or 0), 1),
                         "completion_tokens": usage.completion_tokens})
        return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the report (JSON) to this file")
    args = ap.parse_args()
    report = {"model": args.model, "cpu": cpu_model_name(), "threads": args.threads}
    for cache in (True, False):
        report["cache_on" if cache else "cache_off"] = run(args.build, args.model, args.threads, args.turns, cache)
    print(f"host CPU: {report['cpu']}; model {os.path.basename(args.model)}; {args.threads} threads; "
          f"{args.turns} turns, 48 tokens each, every request the whole conversation")
    print(f"{'turn':>4} | {'prompt':>6} | {'cached on':>9} {'prefilled on':>12} {'TTFT on ms':>10} | "
          f"{'prefilled off':>13} {'TTFT off ms':>11}")
    on, off = report["cache_on"], report["cache_off"]
    for a, b in zip(on, off):
        print(f"{a['turn']:>4} | {a['prompt_tokens']:>6} | {a['cached_tokens']:>9} {a['prefilled_tokens']:>12} "
              f"{a['ttft_ms']:>10.1f} | {b['prefilled_tokens']:>13} {b['ttft_ms']:>11.1f}")
    total_on = sum(r["prefilled_tokens"] for r in on)
    total_off = sum(r["prefilled_tokens"] for r in off)
    print(f"prefilled in all: {total_on} with the cache, {total_off} without ({total_off / max(1, total_on):.2f}x); "
          f"TTFT sum {sum(r['ttft_ms'] for r in on):.0f} ms against {sum(r['ttft_ms'] for r in off):.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
