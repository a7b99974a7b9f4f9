"""Escalation in an evaluation: accuracy with and without handing doubtful fields to an LLM.

After a run's predictions exist, every field whose confidence is under the largest threshold is
asked of the LLM once (:mod:`noulengine.escalate`); the answers are kept in the run folder
(``escalations.jsonl``, resumable) and a table over thresholds is computed from them, so a user
can pick the threshold: for each suite and threshold T, the share of decisions escalated, the
accuracy without and with escalation, the accuracy of the escalated fields before and after,
how many LLM answers were used or refused, and the LLM's tokens per escalated field.
Fields at or above T keep the model's label; a field under T whose LLM answer failed or was
not a candidate keeps the model's label too (counted as ``kept``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

from noulengine.engine.decision import Answer, Decision
from noulengine.writes import write_text_atomic

ESCALATIONS = "escalations.jsonl"
ESCALATION_KEY = "escalation_key.json"


class EscalationRunError(ValueError):
    """The run folder holds escalations made with other settings."""


FINAL = ("escalated", "invalid_answer", "budget")  # an answer; a refused label; never asked by design


def _key(cfg) -> dict:
    """The settings that change what the LLM answers (a resumed run must match them)."""
    return {"url": cfg.url, "model": cfg.model, "below": cfg.below, "response_format": cfg.response_format,
            "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "max_per_request": cfg.max_per_request,
            "show_probabilities": cfg.show_probabilities}


def _final(answers: dict) -> bool:
    """A row is done when none of its fields failed for a reason that may pass (timeout,
    unreachable, HTTP error, bad response, deadline): those rows are asked again on resume."""
    return all((a.get("escalation") or {}).get("status", "escalated") in FINAL for a in answers.values())


def _read_done(path: Path) -> dict[tuple[str, int], dict]:
    done = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn tail of an interrupted write: asked again
            done[(row["suite"], int(row["row"]))] = row["answers"]  # a later line (a retry) wins
    return done


def collect_escalations(items, cfg, out_dir: Path, *, chunk: int = 32, progress=None,
                        transport=None) -> dict[tuple[str, int], dict]:
    """Ask the LLM every field under ``cfg.below`` once; resumable.

    Args:
        items: ``(suite, row, Record, prediction row)`` tuples.
        cfg: the :class:`~noulengine.escalate.EscalationConfig` (``below``: the largest threshold).
        out_dir: the run folder (``escalations.jsonl``, ``escalation_key.json``).

    Returns:
        ``(suite, row) -> {field: Answer.to_dict()}`` after escalation, for rows with any field
        under the threshold.

    Raises:
        EscalationRunError: the folder's escalations were made with other settings.
    """
    from noulengine.escalate.runner import Escalator

    out_dir = Path(out_dir)
    key_path, path = out_dir / ESCALATION_KEY, out_dir / ESCALATIONS
    if key_path.is_file():
        old = json.loads(key_path.read_text(encoding="utf-8"))
        if old != _key(cfg):
            diff = [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in _key(cfg).items() if old.get(k) != v]
            raise EscalationRunError(f"{path} holds escalations made with other settings ({'; '.join(diff)}); "
                                     f"use another --output or delete {path.name} and {key_path.name}")
    else:
        write_text_atomic(key_path, json.dumps(_key(cfg), indent=1) + "\n")
    done = _read_done(path)
    todo = []
    for suite, row, rec, pred in items:
        if ((suite, row) in done and _final(done[(suite, row)])) or pred.get("error") or not pred.get("answers"):
            continue
        answers = {f: Answer.from_dict(a) for f, a in pred["answers"].items()}
        if any(a.confidence < cfg.below for a in answers.values()):
            todo.append((suite, row, rec, Decision(id=rec.id, answers=answers)))

    async def run_chunk(esc, part):
        return await asyncio.gather(*(esc.escalate(d, rec.request) for _, _, rec, d in part))

    async def run_all():
        # No per-request deadline here: the rows of a chunk share the concurrency slots, so a
        # row's clock would include waiting behind the others (the per-call timeout still applies).
        from noulengine.escalate.config import MAX_SECONDS

        esc = Escalator(replace(cfg, deadline_s=MAX_SECONDS), transport=transport)
        try:
            with path.open("a", encoding="utf-8") as sink:
                for start in range(0, len(todo), chunk):
                    part = todo[start:start + chunk]
                    for (suite, row, _, _), dec in zip(part, await run_chunk(esc, part)):
                        answers = {f: a.to_dict() for f, a in dec.answers.items()}
                        sink.write(json.dumps({"suite": suite, "row": row, "answers": answers},
                                              ensure_ascii=False, allow_nan=False) + "\n")
                        done[(suite, row)] = answers
                    sink.flush()
                    if progress is not None:
                        progress(len(part))
        finally:
            await esc.aclose()

    if todo:
        asyncio.run(run_all())
    return done


def threshold_table(items, escalated: dict, thresholds) -> dict:
    """Per suite and threshold: accuracy without/with escalation and what it cost.

    Args:
        items: ``(suite, row, Record, prediction row)`` tuples.
        escalated: :func:`collect_escalations`' result.
        thresholds: the thresholds (each <= the one the escalations were collected at).

    Returns:
        ``{suite: {"decisions", "rows": [{"below", "under", "share_under", "llm_used", "kept",
        "not_asked", "accuracy_without", "accuracy_with", "under_accuracy_before",
        "under_accuracy_after", "tokens_per_answered_field", "llm_tokens"}, ...]}}``: ``under``
        counts the fields under the threshold; of them ``llm_used`` took the LLM's label, ``kept``
        kept the model's after the LLM was asked (refused label or failed call) and ``not_asked``
        were never sent (over the per-request cap); tokens are averaged over the calls that
        returned usage. Only fields with a gold label count.
    """
    fields: dict[str, list[tuple[str, float, str, dict | None]]] = {}
    for suite, row, rec, pred in items:
        if pred.get("error"):
            continue
        esc = escalated.get((suite, row), {})
        for f, a in (pred.get("answers") or {}).items():
            target = rec.targets.get(f)
            if target is None or target.label is None:
                continue
            e = (esc.get(f) or {}).get("escalation")
            fields.setdefault(suite, []).append((str(target.label), float(a["confidence"]), a["label"], e))
    out = {}
    for suite, fs in fields.items():
        n = len(fs)
        rows = []
        for t in thresholds:
            under = [x for x in fs if x[1] < t]
            used = [x for x in under if x[3] is not None and x[3]["status"] == "escalated"]

            def label(x, t=t):  # the final label at threshold t
                ok = x[1] < t and x[3] is not None and x[3]["status"] == "escalated"
                return x[3]["llm_label"] if ok else x[2]

            final = [label(x) for x in fs]
            asked = [x for x in under if x[3] is not None and x[3]["status"] != "budget"]
            tokens = [sum((x[3].get("usage") or {}).get(k, 0) for k in ("prompt_tokens", "completion_tokens"))
                      for x in asked if x[3].get("usage")]
            rows.append({
                "below": t, "under": len(under), "share_under": len(under) / n if n else None,
                "llm_used": len(used), "kept": len(asked) - len(used), "not_asked": len(under) - len(asked),
                "accuracy_without": sum(x[2] == x[0] for x in fs) / n if n else None,
                "accuracy_with": sum(lab == x[0] for lab, x in zip(final, fs)) / n if n else None,
                "under_accuracy_before": (sum(x[2] == x[0] for x in under) / len(under)) if under else None,
                "under_accuracy_after": (sum(label(x) == x[0] for x in under) / len(under)) if under else None,
                "tokens_per_answered_field": (sum(tokens) / len(tokens)) if tokens else None,
                "llm_tokens": sum(tokens)})
        out[suite] = {"decisions": n, "rows": rows}
    return out


def table_markdown(table: dict, cfg) -> str:
    """The threshold table as Markdown (one block per suite)."""
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"## Escalation to `{cfg.model}` at {cfg.url}", "",
             "Fields whose confidence (max p) is under the threshold are asked of the LLM; its label is used when it "
             "is a valid candidate (`llm used`); otherwise the model's stands (`kept`: refused label or failed call; "
             "`not asked`: over the per-request cap).", ""]
    for suite, t in table.items():
        lines += [f"### {suite} ({t['decisions']} decisions)", "",
                  "| below | under threshold | accuracy without | accuracy with | those fields: before / after | llm used | kept | not asked | tokens / answered field |",
                  "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
        for r in t["rows"]:
            tok = "n/a" if r["tokens_per_answered_field"] is None else f"{r['tokens_per_answered_field']:.0f}"
            lines.append(f"| {r['below']:g} | {pct(r['share_under'])} ({r['under']}) | "
                         f"{pct(r['accuracy_without'])} | {pct(r['accuracy_with'])} | "
                         f"{pct(r['under_accuracy_before'])} / {pct(r['under_accuracy_after'])} | "
                         f"{r['llm_used']} | {r['kept']} | {r['not_asked']} | {tok} |")
        lines.append("")
    return "\n".join(lines)


def run_escalation_step(results, eval_config, cfg, thresholds, out_dir: Path, *, progress: bool = True) -> dict:
    """The eval's ``--escalate-url`` step: escalate the run's doubtful fields (resumable), write
    ``escalation.json`` and ``escalation.md`` into the run folder, return the table.

    Args:
        results: :func:`~noulengine.eval.runner.run_eval`'s task results (ready suites are used).
        eval_config: the run's :class:`~noulengine.eval.runner.EvalConfig` (the same row selection).
        cfg: the escalation settings; ``cfg.below`` must be ``max(thresholds)``.
    """
    from tqdm import tqdm

    from noulengine.eval.runner import read_predictions, selected_rows
    from noulengine.eval.suites import get_suite

    out_dir = Path(out_dir)
    preds = read_predictions(out_dir / "predictions.jsonl")
    items = []
    for res in results:
        if res.status != "ready":
            continue
        rows = selected_rows(res.name, get_suite(res.name).load(source=eval_config.source), eval_config)
        items += [(res.name, i, rec, preds[(res.name, i)]) for i, rec in rows if (res.name, i) in preds]
    n_todo = sum(1 for *_, p in items if not p.get("error")
                 and any(a["confidence"] < cfg.below for a in (p.get("answers") or {}).values()))
    bar = tqdm(total=n_todo, desc="escalation", unit="req", disable=not progress)
    escalated = collect_escalations(items, cfg, out_dir, progress=bar.update)
    bar.close()
    table = threshold_table(items, escalated, thresholds)
    write_text_atomic(out_dir / "escalation.json", json.dumps({"settings": cfg.to_dict(), "thresholds": list(thresholds),
                                                               "suites": table}, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out_dir / "escalation.md", table_markdown(table, cfg) + "\n")
    return table
