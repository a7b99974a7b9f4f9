"""The ``--escalate-*`` command-line flags, shared by ``decide``, ``serve`` and ``eval``."""

from __future__ import annotations

import argparse
from dataclasses import fields
from types import SimpleNamespace

from noulengine.escalate.config import RESPONSE_FORMATS, EscalationConfig


# The flags' defaults are EscalationConfig's own (one source of truth).
D = SimpleNamespace(**{f.name: f.default for f in fields(EscalationConfig)})


def add_escalation_args(parser: argparse.ArgumentParser, *, thresholds: bool = False) -> None:
    """Add the escalation group. ``thresholds=True`` (eval) lets ``--escalate-below`` take a
    comma-separated list, one table row per threshold."""
    g = parser.add_argument_group("escalation to a generative LLM (OpenAI-compatible chat completions; docs/escalation.md)")
    g.add_argument("--escalate-url", metavar="URL", help="the endpoint's base URL including /v1 (e.g. "
                   "http://127.0.0.1:8080/v1); without it nothing is escalated")
    g.add_argument("--escalate-model", default=D.model, metavar="NAME", help="the model name sent in each call")
    g.add_argument("--escalate-below", default=str(D.below), metavar="T" + (",T..." if thresholds else ""),
                   help="escalate questions whose confidence (max p) is under T" +
                        (" (several: one row per threshold, the LLM asked once per field)" if thresholds else "")
                        + f" (default {D.below:g})")
    g.add_argument("--escalate-max", type=int, default=D.max_per_request, metavar="N", help="escalations per "
                   f"request at most, least confident first (default {D.max_per_request})")
    g.add_argument("--escalate-timeout", type=float, default=D.timeout_s, metavar="S",
                   help=f"seconds per LLM call (default {D.timeout_s:g})")
    g.add_argument("--escalate-deadline", type=float, default=D.deadline_s, metavar="S", help="seconds for a "
                   f"request's escalations in all (default {D.deadline_s:g})")
    g.add_argument("--escalate-concurrency", type=int, default=D.max_concurrent, metavar="N",
                   help=f"LLM calls in flight at once (default {D.max_concurrent})")
    g.add_argument("--escalate-format", choices=RESPONSE_FORMATS, default=D.response_format, help="structured output form "
                   "(default auto: json_schema, else llama-cpp-python's json_object)")
    parser.set_defaults(escalate_many=thresholds)
    g.add_argument("--escalate-key-env", default=D.api_key_env, metavar="VAR", help="environment variable with the "
                   f"API key (default {D.api_key_env}); the key is never written to outputs")


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
