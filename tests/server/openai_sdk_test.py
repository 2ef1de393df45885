#!/usr/bin/env python3
"""The OpenAI API checked with clients nobody here wrote: the official
`openai` Python SDK (PyPI) and `curl -N` (raw SSE) against build/server/decoded
--http_listen, on SmolLM2-135M-Instruct (it has a chat template; the default
Gemma 3 270M is a base model without one); the SDK over HTTPS too.

  python3 tests/server/openai_sdk_test.py BUILD_DIR

Model: $DECODED_SMOLLM2_PATH (default ~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf);
missing, the test is skipped (exit 77) unless DECODED_REQUIRE_MODEL=1.
"""
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

BUILD = sys.argv.pop(1) if len(sys.argv) > 1 else "build"
MODEL = os.environ.get("DECODED_SMOLLM2_PATH",
                       os.path.expanduser("~/.cache/decoded/smollm2-135m-instruct-q4_1.gguf"))
TOKEN = "sdk-test-token"
# The self-signed pair for localhost and 127.0.0.1 the gRPC TLS test uses.
TLS_CERT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tls_test_cert.pem")
TLS_KEY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tls_test_key.pem")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """build/server/decoded on MODEL; with tls, HTTPS (and gRPC TLS) from --tls_cert/--tls_key."""

    def __init__(self, tls=False):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")
        flags = [f"--tls_cert={TLS_CERT}", f"--tls_key={TLS_KEY}"] if tls else []
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "server", "decoded"), f"--model={MODEL}", "--listen=127.0.0.1:0",
             "--metrics_listen=", f"--http_listen=127.0.0.1:{self.port}", "--threads=2",
             "--context_length=512", f"--auth_token={TOKEN}"] + flags,
            stdout=self.log, stderr=subprocess.STDOUT)
        scheme = "https" if tls else "http"
        context = ssl.create_default_context(cafile=TLS_CERT) if tls else None
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"decoded exited: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health", timeout=2,
                                            context=context) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"decoded not healthy in 300 s: {self.tail()}")
            time.sleep(0.2)

    def tail(self):
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


class OpenAiSdkTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        import openai  # noqa: F401  (installed by scripts/test.sh)
        cls.daemon = Daemon()
        cls.openai = openai
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.daemon.port}/v1", api_key=TOKEN,
                                   max_retries=0, timeout=300)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            cls.daemon.stop()

    def chat(self, **kw):
        args = dict(model=self.model, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=12,
                    temperature=0)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def test_models_lists_the_served_model(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, os.path.basename(MODEL)[:-len(".gguf")])
        self.assertEqual(self.client.models.retrieve(self.model).id, self.model)

    def test_chat_streamed_equals_whole(self):
        whole = self.chat()
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(whole.usage.prompt_tokens, 0)
        self.assertEqual(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens)
        text, usage, finish = "", None, None
        for chunk in self.chat(stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_chat_logprobs(self):
        r = self.chat(logprobs=True, top_logprobs=3, max_tokens=4)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)

    def test_completion_stop_sequence(self):
        whole = self.client.completions.create(model=self.model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
        text = whole.choices[0].text
        self.assertEqual(whole.object, "text_completion")
        # Stop at the first comma the model writes: the text ends before it.
        self.assertIn(",", text)
        cut = self.client.completions.create(model=self.model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                                             stop=[","])
        self.assertEqual(cut.choices[0].finish_reason, "stop")
        self.assertEqual(cut.choices[0].text, text[:text.index(",")])

    def test_seeded_sampling_repeats(self):
        a = self.chat(temperature=1.0, seed=1234, max_tokens=8).choices[0].message.content
        b = self.chat(temperature=1.0, seed=1234, max_tokens=8).choices[0].message.content
        self.assertEqual(a, b)

    def test_errors_map_to_the_sdks_exceptions(self):
        with self.assertRaises(self.openai.NotFoundError):
            self.client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)
        with self.assertRaises(self.openai.BadRequestError) as bad:
            self.client.completions.create(model=self.model, prompt="x", max_tokens=1, temperature=7)
        self.assertEqual(bad.exception.body.get("param"), "temperature")
        with self.assertRaises(self.openai.BadRequestError):
            self.chat(n=2)
        anonymous = self.openai.OpenAI(base_url=f"http://127.0.0.1:{self.daemon.port}/v1", api_key="wrong",
                                       max_retries=0)
        with self.assertRaises(self.openai.AuthenticationError):
            anonymous.models.list()

    def test_curl_streams_raw_sse(self):
        # curl -N, the raw events: "data: <chunk>" blocks, "data: [DONE]" last;
        # their text is the whole reply's.
        body = {"model": self.model, "messages": [{"role": "user", "content": "Name three colors."}],
                "max_tokens": 12, "temperature": 0, "stream": True}
        out = subprocess.run(
            ["curl", "-sSN", "--fail-with-body", f"http://127.0.0.1:{self.daemon.port}/v1/chat/completions",
             "-H", f"Authorization: Bearer {TOKEN}", "-H", "Content-Type: application/json",
             "-d", json.dumps(body)], capture_output=True, text=True, timeout=300, check=True).stdout
        self.assertTrue(out.endswith("\n\n"), out[-200:])
        blocks = out.split("\n\n")[:-1]
        self.assertTrue(all(b.startswith("data: ") for b in blocks), blocks[:3])
        self.assertEqual(blocks[-1], "data: [DONE]")
        text = "".join(c["delta"].get("content") or "" for b in blocks[:-1]
                       for c in json.loads(b[len("data: "):])["choices"])
        self.assertEqual(text, self.chat().choices[0].message.content)

    def test_a_repeated_conversation_reuses_cached_kv(self):
        # The OpenAI way: every request sends the whole conversation. The
        # second request's prompt starts with the first one's: its full KV
        # blocks come from the prefix cache.
        history = [{"role": "system", "content": "You are a helpful assistant. " * 8},
                   {"role": "user", "content": "Say hello."}]
        first = self.chat(messages=history, max_tokens=6)
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "Again."}]
        second = self.chat(messages=history, max_tokens=6)
        self.assertGreater(second.usage.prompt_tokens_details.cached_tokens, 16)


class OpenAiSdkTlsTest(unittest.TestCase):
    """--tls_cert/--tls_key serve the HTTP door as HTTPS: the SDK, trusting
    only the test certificate, streams a chat reply; plaintext gets nothing."""

    @classmethod
    def setUpClass(cls):
        import openai
        cls.openai = openai
        cls.daemon = Daemon(tls=True)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def client(self, scheme, verify):
        return self.openai.OpenAI(base_url=f"{scheme}://127.0.0.1:{self.daemon.port}/v1", api_key=TOKEN,
                                  max_retries=0, timeout=300,
                                  http_client=self.openai.DefaultHttpxClient(verify=verify))

    def test_a_chat_streams_over_https(self):
        client = self.client("https", ssl.create_default_context(cafile=TLS_CERT))
        model = client.models.list().data[0].id
        text, finish = "", None
        for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi."}],
                                                    max_tokens=6, temperature=0, stream=True):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertTrue(text)
        self.assertIn(finish, ("stop", "length"))

    def test_plaintext_and_untrusted_clients_are_refused(self):
        with self.assertRaises(self.openai.APIConnectionError):
            self.client("http", True).models.list()
        # The system's trust store does not hold the self-signed certificate.
        with self.assertRaises(self.openai.APIConnectionError):
            self.client("https", True).models.list()


if __name__ == "__main__":
    if not os.path.exists(MODEL):
        if os.environ.get("DECODED_REQUIRE_MODEL") == "1":
            print(f"model missing at {MODEL}", file=sys.stderr)
            sys.exit(1)
        print(f"skipped: model missing at {MODEL}", file=sys.stderr)
        sys.exit(77)
    try:
        import openai  # noqa: F401
    except ImportError:
        print("the openai package is missing (scripts/test.sh installs it)", file=sys.stderr)
        sys.exit(1)
    unittest.main(verbosity=2)
