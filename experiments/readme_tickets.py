"""Experiment behind docs/results.md#v5-v4-continued-on-workflow-scenarios-issue-33-not-adopted ("v5: v4 continued on workflow scenarios (issue #33; not adopted)"); reproduce: `python experiments/readme_tickets.py --model default`.

The README's tickets in both option orders, for any models: route and refund answers per ticket.

The tickets and questions are the end-to-end test's (``tests/test_default_model_e2e.py``:
README_TICKETS, README_QUESTIONS), so a candidate default is checked on exactly what that test
asserts before it is installed::

    python experiments/readme_tickets.py --model default --model runs/train-v4-3ep/model

prints one line per (model, ticket, order): the route answer with its probability, the refund
answer with P(yes), and whether each matches the expected one; then a count per model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from noulengine import Engine  # noqa: E402
from test_default_model_e2e import README_QUESTIONS, README_TICKETS, _reverse_options  # noqa: E402


def report(engine: Engine, name: str, rows: list | None = None) -> tuple[int, int]:
    """Print one line per (ticket, order) for ``engine`` and a count line headed ``name``; append
    one dict per (ticket, order) to ``rows`` when given.

    Returns:
        (routes right, refund answers right) over both orders.

    Raises:
        SystemExit: a ticket's request came back with an error.
    """
    routes = refunds = n_refund = 0
    for ticket, route, refund in README_TICKETS:
        for order, questions in (("criteria", README_QUESTIONS), ("reversed", _reverse_options(README_QUESTIONS))):
            d = engine.decide({"state": {"ticket": ticket}, "questions": questions})
            if d.error is not None:
                raise SystemExit(f"{name}: {ticket!r}: {d.error}")
            r, f = d.answers["route"], d.answers["refund"]
            routes += r.label == route
            if refund is not None:
                n_refund += 1
                refunds += f.label == refund
            if rows is not None:
                rows.append({"ticket": ticket, "order": order, "route": r.label, "route_want": route,
                             "p_yes": f.probabilities["yes"], "refund": f.label, "refund_want": refund})
            print(f"{name} | {order:8} | {ticket[:48]:48} | route {r.label} ({r.probabilities[r.label]:.2f}) "
                  f"{'ok' if r.label == route else 'WRONG, want ' + route} | refund P(yes) {f.probabilities['yes']:.2f} "
                  f"{'' if refund is None else ('ok' if f.label == refund else 'WRONG, want ' + refund)}")
    print(f"{name}: routes {routes}/{2 * len(README_TICKETS)}, refund {refunds}/{n_refund}")
    return routes, refunds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, help="default or a model folder (repeatable)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--output", default=None, help="write {model: {name, routes, refunds, rows}} JSON here")
    args = ap.parse_args(argv)
    results = {}
    for spec in args.model:
        engine = Engine.from_pretrained(None if spec == "default" else spec, dtype=args.dtype)
        rows = []
        routes, refunds = report(engine, spec, rows)
        results[spec] = {"name": engine.identity.name, "routes": routes, "refunds": refunds,
                         "orders": 2, "rows": rows}
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0

if __name__ == "__main__":
    sys.exit(main())
