"""A locust load of streamed OpenAI completions against the daemon's HTTP API
(--http_listen), shaped like decoded-loadgen's gRPC load so that the two can be
read side by side (bench/run_openai_load_bench.py runs both):

  - every request is a fresh context: prompt = [BOS] + random token ids, its
    length (BOS included) uniform in [--prompt-min, --prompt-max], the ids
    uniform in [--vocab-lo, --vocab-hi) (decoded-loadgen's range);
  - greedy (temperature 0), ignore_eos, max_tokens = --max-tokens, so every
    reply has exactly that many tokens;
  - rounds: the N users send one request each at the same moment, and the next
    round starts when all N replies have ended (decoded-loadgen run with
    --streams N --turns 1 once per round); after --rounds rounds locust quits.

Each request fires locust request events: "POST /v1/completions" (the whole
reply; response_length = usage.completion_tokens; a failure carries the
reason), "TTFT" (request sent -> first streamed token) and one "ITL" per gap
between consecutive streamed tokens. With --records FILE each request is also
written as one JSON line (round, times, every gap, this process's CPU time)
for exact percentiles.

  python3 -m locust -f bench/openai_locustfile.py --headless -u 4 -r 4 \
      --host http://127.0.0.1:8000 --run-time 120s --stop-timeout 60 --csv out \
      --model-name smollm2-135m-instruct-q4_1 --rounds 10 --max-tokens 32 --records out.jsonl
"""
import json
import random
import time

import gevent
import gevent.event
import requests
from locust import User, events, task
from locust.exception import StopUser


@events.init_command_line_parser.add_listener
def _(parser):
    parser.add_argument("--model-name", default="", help="the served model's id (\"model\" of each request)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of one request per user")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every request (ignore_eos)")
    parser.add_argument("--prompt-min", type=int, default=16, help="shortest prompt in tokens, BOS included")
    parser.add_argument("--prompt-max", type=int, default=48, help="longest prompt in tokens, BOS included")
    parser.add_argument("--vocab-lo", type=int, default=1000, help="lowest random prompt id")
    parser.add_argument("--vocab-hi", type=int, default=49152, help="random prompt ids stay below this")
    parser.add_argument("--bos-id", type=int, default=1, help="the model's BOS id (first prompt token)")
    parser.add_argument("--prompt-seed", type=int, default=1, help="seed of the prompts")
    parser.add_argument("--api-key", default="", help="sent as 'Authorization: Bearer' when not empty")
    parser.add_argument("--records", default="", help="write one JSON line per request here")


class Rounds:
    """All users start a round's request together; a round ends when every
    user's reply has ended (cooperative greenlets: no lock is needed)."""

    def __init__(self, users):
        self.users = users
        self.arrived = 0
        self.index = 0
        self.started_at = 0.0
        self.cpu_at_start = 0.0  # this process's CPU seconds when the round started
        self.release = gevent.event.Event()

    def wait(self):
        """Blocks until every user arrived; returns (the round's index,
        whether this user was the last to arrive)."""
        release, index = self.release, self.index
        self.arrived += 1
        if self.arrived == self.users:
            self.arrived = 0
            self.index += 1
            self.release = gevent.event.Event()
            self.started_at = time.perf_counter()
            self.cpu_at_start = time.process_time()
            release.set()
            return index, True
        release.wait()
        return index, False


_rounds = None
_records = None
_users_started = 0


@events.test_start.add_listener
def _(environment, **_kw):
    global _rounds, _records
    _rounds = Rounds(environment.parsed_options.num_users)
    if environment.parsed_options.records:
        _records = open(environment.parsed_options.records, "w")


@events.test_stop.add_listener
def _(environment, **_kw):
    if _records is not None:
        _records.flush()


class CompletionsUser(User):
    def on_start(self):
        global _users_started
        o = self.environment.parsed_options
        self.o = o
        self.session = requests.Session()
        self.headers = {"Content-Type": "application/json"}
        if o.api_key:
            self.headers["Authorization"] = f"Bearer {o.api_key}"
        self.rng = random.Random(o.prompt_seed * 1000003 + _users_started)
        _users_started += 1
        self.done = 0

    def prompt(self):
        n = self.rng.randint(self.o.prompt_min, self.o.prompt_max)
        return [self.o.bos_id] + [self.rng.randrange(self.o.vocab_lo, self.o.vocab_hi) for _ in range(n - 1)]

    @task
    def completion(self):
        if self.done == self.o.rounds:
            # The last round ended for everyone: the last user to see it quits the run.
            _, last = _rounds.wait()
            if last and self.environment.runner is not None:
                gevent.spawn_later(1.5, self.environment.runner.quit)  # the CSV writer flushes each second
            raise StopUser()
        index, _ = _rounds.wait()
        self.done += 1
        self.one_request(index)

    def fire(self, request_type, ms, length=0, exception=None):
        self.environment.events.request.fire(request_type=request_type, name="/v1/completions", response_time=ms,
                                             response_length=length, exception=exception, context={})

    def one_request(self, round_index):
        o = self.o
        prompt = self.prompt()
        body = {"model": o.model_name, "prompt": prompt, "max_tokens": o.max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        rec = {"round": round_index, "round_start": _rounds.started_at, "round_cpu_start": _rounds.cpu_at_start,
               "prompt_tokens_sent": len(prompt),
               "ttft_ms": None, "gaps_ms": [], "chunks": 0, "completion_tokens": None, "finish_reason": None,
               "error": None}
        start = time.perf_counter()
        rec["start"] = start
        last = None
        error = None
        try:
            with self.session.post(f"{self.environment.host}/v1/completions", json=body, headers=self.headers,
                                   stream=True, timeout=300) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
                for line in r.iter_lines(chunk_size=None):
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(f"error event: {json.dumps(event['error'])[:300]}")
                    if event.get("usage"):
                        rec["completion_tokens"] = event["usage"]["completion_tokens"]
                        rec["prompt_tokens"] = event["usage"]["prompt_tokens"]
                    for choice in event.get("choices", []):
                        if choice.get("finish_reason"):
                            rec["finish_reason"] = choice["finish_reason"]
                        if not choice.get("text"):
                            continue
                        now = time.perf_counter()
                        rec["chunks"] += 1
                        if last is None:
                            rec["ttft_ms"] = (now - start) * 1e3
                        else:
                            rec["gaps_ms"].append((now - last) * 1e3)
                        last = now
            if rec["completion_tokens"] is None:
                raise RuntimeError("the stream ended without a usage chunk")
            if rec["completion_tokens"] != o.max_tokens or rec["finish_reason"] != "length":
                raise RuntimeError(f"{rec['completion_tokens']} tokens, finish_reason {rec['finish_reason']}; "
                                   f"expected {o.max_tokens} and 'length' (ignore_eos)")
            if rec["ttft_ms"] is None:
                raise RuntimeError("no token was streamed")
        except Exception as e:  # noqa: BLE001 (every failure is reported as the request's)
            error = e
        end = time.perf_counter()
        rec["end"] = end
        rec["e2e_ms"] = (end - start) * 1e3
        rec["cpu_end"] = time.process_time()
        rec["error"] = None if error is None else str(error)
        self.fire("POST", rec["e2e_ms"], rec["completion_tokens"] or 0, error)
        if error is None:
            self.fire("TTFT", rec["ttft_ms"])
            for g in rec["gaps_ms"]:
                self.fire("ITL", g)
        if _records is not None:
            _records.write(json.dumps(rec) + "\n")
            _records.flush()
