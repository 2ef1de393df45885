#!/usr/bin/env python3
"""Runs decoded's dashboards and alert rules against a live daemon.

Starts the built daemon on the real model and a Prometheus (Debian's
`prometheus`) that scrapes it every second with deploy/prometheus's rules and
console, streams a short chat load through decoded-cli (two sessions of a few
turns, and a third session refused by --max_sessions so the rejection panel
has data), then checks:

  * the console (deploy/prometheus/consoles/decoded.html) holds exactly the
    Grafana dashboard's expressions (deploy/grafana/dashboards/decoded.json);
  * every dashboard expression returns a finite value over the load
    (range query, 1 s step);
  * every alert rule's expression evaluates, and the quantity it compares
    (the left side of its top-level comparison) returns a finite value;
  * Prometheus evaluated every rule without error (/api/v1/rules);
  * the console page renders (HTTP 200, live values in its summary, every
    script and stylesheet it links is served).

With --screenshot PATH it also renders the console in headless Chromium into
a PNG. Exit status 0 when every check passes, 1 otherwise.

  tools/monitoring_live.py --build build --model "$DECODED_MODEL_PATH"
  tools/monitoring_live.py --build build --model M --screenshot docs/images/console.png
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROM_DIR = os.path.join(ROOT, "deploy", "prometheus")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "dashboards", "decoded.json")
CONSOLE = os.path.join(PROM_DIR, "consoles", "decoded.html")
CHAT_TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "gemma3.jinja")

# The load: each session a few chat turns (the default model is a base model,
# so the daemon is given Gemma 3's chat template).
TURNS = ["Hello, who are you?", "Tell me about the sea.", "And the mountains?"]


def log(msg):
    print(f"monitoring: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- expressions

def dashboard_exprs(path):
    """Every targets[].expr of the dashboard's panels (rows' panels too)."""
    def panels(container):
        for p in container.get("panels", []):
            yield p
            yield from panels(p)
    exprs = []
    for p in panels(json.load(open(path))):
        for t in p.get("targets", []):
            if t.get("expr"):
                exprs.append((p.get("title", "?"), t["expr"]))
    return exprs


def rule_exprs(rules_dir):
    out = []
    for name in sorted(os.listdir(rules_dir)):
        if not name.endswith((".yml", ".yaml")):
            continue
        for group in yaml.safe_load(open(os.path.join(rules_dir, name)))["groups"]:
            for rule in group["rules"]:
                out.append((rule.get("alert") or rule.get("record"), rule["expr"]))
    return out


def console_exprs(path):
    """Backquoted Go strings of the console template: graphs and queries."""
    return re.findall(r"`([^`]*)`", open(path).read())


def split_top_level(expr):
    """Splits `expr` at its top-level set operators (and, or, unless), then
    each part at its first top-level comparison; returns the parts' left
    sides: the quantities an alert compares against its thresholds."""
    depth, i, quote, parts, start = 0, 0, None, [], 0
    cuts = []  # (begin, end) of top-level set operators
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif depth == 0:
            m = re.match(r"\s(and|or|unless)\s", expr[i:])
            if m:
                cuts.append((i, i + m.end()))
                i += m.end()
                continue
        i += 1
    for b, e in cuts:
        parts.append(expr[start:b])
        start = e
    parts.append(expr[start:])

    sides = []
    for part in parts:
        depth, quote, cut = 0, None, None
        for j, c in enumerate(part):
            if quote:
                if c == quote and part[j - 1] != "\\":
                    quote = None
            elif c in "\"'`":
                quote = c
            elif c in "({[":
                depth += 1
            elif c in ")}]":
                depth -= 1
            elif depth == 0 and c in "=!<>":
                cut = j
                break
        sides.append(part[:cut].strip() if cut is not None else part.strip())
    return sides


# ------------------------------------------------------------------ processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def wait_for(what, predicate, timeout, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        try:
            if predicate():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not within {timeout} s")


def metric(port, series):
    _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    m = re.search(rf"^{re.escape(series)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


class Prometheus:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            _, body = http_get(url)
        except urllib.error.HTTPError as e:
            body = e.read().decode()
        return json.loads(body)


def finite_values(result):
    """Finite sample values of an instant (vector) or range (matrix) result."""
    out = []
    for series in result["data"]["result"]:
        samples = series.get("values") or [series["value"]]
        out += [float(v) for _, v in samples if math.isfinite(float(v))]
    return out


# ----------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build folder with server/decoded")
    ap.add_argument("--model", default=os.environ.get("DECODED_MODEL_PATH"), help="GGUF model")
    ap.add_argument("--max_new_tokens", type=int, default=16, help="tokens per turn of the load")
    ap.add_argument("--screenshot", help="also render the console into this PNG with headless Chromium")
    ap.add_argument("--linger", type=float, default=0,
                    help="seconds of idle scraping after the load (the screenshot's graphs fall back to idle)")
    args = ap.parse_args()
    if not args.model or not os.path.exists(args.model):
        sys.exit("monitoring: --model (or DECODED_MODEL_PATH) must name the model file")
    daemon_bin = os.path.join(args.build, "server", "decoded")
    cli_bin = os.path.join(args.build, "client", "decoded-cli")
    for b in (daemon_bin, cli_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"monitoring: {b} is missing; build first")
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        sys.exit("monitoring: prometheus is not installed (apt-get install prometheus)")

    failures = []

    def fail(msg):
        failures.append(msg)
        log(f"FAIL {msg}")

    # The console and the dashboard hold the same expressions.
    dash = dashboard_exprs(DASHBOARD)
    rules = rule_exprs(os.path.join(PROM_DIR, "rules"))
    dash_set = {e for _, e in dash}
    dash_panels = {t for t, _ in dash}
    console_set = set(console_exprs(CONSOLE))
    for e in sorted(dash_set - console_set):
        fail(f"dashboard expression missing from the console: {e}")
    for e in sorted(console_set - dash_set):
        fail(f"console expression not in the dashboard: {e}")
    for title, e in dash:
        if "$" in e:
            fail(f"panel {title!r}: {e} uses a Grafana variable; give this check its value")

    tmp = tempfile.mkdtemp(prefix="decoded-monitoring-")
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    procs = []
    t0 = time.monotonic()
    try:
        # The committed scrape config, pointed at this daemon, scraping and
        # evaluating every second.
        config = yaml.safe_load(open(os.path.join(PROM_DIR, "prometheus.yml")))
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [os.path.join(PROM_DIR, f) for f in config["rule_files"]]
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "decoded")
        job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
        config_path = os.path.join(tmp, "prometheus.yml")
        yaml.safe_dump(config, open(config_path, "w"))

        daemon_log = open(os.path.join(tmp, "decoded.log"), "w")
        daemon = subprocess.Popen(
            [daemon_bin, "--model", args.model, "--listen", f"127.0.0.1:{grpc_port}",
             "--metrics_listen", f"127.0.0.1:{metrics_port}", "--workers", "2", "--threads", "1",
             "--max_sessions", "2", "--context_length", "512", "--kv_budget_mb", "64",
             "--chat_template", CHAT_TEMPLATE],
            stdout=daemon_log, stderr=subprocess.STDOUT)
        procs.append(daemon)
        prom_log = open(os.path.join(tmp, "prometheus.log"), "w")
        prom_proc = subprocess.Popen(
            [prometheus_bin, f"--config.file={config_path}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             f"--web.console.templates={PROM_DIR}/consoles",
             f"--web.console.libraries={PROM_DIR}/console_libraries"],
            stdout=prom_log, stderr=subprocess.STDOUT)
        procs.append(prom_proc)
        prom = Prometheus(prom_port)
        wait_for("decoded serving", lambda: metric(metrics_port, "decoded_health_serving") == 1, 120, daemon)
        wait_for("prometheus ready", lambda: http_get(f"{prom.base}/-/ready")[0] == 200, 60, prom_proc)
        wait_for("first scrape", lambda: finite_values(prom.api("query", query='up{job="decoded"}')) == [1.0],
                 30, prom_proc)
        load_start = time.time()
        log(f"daemon and prometheus up in {time.monotonic() - t0:.1f} s; load starts")

        # Two chat sessions of len(TURNS) turns each; once both are open, a
        # third is refused (--max_sessions 2).
        cli = [cli_bin, "--server", f"127.0.0.1:{grpc_port}", "--max_new_tokens", str(args.max_new_tokens)]
        clients = []
        for _ in range(2):
            c = subprocess.Popen(cli + ["--chat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            c.stdin.write(TURNS[0] + "\n")  # the first turn opens the session
            c.stdin.flush()
            clients.append(c)
            procs.append(c)
        wait_for("two open sessions", lambda: metric(metrics_port, "decoded_sessions_active") == 2, 30)
        refused = subprocess.run(cli + ["--prompt", "One more?"], capture_output=True, text=True, timeout=60)
        if refused.returncode != 1 or "RESOURCE_EXHAUSTED" not in refused.stderr:
            fail(f"a third session should be refused; decoded-cli exited {refused.returncode}: {refused.stderr}")
        for c in clients:
            out, _ = c.communicate("".join(t + "\n" for t in TURNS[1:]), timeout=600)
            # One summary line per turn ("prompt N tok, generated M tok, ...").
            if c.returncode != 0 or out.count(" tok, generated ") != len(TURNS):
                fail(f"chat client exited {c.returncode}:\n{out[-2000:]}")
        load_end = time.time()
        log(f"load done in {load_end - load_start:.1f} s")
        # Two more scrapes and rule evaluations see the end of the load.
        time.sleep(3)
        if args.linger > 0:
            time.sleep(args.linger)
        end = time.time()

        def range_query(e):
            return prom.api("query_range", query=e, start=f"{load_start - 2:.3f}", end=f"{end:.3f}", step="1")

        checked = 0
        for title, e in dash:
            r = range_query(e)
            checked += 1
            if r.get("status") != "success":
                fail(f"panel {title!r}: {e}: {r.get('error')}")
                continue
            v = finite_values(r)
            if not v:
                fail(f"panel {title!r}: {e}: no data")
            else:
                log(f"ok panel {title!r}: {e}: {len(r['data']['result'])} series, max {max(v):.6g}")
        for name, e in rules:
            checked += 1
            r = prom.api("query", query=e, time=f"{end:.3f}")
            if r.get("status") != "success":
                fail(f"rule {name}: {e}: {r.get('error')}")
                continue
            for side in split_top_level(e):
                r = range_query(side)
                v = finite_values(r) if r.get("status") == "success" else []
                if not v:
                    fail(f"rule {name}: {side}: no data ({r.get('error', 'empty')})")
                else:
                    log(f"ok rule {name}: {side}: max {max(v):.6g} (full expression fires: "
                        f"{bool(prom.api('query', query=e, time=f'{end:.3f}')['data']['result'])})")
        groups = prom.api("rules")["data"]["groups"]
        evaluated = {r["name"]: r for g in groups for r in g["rules"]}
        for name, _ in rules:
            r = evaluated.get(name)
            if r is None or r.get("health") != "ok":
                fail(f"rule {name}: not evaluated cleanly by Prometheus: {r and r.get('lastError')}")

        # The console renders on the server: live values in its summary, and
        # nothing to fetch but the API (its graph code is in decoded.lib).
        status, page = http_get(f"{prom.base}/consoles/decoded.html")
        if status != 200 or "<h2>decoded</h2>" not in page:
            fail(f"/consoles/decoded.html: HTTP {status}")
        if f"127.0.0.1:{metrics_port}: 1 " not in page:
            fail("/consoles/decoded.html: the summary does not show the live target up")
        if page.count("decodedGraph(\"panel") != len(dash_panels):
            fail("/consoles/decoded.html: not one graph per dashboard panel")
        if re.search(r"<(script|link|img)[^>]+(src|href)=", page):
            fail("/consoles/decoded.html loads an asset; it should be self-contained")
        log(f"console renders on the server ({len(page)} bytes)")

        # In a browser: every graph drawn from the live data (the console's
        # script marks <body> when done). Needs Chromium; the screenshot too.
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if args.screenshot and chromium is None:
            fail("--screenshot needs chromium (apt-get install chromium)")
        if chromium is not None:
            rng = max(60, int(end - load_start + 20))
            url = f"{prom.base}/consoles/decoded.html#range={rng}"
            browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                       f"--user-data-dir={tmp}/chromium", "--window-size=1400,1840", "--virtual-time-budget=20000"]
            dom = subprocess.run(browser + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
            m = re.search(r'data-graphs-drawn="(\d+)" data-series="(\d+)"', dom)
            if m is None or int(m.group(1)) != len(dash_panels) or int(m.group(2)) < len(dash):
                fail(f"Chromium did not draw every graph with data: {m and m.groups()} of "
                     f"{len(dash_panels)} graphs, {len(dash)} expressions")
            else:
                log(f"Chromium drew {m.group(1)} graphs, {m.group(2)} series")
            if args.screenshot:
                out = os.path.abspath(args.screenshot)
                subprocess.run(browser + [f"--screenshot={out}", url], check=True, capture_output=True, timeout=120)
                log(f"screenshot {out} ({os.path.getsize(out)} bytes) of {url}")

        log(f"{checked} expressions checked ({len(dash)} dashboard, {len(rules)} alert rules); "
            f"{time.monotonic() - t0:.1f} s")

        daemon.send_signal(signal.SIGTERM)
        if daemon.wait(timeout=30) != 0:
            fail(f"decoded exited {daemon.returncode} after SIGTERM")
    except Exception as e:  # a step that could not run is a failure too
        fail(f"{type(e).__name__}: {e}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        if failures:
            for name in ("decoded.log", "prometheus.log"):
                path = os.path.join(tmp, name)
                if os.path.exists(path):
                    log(f"--- {name} (tail)")
                    sys.stderr.write(open(path).read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        log(f"{len(failures)} check(s) failed")
        return 1
    log("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
