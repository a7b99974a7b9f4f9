"""The ``--escalate-*`` command-line flags, shared by ``decide``, ``serve`` and ``eval``."""

from __future__ import annotations

import argparse

from noulengine.escalate.config import API_KEY_ENV, RESPONSE_FORMATS, EscalationConfig


def add_escalation_args(parser: argparse.ArgumentParser, *, thresholds: bool = False) -> None:
    """Add the escalation group. ``thresholds=True`` (eval) lets ``--escalate-below`` take a
    comma-separated list, one table row per threshold."""
    g = parser.add_argument_group("escalation to a generative LLM (OpenAI-compatible chat completions; docs/escalation.md)")
    g.add_argument("--escalate-url", metavar="URL", help="the endpoint's base URL including /v1 (e.g. "
                   "http://127.0.0.1:8080/v1); without it nothing is escalated")
    g.add_argument("--escalate-model", default="default", metavar="NAME", help="the model name sent in each call")
    g.add_argument("--escalate-below", default="0.7", metavar="T" + (",T..." if thresholds else ""),
                   help="escalate questions whose confidence (max p) is under T" +
                        (" (several: one row per threshold, the LLM asked once per field)" if thresholds else "")
                        + " (default 0.7)")
    g.add_argument("--escalate-max", type=int, default=8, metavar="N", help="escalations per request at most, least "
                   "confident first (default 8)")
    g.add_argument("--escalate-timeout", type=float, default=30.0, metavar="S", help="seconds per LLM call (default 30)")
    g.add_argument("--escalate-deadline", type=float, default=120.0, metavar="S", help="seconds for a request's "
                   "escalations in all (default 120)")
    g.add_argument("--escalate-concurrency", type=int, default=4, metavar="N", help="LLM calls in flight at once "
                   "(default 4)")
    g.add_argument("--escalate-format", choices=RESPONSE_FORMATS, default="auto", help="structured output form "
                   "(default auto: json_schema, else llama-cpp-python's json_object)")
    parser.set_defaults(escalate_many=thresholds)
    g.add_argument("--escalate-key-env", default=API_KEY_ENV, metavar="VAR", help="environment variable with the "
                   f"API key (default {API_KEY_ENV}); the key is never written to outputs")


def thresholds_from_args(args: argparse.Namespace) -> list[float]:
    """The ``--escalate-below`` values, ascending.

    Raises:
        ValueError: a value that is not a number in (0, 1].
    """
    try:
        values = sorted({float(v) for v in str(args.escalate_below).split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--escalate-below {args.escalate_below!r}: give numbers in (0, 1], comma-separated") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"--escalate-below {args.escalate_below!r}: every threshold must be in (0, 1]")
    if len(values) > 1 and not getattr(args, "escalate_many", False):
        raise ValueError(f"--escalate-below {args.escalate_below!r}: one threshold here (a list is for eval's table)")
    return values


def config_from_args(args: argparse.Namespace) -> EscalationConfig | None:
    """The :class:`EscalationConfig` the flags describe (``below`` = the largest threshold), or
    None without ``--escalate-url``.

    Raises:
        ValueError: a flag out of range, naming it.
    """
    if not getattr(args, "escalate_url", None):
        return None
    return EscalationConfig(url=args.escalate_url, model=args.escalate_model, below=max(thresholds_from_args(args)),
                            api_key_env=args.escalate_key_env, timeout_s=args.escalate_timeout,
                            max_concurrent=args.escalate_concurrency, max_per_request=args.escalate_max,
                            deadline_s=args.escalate_deadline, response_format=args.escalate_format)
