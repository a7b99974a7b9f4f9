"""``noulengine bench``: the engine against the two baselines a user would write by hand.

Variants, run interleaved (rotating order) on the same model and the same compiled prompts:

* ``naive``: one transformers forward per question prompt (prefix + that question's branch),
  full-vocabulary head at every position, ``log_softmax`` at the read position;
* ``batched``: the same prompts, left-padded into batches (2D attention mask, position ids from
  the mask), full head on the trailing read positions only (``logits_to_keep``);
* ``engine``: :meth:`Engine.decide_batch` (one packed pass per request batch; its causal path,
  prefix KV cache and cross-request prefix caching on, the store emptied of all but the pinned
  frame head before every timed run, so each run sees fresh requests);
* ``engine_tree``: the engine with those three off (every request through the dense tree mask);
* ``peer`` (AG News only, when installed): anyjev from PyPI on the same model and rows
  (:mod:`noulengine.bench_peer`); its prompts are its own, so it is compared by speed and by
  accuracy against the gold labels, not by probabilities.

Prompts come from the engine's compiler (:meth:`Engine.compile`): a prompt is the chain of
segments from the root to a segment that holds read positions, so all variants evaluate identical
token ids; a read at packed index ``t`` is prompt index ``position_ids[t]`` (tree depth).
Probabilities are compared after the same renormalisation (:func:`make_answer` on each variant's
(V, K) candidate log-probabilities).

Units: seconds (``time.perf_counter``, CUDA synchronised), tokens, bytes, FLOP/s. ``tokens/s``
counts the prompt tokens a variant served; achieved FLOP/s counts 2 x non-embedding parameters x
the tokens it computed (served minus prefix-cache hits; no attention or head FLOPs), as a share
of a square-matmul peak measured in the same run, dtype and device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from noulengine.bench_peer import PEER
from noulengine.bench_cli import MODEL_CONFIGS, WORKLOAD_NAMES, parse_args  # noqa: F401 - re-exported
from noulengine.compile.layout import CompiledRequest
from noulengine.engine.decision import make_answer
from noulengine.records.schema import Request

DATA = Path(os.environ.get("NOULENGINE_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
# engine_tree: the engine with its causal path and prefix cache off (every request through the dense tree mask)
VARIANTS = ("naive", "batched", "engine", "engine_tree")

# --------------------------------------------------------------------------- prompts
@dataclass
class Prompt:
    """One baseline prompt: ``ids`` (prefix + branch chain) and the reads it serves.

    ``reads``: (prompt index, token id, term index in the request's flattened terms).
    """

    ids: list[int]
    reads: list[tuple[int, int, int]]


@dataclass
class Prepared:
    """A request compiled once, with its baseline prompts."""

    request: Request
    compiled: CompiledRequest
    prompts: list[Prompt]

    @property
    def num_terms(self) -> int:
        return sum(len(p.term_pos) for p in self.compiled.questions)


def baseline_prompts(c: CompiledRequest) -> list[Prompt]:
    """Per segment holding read positions: the root-to-segment token chain and its reads."""
    seg_tokens: dict[int, list[int]] = {}
    for tok, seg in zip(c.token_ids, c.segment_ids):
        seg_tokens.setdefault(seg, []).append(tok)
    by_seg: dict[int, list[tuple[int, int, int]]] = {}
    term = 0
    for plan in c.questions:
        for pos, tok in zip(plan.term_pos, plan.term_tok):
            by_seg.setdefault(c.segment_ids[pos], []).append((c.position_ids[pos], tok, term))
            term += 1
    prompts = []
    for seg, reads in by_seg.items():
        chain, s = [], seg
        while s >= 0:
            chain.append(s)
            s = c.parents[s]
        ids = [t for s in reversed(chain) for t in seg_tokens.get(s, [])]
        assert all(0 <= r[0] < len(ids) for r in reads), "read position outside its prompt"
        prompts.append(Prompt(ids, reads))
    return prompts


def answers_from_terms(c: CompiledRequest, term_logp: torch.Tensor) -> list[list[float]]:
    """Per question: candidate probabilities from flattened term log-probs (engine's rules)."""
    out, start = [], 0
    for plan in c.questions:
        t = term_logp[start:start + len(plan.term_pos)].double()
        start += len(plan.term_pos)
        alt = torch.zeros(len(plan.alt_vc), dtype=torch.float64).index_add_(0, torch.tensor(plan.term_alt), t)
        nvc = plan.num_views * plan.num_candidates
        vc = torch.full((nvc,), float("-inf"), dtype=torch.float64)
        for a, v in enumerate(plan.alt_vc):
            vc[v] = torch.logaddexp(vc[v], alt[a])
        ans = make_answer(plan, vc.view(plan.num_views, plan.num_candidates))
        out.append([ans.probabilities[label] for label in plan.labels])
    return out


# --------------------------------------------------------------------------- variants
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_naive(model, items: list[Prepared], device) -> tuple[list, list[float]]:
    """One full-head forward per prompt. Returns (answers per request, seconds per request)."""
    answers, lat = [], []
    for it in items:
        _sync(device)
        t0 = time.perf_counter()
        term_logp = torch.empty(it.num_terms)
        for pr in it.prompts:
            logits = model(input_ids=torch.tensor([pr.ids], device=device), use_cache=False).logits[0]  # (L, V)
            for pos, tok, term in pr.reads:
                term_logp[term] = torch.log_softmax(logits[pos].float(), dim=-1)[tok].item()
        lat.append(time.perf_counter() - t0)
        answers.append(answers_from_terms(it.compiled, term_logp))
    return answers, lat


@torch.inference_mode()
def run_batched(model, items: list[Prepared], device, *, batch_tokens: int, pad_id: int,
                max_batch_size: int = 64) -> tuple[list, list[float], int]:
    """All prompts of all requests, longest first, left-padded into batches under ``batch_tokens``.

    Returns (answers per request, seconds per request = sum of its batches' times, padded tokens).
    """
    from noulengine.engine.batching import plan_batches

    flat = [(i, pr) for i, it in enumerate(items) for pr in it.prompts]
    term_logp = [torch.empty(it.num_terms) for it in items]
    lat = [0.0] * len(items)
    padded = 0
    for idx in plan_batches([len(pr.ids) for _, pr in flat], batch_tokens=batch_tokens, max_batch_size=max_batch_size):
        _sync(device)
        t0 = time.perf_counter()
        rows = [flat[j] for j in idx]
        width = max(len(pr.ids) for _, pr in rows)
        keep = max(len(pr.ids) - min(r[0] for r in pr.reads) for _, pr in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, pr) in enumerate(rows):
            ids[r, width - len(pr.ids):] = torch.tensor(pr.ids)
            mask[r, width - len(pr.ids):] = 1
        pos_ids = (mask.cumsum(-1) - 1).clamp_(min=0)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos_ids.to(device),
                       logits_to_keep=keep, use_cache=False).logits  # (B, keep, V)
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        for r, (i, pr) in enumerate(rows):
            for pos, tok, term in pr.reads:
                term_logp[i][term] = logp[r, keep - (len(pr.ids) - pos), tok]
        dt = time.perf_counter() - t0
        padded += ids.numel()
        for i in {i for i, _ in rows}:
            lat[i] += dt
    return [answers_from_terms(it.compiled, t) for it, t in zip(items, term_logp)], lat, padded


def run_engine(engine, items: list[Prepared]) -> tuple[list, list[float], float]:
    """``engine.decide_batch``. Returns (answers, per-request latency_s, padding share)."""
    decisions = engine.decide_batch([it.request for it in items], on_error="raise")
    answers = [[[d.answers[p.field].probabilities[label] for label in p.labels] for p in it.compiled.questions]
               for d, it in zip(decisions, items)]
    return answers, [d.latency_s for d in decisions], float(getattr(engine, "last_padding_share", 0.0))


# --------------------------------------------------------------------------- measurement helpers
class PeakMemory:
    """Peak memory during a block: CUDA max_memory_allocated, else sampled process RSS (bytes)."""

    def __init__(self, device: torch.device, interval_s: float = 0.002):
        self.device, self.interval_s, self.peak = device, interval_s, 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        import psutil

        proc = psutil.Process()
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self.peak = max(self.peak, proc.memory_info().rss)
                self._stop.wait(self.interval_s)

        self.peak = proc.memory_info().rss
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self._stop.set()
            self._thread.join()


def matmul_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = (2048, 3072), reps: int = 5) -> float:
    """Measured peak FLOP/s of square matmuls: the best of ``reps`` timed ``n x n x n`` products
    (after 2 warm-ups) over ``sizes``. The best, not the median: a peak is what the machine
    reached, and a median taken while the CPU was briefly busy understated it (a quick run on
    this 2-core CPU once reported engine shares above 100%)."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        for i in range(reps + 2):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            if i >= 2:
                best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def non_embedding_params(model) -> int:
    """Parameters minus the input embedding and (when untied) the output head."""
    total = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return total - emb.numel() - (0 if head.data_ptr() == emb.data_ptr() else head.numel())


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def max_prob_diff(a: list, b: list) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b) for qa, qb in zip(ra, rb) for x, y in zip(qa, qb)), default=0.0)


# --------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    """One timed workload. ``golds``: per request, field -> gold label (accuracy is reported when
    given); ``peer``: whether the peer variant runs on it."""

    name: str
    requests: list[Request]
    note: str = ""
    items: list[Prepared] = field(default_factory=list)
    golds: list[dict[str, str]] | None = None
    peer: bool = False


def _records(name: str, n: int | None = None):
    from noulengine.records import load_records

    path = DATA / name
    if not path.exists():
        raise SystemExit(f"bench: data file {path} not found (set NOULENGINE_DATA to the shared data folder)")
    recs = load_records(path).records
    return recs if n is None else recs[:n]


QUESTION_COUNTS = (1, 16, 32)  # questions on one long state: the cost of each extra question


def long_state_requests(max_chars: int, counts: tuple[int, ...] = QUESTION_COUNTS) -> dict[int, Request]:
    """A long WildJailbreak state asked ``n`` questions for each ``n`` in ``counts``.

    The questions are the state's own, then Typed-Decisions questions (renamed to stay unique);
    the ``n``-question request holds the first ``n`` of them, so requests differ only in how many
    branches they add to the shared prefix.

    Returns:
        ``{n: Request}`` with ids ``long{n}``.
    """
    jail = _records("wildjailbreak/test.local_ids.jsonl")
    best = max((r for r in jail if len(json.dumps(r.request.state)) <= max_chars),
               key=lambda r: len(json.dumps(r.request.state)))
    questions = list(best.request.questions)
    want = max(counts)
    for rec in _records("typed_decisions/test.jsonl", -(-want // 5) + 1):
        for q in rec.request.questions:
            if len(questions) < want:
                questions.append(dataclasses.replace(q, field=f"{q.field}_{len(questions)}"))
    if len(questions) < want:
        raise ValueError(f"only {len(questions)} questions available for the long-state workload, {want} wanted")
    return {n: Request(state=best.request.state, questions=tuple(questions[:n]), id=f"long{n}") for n in counts}


AGNEWS_SEED = 0  # issue #15's peer measurement: random.Random(0) shuffle of the test file, first N rows


def agnews_rows(n: int):
    """The first ``n`` AG News test records after a ``random.Random(AGNEWS_SEED)`` shuffle."""
    import random

    recs = list(_records("agnews/test.jsonl"))
    random.Random(AGNEWS_SEED).shuffle(recs)
    return recs[:n]


def build_workloads(quick: bool) -> tuple[list[Workload], dict[int, Request]]:
    typed_n, agnews_n, long_chars = (2, 24, 1000) if quick else (6, 200, 3000)
    longs = long_state_requests(long_chars)
    agnews = agnews_rows(agnews_n)
    return [
        Workload("typed_decisions", [r.request for r in _records("typed_decisions/test.jsonl", typed_n)],
                 f"first {typed_n} Typed-Decisions test states, 5 questions each"),
        Workload("long_state_16q", [longs[16]],
                 f"longest WildJailbreak eval state <= {long_chars} JSON chars, 16 questions"),
        Workload("long_state_32q", [longs[32]],
                 "the same state, 32 questions (16 more branches on the same prefix)"),
        Workload("agnews_1q", [r.request for r in agnews],
                 f"{agnews_n} AG News test records (random.Random({AGNEWS_SEED}) shuffle), 1 question each",
                 golds=[{f: t.label for f, t in r.targets.items()} for r in agnews], peer=True),
    ], longs


# --------------------------------------------------------------------------- engine construction
def load_engine(args):
    from noulengine import Engine
    from noulengine.engine.model_runner import pick_device, pick_dtype

    kw = {"batch_tokens": args.batch_tokens} if args.batch_tokens else {}
    if args.model_config is None:
        # calibration "none": the variants compare forward passes and readouts; a trained model's
        # shipped temperatures would apply to the engine variant only and read as a disagreement
        return Engine.from_pretrained(args.model, device=args.device, dtype=args.dtype, debias="none",
                                      calibration="none", **kw), "pretrained"
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from noulengine.models.loading import resolve_model

    directory, _ = resolve_model(args.model)  # the tokenizer only
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    dev = pick_device(args.device)
    dtype = pick_dtype(args.dtype, dev)
    cfg = LlamaConfig(**MODEL_CONFIGS[args.model_config], attn_implementation="sdpa")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval()
    return Engine.from_model(model, tokenizer, device=str(dev), debias="none", **kw), "random weights"


def git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------- the run
def accuracy(wl: Workload, answers: list) -> float | None:
    """Share of questions whose argmax is the gold label (None without golds)."""
    if wl.golds is None:
        return None
    hits = total = 0
    for it, gold, per_q in zip(wl.items, wl.golds, answers):
        for plan, probs in zip(it.compiled.questions, per_q):
            if plan.field in gold:
                total += 1
                hits += plan.labels[max(range(len(probs)), key=probs.__getitem__)] == gold[plan.field]
    return hits / total if total else None


def measure_workload(engine, wl: Workload, *, reps: int, device, n_params: int, peak: float, attn: str,
                     warmup: Request | None = None, peer=None) -> dict:
    model = engine.runner.model
    pad_id = engine.pad_id
    budget = engine.config.batch_tokens
    store = engine.prefix_store
    wl.items = [Prepared(r, engine.compile(r), baseline_prompts(engine.compile(r))) for r in wl.requests]
    n_dec = sum(len(r.questions) for r in wl.requests)
    tokens = {"naive": sum(len(p.ids) for it in wl.items for p in it.prompts),
              "batched": sum(len(p.ids) for it in wl.items for p in it.prompts),
              "engine": sum(it.compiled.input_tokens for it in wl.items)}
    tokens["engine_tree"] = tokens["engine"]
    variants = VARIANTS + (("peer",) if peer is not None and wl.peer else ())
    if "peer" in variants:
        tokens["peer"] = peer.prompt_tokens(wl.requests)

    def run(variant, items):
        if variant == "peer":
            ans, lat = peer.run([it.request for it in items])
            return ans, lat, {}
        if variant == "naive":
            ans, lat = run_naive(model, items, device)
            return ans, lat, {}
        if variant == "batched":
            ans, lat, padded = run_batched(model, items, device, batch_tokens=budget, pad_id=pad_id)
            return ans, lat, {"padded_tokens": padded}
        if attn == "flex":
            from noulengine.engine.flex_attention import use_flex_attention

            use_flex_attention(engine, True)
        causal, cached = engine.config.causal_path, engine.config.prefix_cache
        engine.config.causal_path = causal and variant == "engine"
        engine.config.prefix_cache = cached and variant == "engine"
        engine.prefix_store = store if variant == "engine" else None
        if store is not None:
            store.clear(keep_pinned=True)  # fresh requests: only the frame head is cached
        before = (store.stats.query_tokens, store.stats.hit_tokens) if store is not None else (0, 0)
        try:
            ans, lat, share = run_engine(engine, items)
        finally:
            engine.config.causal_path, engine.config.prefix_cache = causal, cached
            engine.prefix_store = store
            if attn == "flex":
                use_flex_attention(engine, False)
        ex = {"padding_share": share}
        if variant == "engine" and store is not None:
            queried, hit = store.stats.query_tokens - before[0], store.stats.hit_tokens - before[1]
            ex["prefix_cache_hit_rate"] = hit / queried if queried else 0.0
            ex["computed_tokens"] = sum(it.compiled.input_tokens for it in items) - hit
        return ans, lat, ex

    if warmup:  # excluded from timing: one small request through every variant
        for v in variants:
            run(v, [Prepared(warmup, engine.compile(warmup), baseline_prompts(engine.compile(warmup)))])
    times = {v: [] for v in variants}
    lats = {v: [] for v in variants}
    mem = {v: 0 for v in variants}
    extra: dict = {v: {} for v in variants}
    answers = {}
    for rep in range(reps):
        k = rep % len(variants)
        order = variants[k:] + variants[:k]  # interleaved, rotating order
        for v in order:
            with PeakMemory(device) as pm:
                _sync(device)
                t0 = time.perf_counter()
                ans, lat, ex = run(v, wl.items)
                _sync(device)
                dt = time.perf_counter() - t0
            times[v].append(dt)
            lats[v].extend(lat)
            mem[v] = max(mem[v], pm.peak)
            extra[v] = ex
            answers[v] = ans
    out = {"name": wl.name, "note": wl.note, "requests": len(wl.requests), "decisions": n_dec, "reps": reps,
           "variants": {}}
    for v in variants:
        t = statistics.median(times[v])
        # FLOPs count the tokens the model computed: prefix-cache hits are served, not computed
        computed = extra[v].pop("computed_tokens", tokens[v])
        out["variants"][v] = {
            "seconds_median": t, "seconds_all": times[v], "decisions_per_s": n_dec / t,
            "requests_per_s": len(wl.requests) / t, "tokens": tokens[v], "tokens_per_s": tokens[v] / t,
            "latency_p50_s": percentile(lats[v], 0.5), "latency_p95_s": percentile(lats[v], 0.95),
            "peak_memory_bytes": mem[v], "computed_tokens": computed,
            "achieved_flops": 2 * n_params * computed / t, "share_of_matmul_peak": 2 * n_params * computed / t / peak,
            "accuracy": accuracy(wl, answers[v]), **extra[v]}
    e = out["variants"]
    if "peer" in e:
        out["ratio_vs_peer"] = e["engine"]["decisions_per_s"] / e["peer"]["decisions_per_s"]
        out["peer_version"] = peer.version
    out["decisions_per_s"] = e["engine"]["decisions_per_s"]
    out["ratio_vs_naive"] = e["engine"]["decisions_per_s"] / e["naive"]["decisions_per_s"]
    out["ratio_vs_batched"] = e["engine"]["decisions_per_s"] / e["batched"]["decisions_per_s"]
    out["ratio_vs_tree_path"] = e["engine"]["decisions_per_s"] / e["engine_tree"]["decisions_per_s"]
    out["padding_share"] = e["engine"].get("padding_share", 0.0)
    out["prefix_cache_hit_rate"] = e["engine"].get("prefix_cache_hit_rate")
    if wl.golds is not None:
        labels = [g for gold in wl.golds for g in gold.values()]
        out["gold_majority"] = max(labels.count(x) for x in set(labels)) / len(labels)
        out["chance"] = statistics.mean(1 / plan.num_candidates for it in wl.items for plan in it.compiled.questions)
    out["max_prob_diff"] = max(max_prob_diff(answers["engine"], answers["naive"]),
                               max_prob_diff(answers["engine"], answers["batched"]),
                               max_prob_diff(answers["engine"], answers["engine_tree"]),
                               max_prob_diff(answers["naive"], answers["batched"]))
    return out


def cost_by_questions(engine, longs: dict[int, Request], reps: int, device) -> dict:
    """Engine seconds per request for 1, 16 and 32 questions on the same long state.

    Each request runs alone (``engine.decide``), synchronised on CUDA, ``reps`` times, interleaved
    so that drift in machine load hits every count alike; the median is reported.

    Returns:
        ``{"counts": {n: {"seconds", "tokens", "time_ratio", "token_ratio"}}, "reps",
        "marginal_seconds_per_question"}``: ratios are against the 1-question request; the marginal
        cost is (t(32) - t(16)) / 16, the price of one more question once a request has many.
    """
    engine.decide_batch(list(longs.values()))  # warm-up
    times: dict[int, list[float]] = {n: [] for n in longs}
    for _ in range(reps):
        for n, req in longs.items():
            if engine.prefix_store is not None:
                engine.prefix_store.clear(keep_pinned=True)  # the same state again: a fresh request
            _sync(device)
            t0 = time.perf_counter()
            engine.decide(req)
            _sync(device)
            times[n].append(time.perf_counter() - t0)
    tokens = {n: engine.compile(req).input_tokens for n, req in longs.items()}
    med = {n: statistics.median(t) for n, t in times.items()}
    base = min(longs)
    counts = {n: {"seconds": med[n], "tokens": tokens[n], "time_ratio": med[n] / med[base],
                  "token_ratio": tokens[n] / tokens[base]} for n in sorted(longs)}
    hi = sorted(longs)[-2:]
    marginal = (med[hi[1]] - med[hi[0]]) / (hi[1] - hi[0]) if len(hi) == 2 else None
    return {"counts": counts, "reps": reps, "marginal_seconds_per_question": marginal}


def markdown(result: dict) -> str:
    lines = ["| workload | variant | decisions/s | requests/s | tokens/s | p50 s | p95 s | peak MB | "
             "% matmul peak | accuracy | vs naive | vs batched |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in result["workloads"]:
        for v, m in w["variants"].items():
            ratio_n = m["decisions_per_s"] / w["variants"]["naive"]["decisions_per_s"]
            ratio_b = m["decisions_per_s"] / w["variants"]["batched"]["decisions_per_s"]
            acc = "—" if m.get("accuracy") is None else f"{100 * m['accuracy']:.1f}%"
            lines.append(f"| {w['name']} | {v} | {m['decisions_per_s']:.2f} | {m['requests_per_s']:.3f} | "
                         f"{m['tokens_per_s']:.0f} | {m['latency_p50_s']:.2f} | {m['latency_p95_s']:.2f} | "
                         f"{m['peak_memory_bytes'] / 2**20:.0f} | {100 * m['share_of_matmul_peak']:.1f} | {acc} | "
                         f"{ratio_n:.2f}x | {ratio_b:.2f}x |")
    lines.append("")
    lines.append("| workload | max prob diff | engine padding share | engine vs engine_tree | prefix cache hit rate |")
    lines.append("|---|---|---|---|---|")
    for w in result["workloads"]:
        hit = w.get("prefix_cache_hit_rate")
        lines.append(f"| {w['name']} | {w['max_prob_diff']:.2e} | {w['padding_share']:.3f} | "
                     f"{w['ratio_vs_tree_path']:.2f}x | {'—' if hit is None else f'{100 * hit:.1f}%'} |")
    for w in result["workloads"]:
        if "ratio_vs_peer" in w:
            e, p = w["variants"]["engine"], w["variants"]["peer"]
            lines += ["", f"peer ({PEER} {w.get('peer_version')}, same weights, its own prompts) on {w['name']}: "
                          f"engine {w['ratio_vs_peer']:.2f}x the peer's decisions/s ({e['decisions_per_s']:.2f} vs "
                          f"{p['decisions_per_s']:.2f}); tokens per decision {e['tokens'] / w['decisions']:.0f} vs "
                          f"{p['tokens'] / w['decisions']:.0f}; tokens/s {e['tokens_per_s']:.0f} vs "
                          f"{p['tokens_per_s']:.0f}; accuracy {100 * e['accuracy']:.1f}% vs {100 * p['accuracy']:.1f}% "
                          f"(chance {100 * w['chance']:.1f}%, majority {100 * w['gold_majority']:.1f}%)"]
    if result.get("peer_skipped"):
        lines += ["", result["peer_skipped"]]
    c = result["cost_by_questions"]
    lines += ["", "| questions on one state (engine, one request) | seconds | tokens | time vs 1q | tokens vs 1q |",
              "|---|---|---|---|---|"]
    for n, m in c["counts"].items():
        lines.append(f"| {n} | {m['seconds']:.3f} | {m['tokens']} | {m['time_ratio']:.2f}x | {m['token_ratio']:.2f}x |")
    if c.get("marginal_seconds_per_question") is not None:
        lines.append(f"one more question beyond 16: {1000 * c['marginal_seconds_per_question']:.1f} ms")
    lines.append(f"matmul peak: {result['matmul_peak_flops'] / 1e9:.1f} GFLOP/s ({result['dtype']}, "
                 f"{result['device']}, {result['threads']} threads); non-embedding params: "
                 f"{result['non_embedding_params'] / 1e6:.1f}M; weights: {result['weights']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``noulengine bench``: parse the flags (:mod:`noulengine.bench_cli`) and run."""
    return run(parse_args(sys.argv[1:] if argv is None else argv))


