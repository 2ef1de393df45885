"""Starting and stopping a `decoded` daemon for the benchmarks that measure
through gRPC (bench/run_batch_bench.py, bench/run_burst_bench.py)."""
import contextlib
import os
import socket
import subprocess
import tempfile
import time


def cpu_model_name():
    """lscpu's "Model name" (the host CPU as the figures should name it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def free_port():
    """A TCP port free on 127.0.0.1 now (the daemon binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_daemon(build, model, flags):
    """Starts build/server/decoded --model=`model` on a free port with `flags`
    (a list of "--name=value"), waits for its health check to answer SERVING
    and yields (address, log_tail) where log_tail() returns the end of its log;
    stops it (SIGTERM: it drains) on exit."""
    addr = f"127.0.0.1:{free_port()}"
    # The daemon's log goes to a file, not a pipe nobody reads while it runs.
    log = tempfile.TemporaryFile(mode="w+")
    daemon = subprocess.Popen([os.path.join(build, "server", "decoded"), f"--model={model}", f"--listen={addr}",
                               "--metrics_listen="] + list(flags),
                              stdout=log, stderr=subprocess.STDOUT)

    def log_tail():
        log.seek(0)
        return log.read()[-2000:]

    try:
        cli = os.path.join(build, "client", "decoded-cli")
        deadline = time.monotonic() + 180
        while True:
            if daemon.poll() is not None:
                raise RuntimeError(f"decoded exited with {daemon.returncode}: {log_tail()}")
            if subprocess.run([cli, f"--server={addr}", "--health", "--health_timeout_seconds=2"],
                              capture_output=True).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"decoded did not report SERVING within 180 s: {log_tail()}")
            time.sleep(0.5)
        yield addr, log_tail
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
