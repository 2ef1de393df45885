"""The workload of bench/prefix_bench.cc against llama.cpp's own server
(`llama-server`, built by tools/install_llama_cpp.sh --server), for
bench/run_prefix_bench.py: the same sessions, ids and turns, sent the way its
clients send them: each turn a POST /completion with the whole conversation so
far as token ids (`cache_prompt`: the slot keeps what it already holds),
greedy, `ignore_eos`, streamed.

Reported as prefix_bench reports (one dict): prefilled_tokens is the sum of
llama-server's timings.prompt_n (prompt tokens it computed), cached_tokens the
first turns' timings.cache_n (prompt tokens it reused)."""
import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.request

from daemon import free_port


def ids(vocab, n, seed):
    """prefix_bench.cc's Ids(): `n` ids spread over the vocabulary."""
    spread = max(1, min(50000, vocab - 1000))
    return [(1000 + (i * 7919 + seed * 104729) % spread) % vocab for i in range(n)]


def vocab_and_bos(model):
    """The GGUF's vocabulary size and BOS id (the gguf package's reader)."""
    import gguf  # noqa: PLC0415 (only this path needs it)
    r = gguf.GGUFReader(model)
    tokens = r.fields["tokenizer.ggml.tokens"]
    bos = r.fields.get("tokenizer.ggml.bos_token_id")
    return len(tokens.data), (int(bos.parts[bos.data[0]][0]) if bos is not None else 0)


@contextlib.contextmanager
def running_llama_server(binary, model, threads, slots, context):
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                             "-tb", str(threads), "-np", str(slots), "-c", str(context), "--no-webui"],
                            stdout=log, stderr=subprocess.STDOUT)

    def log_tail():
        log.seek(0)
        return log.read()[-3000:]

    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}: {log_tail()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not healthy within 180 s: {log_tail()}")
            time.sleep(0.5)
        yield url, log_tail
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def completion(url, prompt, new_tokens):
    """One streamed greedy completion: (ttft_ms, generated ids, final chunk)."""
    body = json.dumps({"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "cache_prompt": True,
                       "ignore_eos": True, "stream": True, "return_tokens": True}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    ttft, generated, last = None, [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            toks = chunk.get("tokens") or []
            if toks and ttft is None:
                ttft = (time.monotonic() - start) * 1000
            generated += toks
            if chunk.get("stop"):
                last = chunk
                break
    return ttft or 0.0, generated, last


def run(url, vocab, bos, sessions, system_tokens, user_tokens, turns, new_tokens, salt):
    system = [bos] + ids(vocab, system_tokens, salt * 1000003)
    results = [[None] * turns for _ in range(sessions)]
    errors = [None] * sessions
    barrier = threading.Barrier(sessions + 1)

    def session(s):
        history = []
        barrier.wait()
        try:
            for t in range(turns):
                history += (system if t == 0 else []) + ids(vocab, user_tokens, salt * 7777 + s * 97 + t + 1)
                ttft, generated, last = completion(url, history, new_tokens)
                if last is None or len(generated) != new_tokens:
                    raise RuntimeError(f"turn {t}: {len(generated)} tokens, final chunk {last}")
                history += generated
                results[s][t] = (ttft, last["timings"])
        except Exception as e:  # noqa: BLE001 (reported per session)
            errors[s] = repr(e)

    threads = [threading.Thread(target=session, args=(s,)) for s in range(sessions)]
    for th in threads:
        th.start()
    began = time.monotonic()
    barrier.wait()
    for th in threads:
        th.join()
    wall = time.monotonic() - began
    if any(errors):
        raise RuntimeError(f"llama-server sessions failed: {[e for e in errors if e]}")
    first = sorted(results[s][0][0] for s in range(sessions))
    generated = sessions * turns * new_tokens
    return {"sessions": sessions, "turns": turns, "system_tokens": system_tokens, "user_tokens": user_tokens,
            "new_tokens": new_tokens, "wall_s": wall, "generated_tokens": generated,
            "aggregate_tok_s": generated / wall,
            "prefilled_tokens": sum(r[1]["prompt_n"] for row in results for r in row),
            "cached_tokens": sum(results[s][0][1].get("cache_n", 0) for s in range(sessions)),
            "first_ttft_ms_p50": first[len(first) // 2],
            "first_ttft_ms_p99": first[min(len(first) - 1, int(len(first) * 0.99))]}


def llama_server_binary():
    """tools/install_llama_cpp.sh --server's binary, or None."""
    out = subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                       "install_llama_cpp.sh"), "--server-path"], capture_output=True, text=True)
    path = out.stdout.strip()
    return path if out.returncode == 0 and os.path.exists(path) else None
