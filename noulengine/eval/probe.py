"""Option-order probes: every choice question asked again with its options in another order.

``python -m noulengine.eval ... --probe reverse`` (and ``noulengine bench --probe reverse``) re-asks
every choice question of two or more options with its criteria in **reverse order** (labels keep
their meaning: only their positions move) and reports, per suite, the share of scored choice
decisions whose answer label changes. A model that reads option *content* answers the same in any
order (share 0); one that answers by *slot* moves its answer with the options (share near 1 when
it always picks one position). It sits beside the rotation flip rate of ``--debias permute``
(``flip_rate``: the share of cyclic rotations whose argmax differs from the unrotated one).

How a run carries it:

* the reversed requests hold only the request's choice questions (each question is its own
  branch after the shared prefix, so the others do not change its answer) and run as extra
  requests in the same ``decide_batch`` calls as the rows themselves;
* each prediction row keeps its probe result under ``"probe": {"reverse": {...}}`` (the reversed
  answers' labels and probabilities, its error and token count), written with the row, so a killed
  run resumes with no row lacking its probe;
* the run key records ``probe``, so a folder made without the probe is refused for a probe run
  (and the other way round), as other settings are.

Score and noul questions have no option order to reverse and are not counted.
"""

from __future__ import annotations

import dataclasses

PROBES = ("reverse",)


def probed(question) -> bool:
    """Whether a parsed question is re-asked by the probe: a choice of two or more options."""
    return question.type == "choice" and question.num_candidates >= 2


def reversed_question(question):
    """The question with its options (labels and descriptions together) in reverse order."""
    return dataclasses.replace(question, labels=question.labels[::-1], descriptions=question.descriptions[::-1])


def reversed_request(request):
    """The request's choice questions (2+ options), each with its options reversed; None when it
    has none. State, images and id are kept; other questions are left out (see the module notes)."""
    questions = tuple(reversed_question(q) for q in request.questions if probed(q))
    if not questions:
        return None
    return dataclasses.replace(request, questions=questions)


def probe_result(decision: dict | None) -> dict:
    """What a prediction row keeps of the reversed request's decision (``Decision.to_dict()``;
    None: the row has no choice question to probe)."""
    if decision is None:
        return {"answers": {}, "error": None}
    answers = {f: {"label": a.get("label"), "probabilities": a.get("probabilities")}
               for f, a in (decision.get("answers") or {}).items()}
    return {"answers": answers, "error": decision.get("error"),
            "usage": {"input_tokens": (decision.get("usage") or {}).get("input_tokens", 0)}}


def with_probe(row: dict, probe: str | None, decision: dict | None) -> dict:
    """``row`` (a prediction) with its probe result attached (unchanged when ``probe`` is None)."""
    if probe is None:
        return row
    return {**row, "probe": {probe: probe_result(decision)}}


def decide_with_probe(engine, requests: list, probe: str | None, progress=None) -> list[dict]:
    """``engine.decide_batch`` on ``requests`` and, with a probe, their probe requests in the same
    call (extra requests packed into the same batches); returns one row dict per request, each
    with its probe result attached. ``progress(n, total)`` is called after each forward pass with
    the requests it ran and the call's ``total`` (probe requests included in both)."""
    extra = [(j, reversed_request(r)) for j, r in enumerate(requests)] if probe else []
    extra = [(j, r) for j, r in extra if r is not None]
    total = len(requests) + len(extra)
    decisions = [d.to_dict() for d in engine.decide_batch(
        list(requests) + [r for _, r in extra], progress=None if progress is None else lambda n: progress(n, total))]
    rows = decisions[:len(requests)]
    if probe is None:
        return rows
    by_row = {j: decisions[len(requests) + k] for k, (j, _) in enumerate(extra)}
    return [with_probe(d, probe, by_row.get(j)) for j, d in enumerate(rows)]


def change_summary(items, probe: str = "reverse") -> dict:
    """Probe statistics over a set of answered requests (a suite, a bench workload).

    Args:
        items: ``(request, golds, prediction_row)`` triples: ``golds`` maps the fields to count
            (a suite's target fields; all of a bench request's) to their gold label or None; only
            choice questions of 2+ options among them count. A row's probe result is
            ``prediction_row["probe"][probe]``.

    Returns:
        ``{"probe", "items", "changed", "change_share", "errors", "missing", "gold_items",
        "accuracy_in_order", "accuracy_reversed"}``: ``items`` are the counted choice decisions
        answered both ways; ``change_share`` = changed / items (None without items); ``errors``:
        decisions whose row or probe request failed; ``missing``: decisions of rows predicted
        without the probe; the accuracies are over the ``gold_items`` that have a gold label.
    """
    items_n = changed = errors = missing = gold = right = right_rev = 0
    for request, golds, pred in items:
        questions = {q.field: q for q in request.questions}
        fields = [f for f in golds if f in questions and probed(questions[f])]
        if not fields:
            continue
        result = (pred.get("probe") or {}).get(probe)
        if result is None:
            missing += len(fields)
            continue
        if pred.get("error") is not None or result.get("error") is not None:
            errors += len(fields)
            continue
        for f in fields:
            a = ((pred.get("answers") or {}).get(f) or {}).get("label")
            b = ((result.get("answers") or {}).get(f) or {}).get("label")
            if a is None or b is None:
                errors += 1
                continue
            items_n += 1
            changed += a != b
            if golds[f] is not None:
                gold += 1
                right += a == golds[f]
                right_rev += b == golds[f]
    return {"probe": probe, "items": items_n, "changed": changed,
            "change_share": changed / items_n if items_n else None, "errors": errors, "missing": missing,
            "gold_items": gold, "accuracy_in_order": right / gold if gold else None,
            "accuracy_reversed": right_rev / gold if gold else None}


def record_items(pairs):
    """``(record, prediction_row)`` pairs of a suite as :func:`change_summary`'s items: each
    record's target fields, with their gold labels."""
    for rec, pred in pairs:
        yield rec.request, {f: t.label for f, t in rec.targets.items()}, pred
