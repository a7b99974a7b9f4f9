"""A real uvicorn server in a thread on a free loopback port (for HTTP tests through sockets)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def live_server(app):
    """Serve ``app`` on ``127.0.0.1:<free port>``; yields the base URL, stops the server after."""
    import uvicorn

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        t.join(10)
