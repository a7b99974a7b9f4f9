"""A run folder's settings and invocations.

``run_key.json`` holds what must match for a folder to be resumed (and worker runs to be merged):
the suite collection, the row selection and the engine settings **as resolved**: the readout,
debiasing, calibration and dtype the engine actually used (``--readout auto`` on a trained model
is that model's readout; no ``--calibration`` is the calibration it ships with, identified by the
file's sha256), the same values ``run.json`` (``engine``) and ``report.md`` state. A folder written
before keys were resolved (no ``key_version``) holds the flags as given; it is compared with the
flags as given, so old folders resume as before, and its key is then rewritten resolved.

``run.json`` is written when an invocation starts (``status: running``) and updated as each
batch of predictions lands, so an interrupted invocation keeps its timing: the next invocation
lists it as ``interrupted`` with the requests it ran, and ``totals`` count every invocation.
A heartbeat rewrites it every :data:`HEARTBEAT_S` seconds and SIGTERM/SIGINT close it at the
signal, so an invocation's ``wall_s`` (and ``totals["wall_s"]``) include the batch a kill lost.

A run given no ``--output`` writes to :func:`default_output`, a folder named by its run key.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import signal
import threading
import time
from pathlib import Path

from noulengine.writes import OutputWriteError, write_text_atomic

KEY_VERSION = 2
# the fields a run_key.json had before it recorded resolved settings
LEGACY_KEY_FIELDS = ("suite", "model_sha256", "readout", "debias", "calibration", "dtype", "limit", "sample", "seed",
                     "tasks", "worker", "workers", "merged_workers")
# legacy keys held these as the flags gave them (None, "auto"), not as the engine resolved them
LEGACY_AS_GIVEN = ("readout", "calibration")
# fields added to the key later: a key without one ran without that setting (None), legacy or not
LATER_KEY_FIELDS = ("probe",)
# seconds between two heartbeats of a running invocation: a SIGKILL loses at most this much of its wall time
HEARTBEAT_S = 15.0


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread (:func:`sigterm_raises`) so that the invocation is
    recorded (``terminated``, its wall time to the signal) before the process exits 143."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (elsewhere, where
    no handler can be set, nothing changes); the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def file_sha256(path) -> str | None:
    """The sha256 of a file's bytes (None for no path or an unreadable one)."""
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def run_key(describe: dict, *, suite: str, limit, sample, seed, tasks=None, worker=None, workers=None,
            probe: str | None = None) -> dict:
    """The run key from the engine's :meth:`~noulengine.Engine.describe` (resolved settings).

    ``calibration`` is the path the engine read (as ``run.json`` says); ``calibration_sha256``
    identifies it, so the same file at another path (another checkout, another machine) matches.
    ``layout`` is part of the key when it is not ``state-first`` (schema-first prompts differ
    everywhere). ``probe`` (``--probe reverse``) is part of the key: its rows carry the probe's answers, so a
    folder made without it is refused for a probe run (and the other way round).
    """
    cal = describe.get("calibration")
    key = {"key_version": KEY_VERSION, "suite": suite, "model_sha256": (describe.get("model") or {}).get("sha256"),
           "readout": describe.get("readout"), "debias": describe.get("debias"),
           "calibration": str(cal) if cal else None, "calibration_sha256": file_sha256(cal),
           "symbols_fallback": bool((describe.get("config") or {}).get("symbols_fallback")),
           "dtype": describe.get("dtype"), "limit": limit, "sample": sample, "seed": seed, "probe": probe}
    if describe.get("layout", "state-first") != "state-first":
        # the prompt layout changes every prompt; state-first keys omit it, so folders written
        # before layouts existed keep matching
        key["layout"] = describe["layout"]
    if workers is not None:
        key.update({"tasks": tasks, "worker": worker, "workers": workers})
    return key


def default_output(key: dict, root: str | Path = "runs") -> Path:
    """The run folder of a run given no ``--output``: ``<root>/eval-<10 hex>``, a hash of its run
    key (:func:`run_key`), so two runs with different settings never meet in one folder and the
    same command resumes where it stopped.

    The hash leaves out ``worker`` (the workers of one sharded run share the folder, each in its
    ``worker-R/``) and the calibration's path (its sha256 is in the key).
    """
    ident = {k: v for k, v in key.items() if k not in ("worker", "calibration")}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return Path(root) / f"eval-{digest}"


def _same(field: str, a, b) -> bool:
    if field == "tasks" and a is not None and b is not None:
        return sorted(a) == sorted(b)  # the same suites in another order are the same rows
    return a == b


