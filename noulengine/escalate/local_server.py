"""A local OpenAI-compatible LLM for escalation: llama.cpp's server (llama-cpp-python) on a GGUF.

Used by the tests and ``experiments/escalation_thresholds.py``; a user points ``--escalate-url`` at
their own endpoint instead. Needs the ``llm`` extra (``llama-cpp-python[server]``, built from
source: about 9 minutes on a 2-core CPU, once; ``bash scripts/setup.sh --llm``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


class LocalServerError(RuntimeError):
    """llama.cpp's server is not installed, or did not come up (its log tail is in the message)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound, read and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(gguf: str | os.PathLike | None = None, *, port: int | None = None, threads: int = 1,
                 n_ctx: int = 4096, startup_timeout_s: float = 120.0):
    """Run ``python -m llama_cpp.server`` on ``gguf`` (default: the embedded
    SmolLM2-135M-Instruct Q4_1 GGUF, with its own chat template) and yield its base URL
    (``http://127.0.0.1:PORT/v1``); the process is stopped on exit.

    Args:
        threads: llama.cpp CPU threads (``--n_threads``).
        n_ctx: context length in tokens.

    Raises:
        LocalServerError: llama-cpp-python is missing, or the server did not answer
            ``GET /v1/models`` within ``startup_timeout_s`` seconds.
    """
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalServerError("llama-cpp-python is not installed: bash scripts/setup.sh --llm "
                               "(or pip install 'noulengine[llm]'; it builds from source)")
    if gguf is None:
        # an instruction-tuned model with a chat template, whichever base the default decision
        # model has (the Gemma 3 270M base, for one, has neither)
        from noulengine.models.embedded import SMOLLM2

        gguf = SMOLLM2.gguf_path()
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), "--n_threads", str(threads), "--n_ctx", str(n_ctx), "--verbose", "False"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise LocalServerError(f"llama.cpp server exited with {proc.returncode}: {_tail(log.name)}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LocalServerError(f"llama.cpp server did not answer within {startup_timeout_s:g} s: "
                                       f"{_tail(log.name)}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        Path(log.name).unlink(missing_ok=True)


def _tail(path: str, n: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
