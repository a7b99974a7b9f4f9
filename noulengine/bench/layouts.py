"""``noulengine bench --layouts``: the two prompt layouts, warm and cold, interleaved in one run.

For each workload and each layout (``state-first``, ``schema-first``; issue #32), the same
requests run in two modes on the same weights:

* ``warm`` (steady state): the prefix store holds the workload's static prefix (its questions,
  prefilled by one untimed request on another state, as a server that has served the workload
  before holds it) and nothing else: every timed request's own state is new;
* ``cold``: every request's questions are new (each field renamed per request), the store emptied
  of all but the pinned frame head before the run: no request can reuse another's schema.

Variants run interleaved, rotating their order every repetition, so machine-load drift hits all
alike; the median of the repetitions is reported. On ``agnews_1q`` the peer library (anyjev,
:mod:`noulengine.bench.peer`) runs on the same weights and rows, and accuracies against the gold
labels are reported for every variant (a faster variant that answers worse is not a win).

Units: seconds (``time.perf_counter``, CUDA synchronised), decisions per second, prompt tokens;
``hit_rate`` is the prefix store's token hit rate during the timed run (vLLM's definition:
tokens served from the cache / prompt tokens looked up).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from noulengine.records.schema import Question, Request

LAYOUT_NAMES = ("state-first", "schema-first")
LAYOUT_WORKLOADS = ("agnews_1q", "typed_decisions", "tickets_3q")
MODES = ("warm", "cold")

# The README's ticket questions (route, urgency, refund): a three-question workload of the kind
# users run (routing, triage, a yes/no check) on many items.
TICKET_QUESTIONS = (
    Question(field="route", type="choice", instructions="Which team handles this?",
             labels=("billing", "shipping", "tech"),
             descriptions=("Payments and refunds", "Delivery problems", "Website or app errors")),
    Question(field="urgency", type="score", instructions="How urgent?", labels=("0", "1", "2"),
             descriptions=("can wait", "this week", "today")),
    Question(field="refund", type="noul", instructions="Does the customer ask for money back?",
             labels=("no", "yes"), descriptions=(None, None)),
)


@dataclasses.dataclass
class LayoutWorkload:
    """Requests with one fixed set of questions; ``golds`` (field -> label per request) when known."""

    name: str
    note: str
    requests: list[Request]
    golds: list[dict[str, str]] | None = None
    peer: bool = False


def layout_workloads(quick: bool, names=LAYOUT_WORKLOADS) -> list[LayoutWorkload]:
    """The layout bench's workloads (real rows from the shared data folder).

    * ``agnews_1q``: AG News test rows (the variant bench's shuffle), one 4-option question;
    * ``typed_decisions``: Typed-Decisions test states of one workflow (the first workflow's
      questions: 5 per state), so the questions repeat as in a real deployment;
    * ``tickets_3q``: the README's three ticket questions on AG News test texts used as ticket
      bodies (a speed workload: no gold labels).
    """
    from noulengine.bench.workloads import _records, agnews_rows

    n_ag, n_typed, n_tickets = (24, 8, 12) if quick else (120, 40, 60)
    out = []
    if "agnews_1q" in names:
        rows = agnews_rows(n_ag)
        out.append(LayoutWorkload("agnews_1q", f"{n_ag} AG News test rows, 1 question (4 options)",
                                  [r.request for r in rows], [{f: t.label for f, t in r.targets.items()} for r in rows],
                                  peer=True))
    if "typed_decisions" in names:
        recs = _records("typed_decisions/test.jsonl")
        first = recs[0].request.questions
        same = [r for r in recs if r.request.questions == first][:n_typed]
        out.append(LayoutWorkload("typed_decisions",
                                  f"{len(same)} Typed-Decisions test states of one workflow, {len(first)} questions each",
                                  [r.request for r in same],
                                  [{f: t.label for f, t in r.targets.items()} for r in same]))
    if "tickets_3q" in names:
        states = [r.request.state for r in agnews_rows(n_ag + n_tickets)[n_ag:]]
        texts = [s.get("text", s) if isinstance(s, dict) else s for s in states]
        out.append(LayoutWorkload("tickets_3q", f"{n_tickets} texts, the README's 3 ticket questions (speed only)",
                                  [Request(state={"ticket": t},
                                           questions=TICKET_QUESTIONS, id=f"ticket{i}") for i, t in enumerate(texts)]))
    return out


def cold_request(req: Request, i: int) -> Request:
    """``req`` with every field renamed for request ``i``: a schema no other request shares."""
    return dataclasses.replace(req, questions=tuple(dataclasses.replace(q, field=f"{q.field}_c{i}")
                                                    for q in req.questions))


def _accuracy(decisions, golds, cold: bool) -> float | None:
    if golds is None:
        return None
    hits = total = 0
    for i, (d, gold) in enumerate(zip(decisions, golds)):
        for fld, label in gold.items():
            ans = d.answers.get(f"{fld}_c{i}" if cold else fld)
            if ans is not None:
                total += 1
                hits += ans.label == label
    return hits / total if total else None


def _timed_engine_run(engine, requests: list[Request], warmup: Request | None, sync) -> tuple[float, list, dict]:
    engine.reset_prefix_cache(keep_head=True)  # and its admission memory: a cold run remembers no schema
    store = engine.prefix_store
    if warmup is not None:
        engine.decide(warmup)  # untimed: the schema (seen, then stored on its second sighting below)
        engine.decide(warmup)
    before = (store.stats.query_tokens, store.stats.hit_tokens) if store is not None else (0, 0)
    sync()
    t0 = time.perf_counter()
    decisions = engine.decide_batch(requests, on_error="raise")
    sync()
    dt = time.perf_counter() - t0
    stats = {}
    if store is not None:
        queried, hit = store.stats.query_tokens - before[0], store.stats.hit_tokens - before[1]
        stats = {"hit_rate": hit / queried if queried else 0.0, "hit_tokens": hit, "query_tokens": queried}
    return dt, decisions, stats


def measure_layouts(engines: dict, wl: LayoutWorkload, *, reps: int, sync, peer=None, progress=print) -> dict:
    """Time every (layout, mode) variant of ``wl`` (and the peer where it applies), interleaved.

    Args:
        engines: layout name -> :class:`~noulengine.Engine` (the same weights).
        reps: timed repetitions of each variant (the median is reported).
        sync: a callable that waits for the device (CUDA synchronise; a no-op on CPU).
        peer: a :class:`~noulengine.bench.peer.Peer` or None.
        progress: called with one line per variant and repetition.

    Returns:
        ``{"name", "note", "requests", "decisions", "variants": {"<layout>/<mode>" | "peer": {...}},
        "ratios": {...}}``: per variant ``seconds_median``, ``decisions_per_s``, ``tokens_per_request``,
        ``hit_rate``, ``accuracy``.
    """
    n_dec = sum(len(r.questions) for r in wl.requests)
    cold = [cold_request(r, i) for i, r in enumerate(wl.requests)]
    warmup = {layout: dataclasses.replace(wl.requests[0], state="(warm-up: another state)", id="warmup")
              for layout in engines}
    variants = [f"{layout}/{mode}" for layout in engines for mode in MODES]
    if peer is not None and wl.peer:
        variants.append("peer")
    times: dict[str, list[float]] = {v: [] for v in variants}
    results: dict[str, dict] = {v: {} for v in variants}
    for rep in range(reps):
        k = rep % len(variants)
        for v in variants[k:] + variants[:k]:
            if v == "peer":
                sync()
                t0 = time.perf_counter()
                answers, _ = peer.run(wl.requests)
                sync()
                dt = time.perf_counter() - t0
                hits = [max(range(len(p)), key=p.__getitem__) for row in answers for p in row]
                labels = [q.labels for r in wl.requests for q in r.questions]
                golds = [g for gold in (wl.golds or []) for g in gold.values()]
                results[v] = {"accuracy": (sum(lab[h] == g for lab, h, g in zip(labels, hits, golds)) / len(golds)
                                           if golds else None)}
            else:
                layout, mode = v.split("/")
                engine = engines[layout]
                reqs = wl.requests if mode == "warm" else cold
                dt, decisions, stats = _timed_engine_run(engine, reqs, warmup[layout] if mode == "warm" else None,
                                                         sync)
                tokens = sum(engine.compile(r).input_tokens for r in reqs)
                results[v] = {"tokens_per_request": tokens / len(reqs), **stats,
                              "accuracy": _accuracy(decisions, wl.golds, mode == "cold")}
            times[v].append(dt)
            progress(f"bench --layouts: {wl.name} {v} rep {rep + 1}/{reps}: {n_dec / dt:.2f} decisions/s")
    out = {"name": wl.name, "note": wl.note, "requests": len(wl.requests), "decisions": n_dec, "reps": reps,
           "variants": {}}
    for v in variants:
        t = statistics.median(times[v])
        out["variants"][v] = {"seconds_median": t, "seconds_all": times[v], "decisions_per_s": n_dec / t,
                              **results[v]}
    e = out["variants"]
    ratios = {}
    for mode in MODES:
        a, b = e.get(f"schema-first/{mode}"), e.get(f"state-first/{mode}")
        if a and b:
            ratios[f"schema_vs_state_{mode}"] = a["decisions_per_s"] / b["decisions_per_s"]
    if "peer" in e:
        for layout in engines:
            ratios[f"{layout}_warm_vs_peer"] = e[f"{layout}/warm"]["decisions_per_s"] / e["peer"]["decisions_per_s"]
    out["ratios"] = ratios
    return out


def layouts_markdown(result: dict) -> str:
    """The layout bench's table (one row per workload and variant)."""
    lines = [f"Layout bench: model {result['model']} ({result['weights']}), device {result['device']}, "
             f"dtype {result['dtype']}, {result['threads']} threads, {result['reps']} reps (median), "
             f"code {result['git_revision']}.", "",
             "| workload | variant | decisions/s | tokens/request | prefix-cache hit rate | accuracy |",
             "|---|---|---|---|---|---|"]
    for w in result["workloads"]:
        for v, r in w["variants"].items():
            tok = f"{r['tokens_per_request']:.0f}" if "tokens_per_request" in r else "-"
            hit = f"{r['hit_rate']:.1%}" if r.get("hit_rate") is not None else "-"
            acc = f"{r['accuracy']:.1%}" if r.get("accuracy") is not None else "-"
            lines.append(f"| {w['name']} | {v} | {r['decisions_per_s']:.2f} | {tok} | {hit} | {acc} |")
        if w["ratios"]:
            lines.append(f"| {w['name']} | ratios | " + ", ".join(f"{k} {x:.2f}x" for k, x in w["ratios"].items())
                         + " | | | |")
    return "\n".join(lines)


def run_layouts(args, engine, weights: str, threads_source: str) -> int:
    """``noulengine bench --layouts``: both layouts on ``engine``'s weights; writes JSON and Markdown."""
    import json
    from pathlib import Path

    import torch

    from noulengine import Engine
    from noulengine.eval.report import git_revision

    device = engine.runner.device

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    engines = {}
    for layout in LAYOUT_NAMES:
        config = dataclasses.replace(engine.config, layout=layout)
        engines[layout] = Engine(engine.runner.model, engine.tokenizer, config, identity=engine.identity,
                                 temperatures=engine.calibration)
    from noulengine.bench.peer import start_peer

    peer, _, refused = start_peer(args.peer, engine)
    if refused:
        return 2
    wanted = [w.strip() for w in (args.workloads or "").split(",") if w.strip()] or list(LAYOUT_WORKLOADS)
    unknown = sorted(set(wanted) - set(LAYOUT_WORKLOADS))
    if unknown:
        print(f"bench: unknown layout workloads {unknown}; choose from {list(LAYOUT_WORKLOADS)}")
        return 2
    reps = args.reps or (1 if args.quick else 3)
    t_start = time.perf_counter()
    result = {"model": args.model or "default", "model_config": args.model_config, "weights": weights,
              "device": str(device), "dtype": str(engine.runner.dtype).replace("torch.", ""),
              "threads": torch.get_num_threads(), "threads_source": threads_source, "reps": reps,
              "git_revision": git_revision(), "torch": torch.__version__,
              "peer_version": getattr(peer, "version", None), "workloads": []}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    for wl in layout_workloads(args.quick, wanted):
        print(f"bench --layouts: {wl.name} ({wl.note}) ...", flush=True)
        result["workloads"].append(measure_layouts(engines, wl, reps=reps, sync=sync, peer=peer,
                                                   progress=lambda line: print(line, flush=True)))
        out.write_text(json.dumps(result, indent=2))  # partial results survive a kill
    if peer is not None:
        peer.close()
    result["wall_seconds"] = time.perf_counter() - t_start
    out.write_text(json.dumps(result, indent=2))
    table = layouts_markdown(result)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"bench: wrote {out} and {out.with_suffix('.md')} ({result['wall_seconds']:.0f} s)")
    return 0
