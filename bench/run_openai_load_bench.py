#!/usr/bin/env python3
"""The same load through the daemon's two front doors, side by side: the OpenAI
API over HTTP/SSE driven by locust (bench/openai_locustfile.py), and the gRPC
Generate stream driven by decoded-loadgen, on one daemon serving one model
(issue 19, part 5).

The load, equal on both sides:
  - N concurrent requests (gRPC: N streams of one turn each; HTTP: N locust
    users), sent together in rounds: a round ends when all N replies ended, then
    the next starts. decoded-loadgen runs once per round (--streams N --turns 1
    --seed fresh), since its streams carry their context from turn to turn and
    an OpenAI request cannot: one turn per stream keeps every request a fresh
    context on both sides;
  - prompt = [BOS] + random token ids, length (BOS included) uniform in
    [--prompt_min, --prompt_max], ids uniform in decoded-loadgen's range;
  - greedy, ignore_eos, --max_tokens tokens per reply (loadgen: --max_new_tokens);
  - no cancels, no disconnects, no acknowledge_events (HTTP has no such flow
    control: both sides count an event consumed once the transport takes it).
The HTTP side runs the same number of rounds as the gRPC side.

Figures per side: TTFT (request sent -> first token) and inter-token latency
(gaps between consecutive tokens arriving at the client), each as p50 and p99
computed per round with decoded-loadgen's percentile rule and then the median
over rounds (decoded-loadgen reports only per-run percentiles; the HTTP side is
aggregated the same way, and its exact percentiles over all requests are shown
too); output tok/s and requests/s over the summed round times; errors.

Usage: python3 bench/run_openai_load_bench.py [--build build] [--model PATH]
       [--concurrency 1 4 8] [--seconds 45 | --rounds R] [--max_tokens 32]
       [--prompt_min 16] [--prompt_max 48] [--threads 2] [--passes 1] [--json OUT]
locust: $DECODED_LOCUST_PYTHON (an interpreter that has locust==2.47.0), else this one.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import cpu_model_name, free_port, running_daemon  # noqa: E402

LOCUSTFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_locustfile.py")
DEFAULT_MODEL = os.path.expanduser("~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf")


def locust_python():
    return os.environ.get("DECODED_LOCUST_PYTHON") or sys.executable


def percentile(values, q):
    """decoded-loadgen's rule (client/load_generator.cc): sorted[min(n-1, floor(n*q))]."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def model_info(build, grpc_addr, auth_token=""):
    """The served model's facts (GetModelInfo through decoded-cli --info)."""
    cmd = [os.path.join(build, "client", "decoded-cli"), f"--server={grpc_addr}", "--info"]
    if auth_token:
        cmd.append(f"--auth_token={auth_token}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    info = {}
    for line in out.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isidentifier():
            info[key] = value.strip().strip('"')
    return {"vocab_size": int(info["vocab_size"]), "bos_id": int(info["bos_id"]),
            "session_context_length": int(info["session_context_length"]), "name": info.get("name", "")}


def prompt_id_range(vocab_size):
    """decoded-loadgen's range of random prompt ids (MakePlans)."""
    lo = 1000 if vocab_size > 2000 else 0
    return lo, min(vocab_size, lo + 50000)


def wait_http(url, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/health did not answer 200 within {timeout} s")
        time.sleep(0.2)


def host_busy_seconds():
    """CPU seconds all processes of the host spent busy so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_daemon_pid(grpc_addr):
    """The daemon bench/daemon.py started on `grpc_addr` (its command line names it)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f"--listen={grpc_addr}".encode() in f.read().split(b"\0"):
                        return int(entry)
            except OSError:
                continue
    return None


class HostShare:
    """Around one side's run: the CPU seconds the daemon, this script's children
    (the load tool) and everything else on the host used. The host is shared:
    "others" is the noise a figure was taken under."""

    def __init__(self, daemon_pid):
        self.daemon_pid = daemon_pid

    def __enter__(self):
        self.t0 = time.monotonic()
        self.busy0 = host_busy_seconds()
        self.daemon0 = process_cpu_seconds(self.daemon_pid) if self.daemon_pid else 0
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.children0 = c.ru_utime + c.ru_stime
        self.self0 = time.process_time()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.t0
        busy = host_busy_seconds() - self.busy0
        daemon = (process_cpu_seconds(self.daemon_pid) - self.daemon0) if self.daemon_pid else 0
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        children = c.ru_utime + c.ru_stime - self.children0
        mine = time.process_time() - self.self0
        self.result = {"wall_s": wall, "daemon_cpu_s": daemon, "tool_cpu_s": children,
                       "others_cpu_s": max(0.0, busy - daemon - children - mine)}
        return False


class Seeds:
    """Fresh seeds for every run on one daemon: a prompt seen before would be
    served from the prefix cache, and its cheaper prefill would flatter TTFT."""

    def __init__(self, start=1):
        self.next = start

    def take(self):
        self.next += 1
        return self.next - 1


def run_child(cmd, timeout):
    """subprocess.run, plus the CPU seconds (user + system) the child used: on
    a host this small the client's own CPU is taken from the daemon's."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def grpc_round(build, grpc_addr, concurrency, load, seed):
    """One decoded-loadgen run: `concurrency` streams of one turn; its JSON report."""
    cmd = [os.path.join(build, "client", "decoded-loadgen"), f"--server={grpc_addr}", f"--streams={concurrency}",
           "--turns=1", f"--min_prompt_tokens={load['prompt_min']}", f"--max_prompt_tokens={load['prompt_max']}",
           f"--max_new_tokens={load['max_tokens']}", "--cancel_probability=0", "--disconnect_probability=0",
           "--acknowledge_fraction=0", f"--seed={seed}", "--settle_seconds=0"]
    p, cpu = run_child(cmd, 600)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"decoded-loadgen exited {p.returncode}: {p.stderr[-2000:]}")
    report = json.loads(lines[-1])
    report["exit_code"] = p.returncode
    report["client_cpu_seconds"] = cpu  # the whole run, its solo replay included
    return report


def run_grpc(build, grpc_addr, concurrency, load, seeds, rounds=None, seconds=None):
    """decoded-loadgen once per round, `rounds` times, or until the rounds' load
    time adds up to `seconds`."""
    reports = []
    while (rounds is not None and len(reports) < rounds) or \
            (rounds is None and sum(r["load_seconds"] for r in reports) < seconds):
        reports.append(grpc_round(build, grpc_addr, concurrency, load, seeds.take()))
    return reports


def run_http(http_url, model_name, concurrency, rounds, load, info, seed, workdir, api_key="", time_limit=None):
    """locust (headless) with `concurrency` users for `rounds` rounds; returns
    its exit code, output tail, per-request records and its own stats."""
    lo, hi = prompt_id_range(info["vocab_size"])
    prefix = os.path.join(workdir, f"locust_c{concurrency}_s{seed}")
    limit = time_limit or max(120, rounds * 30)
    cmd = [locust_python(), "-m", "locust", "-f", LOCUSTFILE, "--headless", "-u", str(concurrency), "-r",
           str(concurrency), "--host", http_url, "--run-time", f"{limit}s", "--stop-timeout", "60", "--csv", prefix,
           "--json-file", prefix, "--only-summary", "--loglevel", "WARNING", "--model-name", model_name,
           "--rounds", str(rounds), "--max-tokens", str(load["max_tokens"]), "--prompt-min", str(load["prompt_min"]),
           "--prompt-max", str(load["prompt_max"]), "--vocab-lo", str(lo), "--vocab-hi", str(hi), "--bos-id",
           str(info["bos_id"]), "--prompt-seed", str(seed), "--records", prefix + ".jsonl"]
    if api_key:
        cmd += ["--api-key", api_key]
    t0 = time.monotonic()
    p, cpu = run_child(cmd, limit + 120)
    wall = time.monotonic() - t0
    records = []
    if os.path.exists(prefix + ".jsonl"):
        with open(prefix + ".jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
    stats = []
    if os.path.exists(prefix + ".json"):
        with open(prefix + ".json") as f:
            stats = json.load(f)
    return {"exit_code": p.returncode, "client_cpu_seconds": cpu, "wall_seconds": wall,
            "output_tail": (p.stdout + p.stderr)[-3000:], "records": records, "locust_stats": stats,
            "csv": prefix + "_stats.csv"}


def locust_percentile(entry, q):
    """Locust's own percentile of one stats entry (its rounded response-time
    histogram, walked from the top as locust does)."""
    n = entry["num_requests"]
    times = {float(k): v for k, v in (entry.get("response_times") or {}).items()}
    seen = 0
    for t in sorted(times, reverse=True):
        seen += times[t]
        if n - seen <= int(n * q):
            return t
    return None


def summarize_grpc(reports, load):
    load_s = sum(r["load_seconds"] for r in reports)
    turns = sum(r["turns_sent"] for r in reports)
    completed = sum(r["turns_completed"] for r in reports)
    violations = [v for r in reports for v in r["violations"]]
    tokens = sum(r["tokens"] for r in reports)
    return {"rounds": len(reports), "requests": turns, "completed": completed,
            "errors": (turns - completed) + len(violations), "violations": violations[:10],
            "tokens": tokens, "expected_tokens": turns * load["max_tokens"], "load_seconds": load_s,
            "client_cpu_seconds": sum(r["client_cpu_seconds"] for r in reports),
            "wall_seconds": sum(r["load_seconds"] + r["solo_seconds"] for r in reports),
            "tok_s": tokens / load_s if load_s else 0, "req_s": completed / load_s if load_s else 0,
            "tok_s_round_median": statistics.median(r["tokens"] / r["load_seconds"] for r in reports),
            "ttft_p50": statistics.median(r["ttft_ms_p50"] for r in reports),
            "ttft_p99": statistics.median(r["ttft_ms_p99"] for r in reports),
            "itl_p50": statistics.median(r["inter_token_ms_p50"] for r in reports),
            "itl_p99": statistics.median(r["inter_token_ms_p99"] for r in reports)}


def summarize_http(run, load):
    records = run["records"]
    by_round = {}
    for r in records:
        by_round.setdefault(r["round"], []).append(r)
    load_s = sum(max(r["end"] for r in rs) - rs[0]["round_start"] for rs in by_round.values())
    ok = [r for r in records if r["error"] is None]
    tokens = sum(r["completion_tokens"] or 0 for r in records)
    per_round = [([r["ttft_ms"] for r in rs if r["ttft_ms"] is not None],
                  [g for r in rs for g in r["gaps_ms"]]) for rs in by_round.values()]
    # Gaps of the requests whose every token came in a chunk of its own (SSE
    # sends no chunk for a token whose text is held back, e.g. part of a UTF-8
    # character: the next chunk then carries two tokens, its gap two steps).
    per_round_whole = [[g for r in rs if r["error"] is None and r["chunks"] == r["completion_tokens"]
                        for g in r["gaps_ms"]] for rs in by_round.values()]
    round_tok_s = [sum(r["completion_tokens"] or 0 for r in rs) / (max(r["end"] for r in rs) - rs[0]["round_start"])
                   for rs in by_round.values()]

    def median_of(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    stats = {e["method"]: e for e in run["locust_stats"] if e["name"] == "/v1/completions"}
    post = stats.get("POST", {"num_requests": 0, "num_failures": 0})
    return {"rounds": len(by_round), "requests": len(records), "completed": len(ok),
            "errors": len(records) - len(ok), "error_samples": [r["error"] for r in records if r["error"]][:5],
            "tokens": tokens, "expected_tokens": len(records) * load["max_tokens"], "load_seconds": load_s,
            "client_cpu_seconds": run["client_cpu_seconds"], "wall_seconds": run["wall_seconds"],
            # locust's CPU from the first round's start to the last reply (its start-up excluded)
            "client_cpu_load_seconds": (max(r["cpu_end"] for r in records) -
                                        min(r["round_cpu_start"] for r in records)) if records else 0,
            "tok_s": tokens / load_s if load_s else 0, "req_s": len(ok) / load_s if load_s else 0,
            "tok_s_round_median": median_of(round_tok_s),
            "itl_p50_own_chunks": median_of(percentile(g, 0.50) for g in per_round_whole),
            "itl_p99_own_chunks": median_of(percentile(g, 0.99) for g in per_round_whole),
            "ttft_p50": median_of(percentile(t, 0.50) for t, _ in per_round),
            "ttft_p99": median_of(percentile(t, 0.99) for t, _ in per_round),
            "itl_p50": median_of(percentile(g, 0.50) for _, g in per_round),
            "itl_p99": median_of(percentile(g, 0.99) for _, g in per_round),
            "exact": {"ttft_p50": percentile([r["ttft_ms"] for r in ok], 0.50),
                      "ttft_p99": percentile([r["ttft_ms"] for r in ok], 0.99),
                      "itl_p50": percentile([g for r in ok for g in r["gaps_ms"]], 0.50),
                      "itl_p99": percentile([g for r in ok for g in r["gaps_ms"]], 0.99)},
            "requests_with_held_back_tokens": sum(1 for r in ok if r["chunks"] < r["completion_tokens"]),
            "locust": {"exit_code": run["exit_code"], "requests": post["num_requests"],
                       "failures": post["num_failures"],
                       "ttft_p50": locust_percentile(stats["TTFT"], 0.5) if "TTFT" in stats else None,
                       "ttft_p99": locust_percentile(stats["TTFT"], 0.99) if "TTFT" in stats else None,
                       "itl_p50": locust_percentile(stats["ITL"], 0.5) if "ITL" in stats else None,
                       "itl_p99": locust_percentile(stats["ITL"], 0.99) if "ITL" in stats else None,
                       "ttft_count": stats.get("TTFT", {}).get("num_requests", 0)}}


def check_http(summary, concurrency, rounds, max_tokens, run):
    """The load run's assertions (the CI test's): every request answered in
    full, no error on either counter, TTFT and at least one inter-token gap
    measured for every request, every reply exactly max_tokens long."""
    problems = []
    expected = concurrency * rounds
    if run["exit_code"] != 0:
        problems.append(f"locust exited {run['exit_code']}: {run['output_tail'][-800:]}")
    if summary["requests"] != expected or summary["completed"] != expected:
        problems.append(f"{summary['completed']} of {summary['requests']} requests succeeded; expected {expected}")
    if summary["errors"]:
        problems.append(f"{summary['errors']} requests failed, e.g. {summary['error_samples'][:2]}")
    if summary["locust"]["failures"] or summary["locust"]["requests"] != expected:
        problems.append(f"locust counted {summary['locust']['requests']} requests, "
                        f"{summary['locust']['failures']} failures; expected {expected}, 0")
    for i, r in enumerate(run["records"]):
        if r["ttft_ms"] is None or not r["gaps_ms"]:
            problems.append(f"request {i}: TTFT {r['ttft_ms']}, {len(r['gaps_ms'])} inter-token gaps")
        if r["completion_tokens"] != max_tokens:
            problems.append(f"request {i}: {r['completion_tokens']} tokens, expected {max_tokens}")
    if summary["locust"]["ttft_count"] != expected:
        problems.append(f"locust has {summary['locust']['ttft_count']} TTFT samples, expected {expected}")
    if summary["tokens"] != summary["expected_tokens"]:
        problems.append(f"{summary['tokens']} tokens, expected {summary['expected_tokens']}")
    return problems


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def table(rows):
    head = (f"{'c':>2} {'front door':<22} {'req':>5} {'err':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} "
            f"{'ITL p99':>8} {'tok/s':>7} {'req/s':>6} {'tok/s med':>9}")
    lines = [head, "-" * len(head)]
    for c, label, s in rows:
        lines.append(f"{c:>2} {label:<22} {s['requests']:>5} {s['errors']:>4} {fmt(s['ttft_p50']):>9} "
                     f"{fmt(s['ttft_p99']):>9} {fmt(s['itl_p50']):>8} {fmt(s['itl_p99']):>8} {fmt(s['tok_s']):>7} "
                     f"{fmt(s['req_s'], 2):>6} {fmt(s.get('tok_s_round_median')):>9}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="holds server/decoded, client/decoded-loadgen, client/decoded-cli")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--seconds", type=float, default=45, help="gRPC load time per concurrency (sets the rounds)")
    ap.add_argument("--rounds", type=int, help="rounds per concurrency (instead of --seconds)")
    ap.add_argument("--max_tokens", type=int, default=32)
    ap.add_argument("--prompt_min", type=int, default=16)
    ap.add_argument("--prompt_max", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=1, help="repeat, the second pass with HTTP first")
    ap.add_argument("--json", help="also write the report (JSON) to this file")
    args = ap.parse_args()
    load = {"max_tokens": args.max_tokens, "prompt_min": args.prompt_min, "prompt_max": args.prompt_max}
    http_port = free_port()
    http_url = f"http://127.0.0.1:{http_port}"
    flags = [f"--threads={args.threads}", "--workers=1", f"--http_listen=127.0.0.1:{http_port}",
             f"--max_sessions={max(16, max(args.concurrency))}"]
    report = {"cpu": cpu_model_name(), "nproc": os.cpu_count(), "model": os.path.basename(args.model),
              "threads": args.threads, "load": load, "runs": []}
    rows = []
    seeds = Seeds()
    with running_daemon(args.build, args.model, flags) as (grpc_addr, log_tail), \
            tempfile.TemporaryDirectory() as work:
        wait_http(http_url)
        daemon_pid = find_daemon_pid(grpc_addr)
        info = model_info(args.build, grpc_addr)
        with urllib.request.urlopen(f"{http_url}/v1/models", timeout=10) as r:
            model_name = json.load(r)["data"][0]["id"]
        # Warm-up (not measured): one round on each side.
        grpc_round(args.build, grpc_addr, 1, load, seeds.take())
        run_http(http_url, model_name, 1, 1, load, info, seeds.take(), work)
        for p in range(args.passes):
            for c in args.concurrency:
                rounds = args.rounds
                order = ("grpc", "http") if p % 2 == 0 else ("http", "grpc")
                if rounds is None and order[0] == "http":
                    rounds = next(r["rounds"] for r in reversed(report["runs"]) if r["concurrency"] == c)
                result = {"pass": p + 1, "concurrency": c}
                for side in order:
                    with HostShare(daemon_pid) as share:
                        if side == "grpc":
                            reports = run_grpc(args.build, grpc_addr, c, load, seeds, rounds=rounds,
                                               seconds=args.seconds)
                            rounds = len(reports)
                        else:
                            run = run_http(http_url, model_name, c, rounds, load, info, seeds.take(), work)
                    if side == "grpc":
                        result["grpc"] = summarize_grpc(reports, load)
                        result["grpc"]["round_reports"] = reports
                    else:
                        result["http"] = summarize_http(run, load)
                        result["http"]["check"] = check_http(result["http"], c, rounds, args.max_tokens, run)
                        result["http"]["records"] = run["records"]
                    result[side]["host"] = share.result
                    print(f"pass {p + 1} c={c} {side}: {rounds} rounds in {share.result['wall_s']:.0f} s; CPU s: "
                          f"daemon {share.result['daemon_cpu_s']:.1f}, tool {share.result['tool_cpu_s']:.1f}, "
                          f"other processes {share.result['others_cpu_s']:.1f}", file=sys.stderr)
                result["rounds"] = rounds
                report["runs"].append(result)
                rows.append((c, "gRPC (decoded-loadgen)", result["grpc"]))
                rows.append((c, "HTTP/SSE (locust)", result["http"]))
    print(f"host CPU: {report['cpu']} ({report['nproc']} CPUs); model {report['model']}; daemon --threads "
          f"{args.threads} --workers 1; prompts {args.prompt_min}-{args.prompt_max} tokens (BOS + random ids), "
          f"{args.max_tokens} tokens per reply (greedy, ignore_eos); c requests per round, rounds as listed")
    print("TTFT / ITL in ms: per-round p50 and p99, median over the rounds; tok/s and req/s over the summed rounds")
    print(table(rows))
    for r in report["runs"]:
        h = r["http"]
        e, lc = h["exact"], h["locust"]
        g = r["grpc"]
        print(f"pass {r['pass']} c={r['concurrency']}, {r['rounds']} rounds:\n"
              f"  HTTP over all requests: TTFT p50 {fmt(e['ttft_p50'])} p99 {fmt(e['ttft_p99'])}, ITL p50 "
              f"{fmt(e['itl_p50'])} p99 {fmt(e['itl_p99'])}; locust's own histogram: TTFT {fmt(lc['ttft_p50'], 0)}/"
              f"{fmt(lc['ttft_p99'], 0)}, ITL {fmt(lc['itl_p50'], 0)}/{fmt(lc['itl_p99'], 0)}\n"
              f"  HTTP: {h['requests_with_held_back_tokens']} requests had a token streamed in a later chunk; ITL "
              f"p50/p99 over the others: {fmt(h['itl_p50_own_chunks'])}/{fmt(h['itl_p99_own_chunks'])}\n"
              f"  checks: {'; '.join(h['check']) or 'all passed'}; gRPC violations: {g['violations'] or 'none'}\n"
              f"  client CPU s: locust {h['client_cpu_load_seconds']:.1f} in its {h['load_seconds']:.1f} s of load "
              f"({h['client_cpu_seconds']:.1f} with its start-up); decoded-loadgen {g['client_cpu_seconds']:.1f} "
              f"for {g['load_seconds']:.1f} s of load, start-ups and solo replays included\n"
              f"  other processes' CPU s on the host: {g['host']['others_cpu_s']:.1f} in the gRPC side's "
              f"{g['host']['wall_s']:.0f} s, {h['host']['others_cpu_s']:.1f} in the HTTP side's "
              f"{h['host']['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