def key_differences(old: dict, new: dict, *, given: dict | None = None, fields=None,
                    names: tuple[str, str] = ("the folder's run", "this one")) -> list[str]:
    """What differs between two run keys, one ``"field: A has x, B has y"`` per field.

    Args:
        old, new: run keys (``old`` may be a legacy key, without ``key_version``).
        given: the flags as given (``readout``, ``calibration``), compared with a legacy key's
            values of those fields; None compares the resolved values.
        fields: the fields to compare (default: both keys' fields, so a worker's or a merged
            folder's share and worker count differ from a plain run's none).
        names: how the two sides are named in the messages.
    """
    legacy = old.get("key_version") is None or new.get("key_version") is None
    out = []
    for f in fields or list(new) + [k for k in old if k not in new]:
        if f == "key_version" or (legacy and f not in LEGACY_KEY_FIELDS + LATER_KEY_FIELDS):
            continue
        a, b = old.get(f), new.get(f)
        if legacy and given is not None and f in LEGACY_AS_GIVEN and old.get("key_version") is None:
            b = given.get(f)
        if f == "calibration" and not legacy:
            continue  # compared by its sha256 below: the path may differ
        if f == "calibration_sha256":
            if a != b:
                out.append(f"calibration: {names[0]} has {old.get('calibration')!r}"
                           f"{f' (sha256 {a[:12]})' if a else ''}, {names[1]} {new.get('calibration')!r}"
                           f"{f' (sha256 {b[:12]})' if b else ''}")
            continue
        if not _same(f, a, b):
            out.append(f"{f}: {names[0]} has {a!r}, {names[1]} {b!r}")
    return out


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON through a temporary file and a rename: a kill never leaves half a file.

    Raises:
        OutputWriteError: the write failed (:func:`noulengine.writes.write_text_atomic`).
    """
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n")


def read_run_json(path: Path) -> dict:
    try:
        old = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return old if isinstance(old, dict) else {}


def previous_invocations(run: dict) -> list[dict]:
    """The invocations an earlier ``run.json`` records; one still marked ``running`` was
    interrupted (this invocation runs now), so it is marked ``interrupted``.

    A ``run.json`` written before invocations were recorded yields its single ``throughput``.
    """
    if isinstance(run.get("invocations"), list):
        return [{**inv, "status": "interrupted"} if inv.get("status") == "running" else inv
                for inv in run["invocations"]]
    if isinstance(run.get("throughput"), dict):
        return [{"started": None, "git_revision": run.get("git_revision"), "wall_s": run.get("wall_s"),
                 "model_load_s": run.get("model_load_s"), "throughput": run["throughput"]}]
    return []


class InvocationLog:
    """This invocation's entry in ``run.json``: written when it starts, updated as batches land.

    Args:
        path: the run folder's ``run.json``.
        meta: what is known at the start (suite, engine, versions, selection, threads, command...).
        invocation: this invocation's entry (``started``, ``git_revision``, ``model_load_s``...).
        min_interval_s: the least time between two progress writes (default 0: every batch).
        rows_on_disk: the prediction rows already in the folder. When the earlier invocations
            recorded fewer (one killed right after a batch landed, or stopped by a write error,
            could not update run.json for its last batch), the last of them that did not finish is
            credited with the difference (``requests_counted_from_predictions``) and with their
            time (``inference_seconds_counted_from_predictions``, see :func:`_reconcile`), so the
            totals count the rows written and the time that wrote them.
        predictions: the prediction rows already in the folder, in file order (``rows_on_disk``
            is then their number): the time credited to unrecorded rows is read from them.
    """

    def __init__(self, path: Path, meta: dict, invocation: dict, *, min_interval_s: float = 0.0,
                 rows_on_disk: int | None = None, predictions: list[dict] | None = None):
        from noulengine.eval.report import throughput

        self._throughput = throughput
        self.path = Path(path)
        old = read_run_json(self.path)
        self.previous = previous_invocations(old)
        if predictions is not None:
            rows_on_disk = len(predictions)
        if rows_on_disk is not None:
            _reconcile(self.previous, rows_on_disk, predictions)
        # a resumed folder keeps what its last complete run.json said (suite pins, tasks) until
        # this invocation replaces it
        self.base = {**{k: v for k, v in old.items() if k not in ("invocations", "totals", "status")}, **meta}
        self.invocation = {**invocation, "status": "running", "wall_s": 0.0, "throughput": throughput([])}
        self.t0 = time.perf_counter()
        self.results: list = []
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._lock = threading.Lock()  # the heartbeat thread writes run.json too
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def invocations(self) -> list[dict]:
        return self.previous + [self.invocation]

    def update(self, results, *, force: bool = False) -> None:
        """Record the requests run so far (``results``: the runner's TaskResults) and write run.json."""
        with self._lock:
            self.results = results
            self.invocation["throughput"] = self._throughput(results)
            self.invocation["wall_s"] = time.perf_counter() - self.t0
            # the wall time when the rows recorded so far had landed: what a kill after the next
            # batch lands leaves unrecorded runs from here (_reconcile)
            self.invocation["recorded_wall_s"] = self.invocation["wall_s"]
            now = time.perf_counter()
            if not force and now - self._last_write < self.min_interval_s:
                return
            self._last_write = now
            self._write("running")

    def _write(self, status: str) -> None:
        from noulengine.eval.report import invocation_totals

        invs = self.invocations()
        write_json_atomic(self.path, {**self.base, "status": status, "invocations": invs,
                                      "totals": invocation_totals(invs)})

    def start_heartbeat(self, interval_s: float | None = None) -> None:
        """Rewrite run.json every ``interval_s`` (default :data:`HEARTBEAT_S`) with this
        invocation's wall time so far and ``heartbeat`` (UTC), from a daemon thread, until
        :meth:`finish`: a kill that no handler sees (SIGKILL, power) loses at most one interval of
        wall time, where without it the time since the last landed batch was lost."""
        interval = HEARTBEAT_S if interval_s is None else interval_s

        def beat():
            while not self._stop.wait(interval):
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.invocation["wall_s"] = time.perf_counter() - self.t0
                    self.invocation["heartbeat"] = _utc_now()
                    try:
                        self._write("running")
                    except OutputWriteError:  # a full disk: the main thread reports it; beat again later
                        pass

        self._heartbeat = threading.Thread(target=beat, name="run.json heartbeat", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat (it writes nothing more); safe to call more than once."""
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join()

    def finish(self, results, status: str = "finished") -> list[dict]:
        """Close this invocation; returns every invocation (for the final run.json, which the
        caller writes with the run's metrics)."""
        self.stop_heartbeat()
        self.invocation["throughput"] = self._throughput(results)
        self.invocation["wall_s"] = time.perf_counter() - self.t0
        self.invocation["status"] = status
        return self.invocations()

    def close(self, status: str) -> None:
        """End an invocation that will write no metrics (``failed``, ``interrupted``,
        ``terminated``): record it, with what it ran and its wall time to now, in run.json now."""
        self.finish(self.results, status)
        self.invocation["ended"] = _utc_now()
        self._write(status)


def _reconcile(invocations: list[dict], rows_on_disk: int, predictions: list[dict] | None = None) -> None:
    """Credit rows that landed without being recorded to the last unfinished invocation (in place).

    The rows are its last batch (killed, or stopped by a write error, after the batch landed and
    before run.json recorded it); their time is credited to its ``inference_seconds`` too, so its
    rate is not overstated: the larger of the wall time it ran after its last record (to its last
    heartbeat or its close) and the longest ``latency_s`` among those rows (a batch lasts at least as
    long as any request in it; read from ``predictions``, the rows in file order, the unrecorded
    ones last). ``decisions_per_s`` and ``tokens_per_s`` stay what it recorded.
    """
    recorded = sum((i.get("throughput") or {}).get("requests") or 0 for i in invocations)
    missing = rows_on_disk - recorded
    if missing <= 0:
        return
    unfinished = [i for i in invocations if i.get("status") != "finished"]
    if not unfinished:
        return  # every invocation finished: the rows came from elsewhere (a merge, a copied file)
    last = unfinished[-1]
    t = dict(last.get("throughput") or {})
    t["requests"] = (t.get("requests") or 0) + missing
    wall, at = last.get("wall_s"), last.get("recorded_wall_s")
    gap = wall - at if isinstance(wall, (int, float)) and isinstance(at, (int, float)) else 0.0
    unrecorded = (predictions or [])[-missing:]
    longest = max((r["latency_s"] for r in unrecorded
                   if isinstance(r, dict) and isinstance(r.get("latency_s"), (int, float))), default=0.0)
    extra = max(gap, longest, 0.0)
    if extra > 0:
        t["inference_seconds"] = (t.get("inference_seconds") or 0.0) + extra
        last["inference_seconds_counted_from_predictions"] = extra
    if t.get("inference_seconds"):  # the rate over the rows it wrote; decisions and tokens stay what it recorded
        t["requests_per_s"] = t["requests"] / t["inference_seconds"]
    last["throughput"] = t
    last["requests_counted_from_predictions"] = missing


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
