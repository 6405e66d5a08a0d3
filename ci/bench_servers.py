"""Servers for the side-by-side benches (`overload_bench.py`, `long_prompt_bench.py`): start
orchestratord or llama.cpp's `llama-server` on a free loopback port with the same GGUF, slots,
context and threads, wait until it serves `/v1/models`, stop it."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

# the model name both servers answer to
MODEL = "bench"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, proc, limit=300, path="/v1/models"):
    deadline = time.time() + limit
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=2) as r:
                # a model list answers before its pool has loaded: wait until it lists one
                if r.status == 200 and (path != "/v1/models" or json.loads(r.read())["data"]):
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{base} not ready after {limit} s")


def start_orchd(binary, model, slots, ctx, threads, pool_extra="", extra="",
                ready_path="/v1/models"):
    """orchestratord with one pool; `pool_extra` and `extra` are more TOML for the pool and
    for the top level (tables after it); `ready_path` is polled until 200 (`/readyz` when
    keys are set). Returns (process, base URL)."""
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f'bind = "127.0.0.1:{port}"\n{extra}\n[[pools]]\nid = "default"\nmodel = "{model}"\n'
              f'alias = "{MODEL}"\nslots = {slots}\nctx = {ctx}\nthreads = {threads}\n{pool_extra}')
    cfg.close()
    # its task records go to a fresh file beside the config, not into the working tree
    env = dict(os.environ, ORCHD_RECORDS_PATH=cfg.name[: -len(".toml")] + ".records.sqlite3")
    proc = subprocess.Popen([binary, "--config", cfg.name], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, proc, path=ready_path)
    return proc, base


def start_llama(binary, model, slots, ctx, threads, extra_args=()):
    """`llama-server -np SLOTS -cb` with `ctx` per slot (`extra_args` after, e.g.
    `--embedding`). Returns (process, base URL)."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "-m", model, "-np", str(slots), "-cb", "-c", str(ctx * slots),
         "-t", str(threads), "--host", "127.0.0.1", "--port", str(port), *extra_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, proc)
    return proc, base


def cpu_of(pid):
    """CPU seconds (user + system) of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
