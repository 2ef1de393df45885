#!/usr/bin/env python3
"""A short load run through the OpenAI API with a load tool nobody here wrote
(locust, PyPI), beside decoded-loadgen's gRPC figures for the same load on the
same daemon (bench/run_openai_load_bench.py does the full comparison):
SmolLM2-135M-Instruct, 4 concurrent requests per round, 24 rounds, prompts of
16-48 tokens, 32 tokens per reply (greedy, ignore_eos).

Asserts: locust exited 0; every request succeeded (none failed in locust's
count nor in the per-request records), TTFT and inter-token gaps were measured
for every request, every reply had exactly max_tokens tokens; decoded-loadgen
passed its own checks for the same load. A control run against a daemon that
requires a bearer token the load does not send must fail those assertions.

  python3 tests/server/openai_load_test.py BUILD_DIR

Model: $DECODED_SMOLLM2_PATH (default ~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf); locust: the
interpreter $DECODED_LOCUST_PYTHON, else this one (scripts/test.sh installs locust==2.47.0). Either missing,
the test is skipped (exit 77) unless DECODED_REQUIRE_MODEL=1.
"""
import os
import subprocess
import sys
import tempfile
import unittest

BUILD = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import run_openai_load_bench as bench  # noqa: E402
from daemon import free_port, running_daemon  # noqa: E402

MODEL = os.environ.get("DECODED_SMOLLM2_PATH", bench.DEFAULT_MODEL)
CONCURRENCY = 4
ROUNDS = 24
LOAD = {"max_tokens": 32, "prompt_min": 16, "prompt_max": 48}


def daemon_flags(http_port, extra=()):
    return ["--threads=2", "--workers=1", f"--http_listen=127.0.0.1:{http_port}"] + list(extra)


class OpenAiLoadTest(unittest.TestCase):
    def test_locust_load_beside_loadgen(self):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        seeds = bench.Seeds()
        with running_daemon(BUILD, MODEL, daemon_flags(port)) as (grpc_addr, log_tail), \
                tempfile.TemporaryDirectory() as work:
            bench.wait_http(url)
            info = bench.model_info(BUILD, grpc_addr)
            name = os.path.basename(MODEL)[:-len(".gguf")]
            run = bench.run_http(url, name, CONCURRENCY, ROUNDS, LOAD, info, seeds.take(), work, time_limit=300)
            http = bench.summarize_http(run, LOAD)
            problems = bench.check_http(http, CONCURRENCY, ROUNDS, LOAD["max_tokens"], run)
            self.assertEqual(problems, [], f"{problems}\ndaemon log: {log_tail()}")
            self.assertEqual(http["requests"], CONCURRENCY * ROUNDS)
            # The same load over gRPC.
            grpc = bench.summarize_grpc(bench.run_grpc(BUILD, grpc_addr, CONCURRENCY, LOAD, seeds, rounds=ROUNDS),
                                        LOAD)
            print("\n" + bench.table([(CONCURRENCY, "gRPC (decoded-loadgen)", grpc),
                                      (CONCURRENCY, "HTTP/SSE (locust)", http)]), file=sys.stderr)
            self.assertEqual(grpc["requests"], CONCURRENCY * ROUNDS)
            self.assertEqual(grpc["errors"], 0, grpc["violations"])
            self.assertEqual(grpc["tokens"], CONCURRENCY * ROUNDS * LOAD["max_tokens"])
            for side in (http, grpc):
                for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tok_s", "req_s"):
                    self.assertGreater(side[key], 0, key)

    def test_control_a_token_the_load_does_not_send_fails_the_checks(self):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running_daemon(BUILD, MODEL, daemon_flags(port, ["--auth_token=load-test-token"])) as (grpc_addr, _), \
                tempfile.TemporaryDirectory() as work:
            bench.wait_http(url)
            info = bench.model_info(BUILD, grpc_addr, auth_token="load-test-token")
            name = os.path.basename(MODEL)[:-len(".gguf")]
            run = bench.run_http(url, name, 2, 1, LOAD, info, 1, work, time_limit=120)
            problems = bench.check_http(bench.summarize_http(run, LOAD), 2, 1, LOAD["max_tokens"], run)
            self.assertTrue(any("HTTP 401" in p for p in problems), problems)
            self.assertTrue(any(p.startswith("locust exited 1") for p in problems), problems)


def locust_available():
    try:
        return subprocess.run([bench.locust_python(), "-c", "import locust"], capture_output=True).returncode == 0
    except OSError:
        return False


if __name__ == "__main__":
    missing = [what for what, ok in (("model " + MODEL, os.path.exists(MODEL)),
                                     ("locust for " + bench.locust_python(), locust_available())) if not ok]
    if missing:
        if os.environ.get("DECODED_REQUIRE_MODEL") == "1":
            print(f"missing: {', '.join(missing)} (DECODED_REQUIRE_MODEL=1)", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: missing {', '.join(missing)}", file=sys.stderr)
        sys.exit(77)
    unittest.main(verbosity=2)