def run(args) -> int:
    """Run the bench for parsed flags; returns the exit status."""
    from noulengine.threads import cli_threads

    if args.threads is not None and args.threads < 1:
        print(f"bench: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
        threads_source = "--threads"
    else:
        threads_source = cli_threads()["source"]  # NOULENGINE_THREADS, else the usable physical cores
    reps = args.reps or (1 if args.quick else 2)
    if args.batch_tokens is not None and args.batch_tokens < 1:
        print(f"bench: --batch-tokens must be >= 1, got {args.batch_tokens}", file=sys.stderr)
        return 2
    wanted = [w.strip() for w in (args.workloads or "").split(",") if w.strip()]
    unknown = sorted(set(wanted) - set(WORKLOAD_NAMES))
    if unknown:  # refused before the model loads
        print(f"bench: unknown workloads {unknown}; choose from {list(WORKLOAD_NAMES)}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    engine, weights = load_engine(args)
    device, dtype = engine.runner.device, engine.runner.dtype
    tol = args.tolerance if args.tolerance is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    print(f"bench: model weights: {weights}; device {device}, dtype {dtype}, threads {torch.get_num_threads()} "
          f"({threads_source})", flush=True)
    peer, peer_skipped = None, None
    if args.peer != "off":
        from noulengine.bench_peer import Peer, peer_unavailable

        peer_skipped = peer_unavailable()
        if peer_skipped and args.peer == "on":
            print(f"bench: {peer_skipped}", file=sys.stderr)
            return 2
        if peer_skipped:
            print(f"bench: {peer_skipped}", flush=True)
        else:
            peer = Peer(engine)
            print(f"bench: peer variant: {PEER} {peer.version} on the same weights", flush=True)
    peak = matmul_peak(device, dtype)
    n_params = non_embedding_params(engine.runner.model)
    workloads, longs = build_workloads(args.quick)
    if wanted:
        workloads = [w for w in workloads if w.name in wanted]
    result = {"config": {"quick": args.quick, "reps": reps, "model": args.model or "default",
                         "model_config": args.model_config, "attn": args.attn,
                         "batch_tokens": engine.config.batch_tokens, "tolerance": tol},
              "git_revision": git_revision(), "torch": torch.__version__, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
              "threads_source": threads_source, "weights": weights,
              "matmul_peak_flops": peak, "non_embedding_params": n_params, "peer_skipped": peer_skipped,
              "workloads": []}
    for i, wl in enumerate(workloads):
        print(f"bench: {wl.name} ({wl.note}) ...", flush=True)
        result["workloads"].append(measure_workload(engine, wl, reps=reps, device=device, n_params=n_params,
                                                    peak=peak, attn=args.attn,
                                                    warmup=wl.requests[0] if wl.peer and peer is not None
                                                    else workloads[0].requests[0] if i == 0 or args.attn == "flex"
                                                    else None, peer=peer))
        w = result["workloads"][-1]
        vs_peer = f", {w['ratio_vs_peer']:.2f}x peer" if "ratio_vs_peer" in w else ""
        print(f"bench: {wl.name}: engine {w['decisions_per_s']:.2f} decisions/s, {w['ratio_vs_naive']:.2f}x naive, "
              f"{w['ratio_vs_batched']:.2f}x batched{vs_peer}, max prob diff {w['max_prob_diff']:.1e}", flush=True)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2))  # partial results survive a kill
    if peer is not None:
        peer.close()
    result["cost_by_questions"] = cost_by_questions(engine, longs, max(reps, 2), device)
    result["wall_seconds"] = time.perf_counter() - t_start
    worst = max(w["max_prob_diff"] for w in result["workloads"])
    result["agreement_ok"] = worst <= tol
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    table = markdown(result)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"bench: wrote {out} and {out.with_suffix('.md')} ({result['wall_seconds']:.0f} s)")
    if not result["agreement_ok"]:
        print(f"bench: FAIL: variants disagree by {worst:.2e} > {tol:.0e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
