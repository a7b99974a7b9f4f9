"""``noulengine serve``: load the model once and serve it over HTTP with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from noulengine.serve.config import (DEFAULT_MAX_ADAPTER_BYTES, DEFAULT_MAX_LOADED, DEFAULT_MAX_QUESTIONS, ServeConfig,
                                     is_loopback, parse_max_questions)


def build_parser() -> argparse.ArgumentParser:
    """The ``noulengine serve`` argument parser (engine flags come from EngineConfig)."""
    from noulengine.cli import add_engine_args

    p = argparse.ArgumentParser(prog="noulengine serve", description="Serve decisions over HTTP (FastAPI + uvicorn).")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key clients must send")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without an API key")
    # the same flag name as eval/decide/bench (--batch-tokens); --max-batch-tokens stays accepted
    p.add_argument("--batch-tokens", "--max-batch-tokens", dest="max_batch_tokens", type=int, default=8192,
                   metavar="N", help="padded tokens per forward pass (rows x width), as in eval and decide; "
                                     "1 = no dynamic batching (one request per pass) (default 8192)")
    p.add_argument("--max-batch-requests", type=int, default=64, help="requests gathered into one engine call at most")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long to wait for more requests to batch")
    p.add_argument("--max-queue", type=int, default=256, help="queued + running requests at most (then 429)")
    p.add_argument("--max-body-mb", type=float, default=48.0, help="request body limit in MiB (then 413)")
    p.add_argument("--body-timeout-s", type=float, default=30.0, help="seconds to receive a request body (then 408)")
    defaults = ", ".join(f"{k}={v}" for k, v in DEFAULT_MAX_QUESTIONS.items())
    p.add_argument("--max-questions", action="append", metavar="[ROUTE=]N",
                   help="questions per request accepted by a route (decide, systemone), or by every route "
                        f"without ROUTE=; 'none' removes the cap; repeatable (default {defaults}); more get 422")
    p.add_argument("--model-name", help="name reported in responses and /v1/models (default: the model's name)")
    from noulengine.cli import add_adapter_arg

    add_adapter_arg(p, "a LoRA adapter served beside the model, repeatable: requests name it with \"adapter\" "
                       "(/v1/decide) or \"model\" (/v1/systemone); GET /v1/adapters lists them (docs/adapters.md)")
    p.add_argument("--adapter-root", metavar="DIR", help="POST /v1/adapters may load adapter folders under DIR at "
                                                          "run time (default: off)")
    p.add_argument("--max-loaded-adapters", type=int, metavar="N", default=DEFAULT_MAX_LOADED,
                   help="adapters loaded at once at most; the least recently used is unloaded to make room and "
                        f"loaded again when named (default {DEFAULT_MAX_LOADED})")
    p.add_argument("--max-adapter-bytes", type=int, metavar="BYTES", default=DEFAULT_MAX_ADAPTER_BYTES,
                   help="one adapter's LoRA factors at most, in bytes as stored (read from the safetensors header "
                        f"before the weights; larger ones are refused) (default {DEFAULT_MAX_ADAPTER_BYTES})")
    p.add_argument("--log-level", default="info")
    add_engine_args(p, skip=("batch_tokens", "media_root"))  # HTTP never reads image paths
    from noulengine.escalate.args import add_escalation_args

    add_escalation_args(p)
    p.add_argument("--escalate-default", choices=("on", "off"), default="on",
                   help="with --escalate-url: whether /v1/decide requests that do not say \"escalate\" are "
                        "escalated (default on)")
    return p


def config_from_args(args: argparse.Namespace, engine=None) -> ServeConfig:
    """A :class:`ServeConfig` from parsed flags; the API key is read from ``--api-key-env``.

    Raises:
        SystemExit(2): an API key variable that is unset/empty, or a non-loopback host with
            neither an API key nor ``--insecure``.
    """
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env) or None
        if key is None:
            raise SystemExit(f"error: --api-key-env {args.api_key_env}: the variable is unset or empty")
    if not is_loopback(args.host) and key is None and not args.insecure:
        raise SystemExit(f"error: refusing to bind {args.host!r} without an API key; set --api-key-env VAR "
                         "or pass --insecure")
    try:
        max_questions = parse_max_questions(args.max_questions)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    for flag, value in (("--batch-tokens", args.max_batch_tokens), ("--max-batch-requests", args.max_batch_requests),
                        ("--max-queue", args.max_queue)):
        if value < 1:
            raise SystemExit(f"error: {flag} must be at least 1, got {value}")
    from noulengine.escalate.args import config_from_args as escalation_from_args

    try:
        escalation = escalation_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    from noulengine.cli import adapter_specs

    adapters = adapter_specs(args.adapter)
    for flag, value in (("--max-loaded-adapters", args.max_loaded_adapters),
                        ("--max-adapter-bytes", args.max_adapter_bytes)):
        if value < 1:
            raise SystemExit(f"error: {flag} must be at least 1, got {value}")
    if args.adapter_root is not None and not Path(args.adapter_root).is_dir():
        raise SystemExit(f"error: --adapter-root {args.adapter_root}: no such folder")
    name = args.model_name
    if not name:
        ident = getattr(engine, "identity", None)
        name = getattr(ident, "name", None) or (Path(args.model).name if args.model else "noulengine")
    return ServeConfig(model_name=name, api_key=key, max_batch_tokens=args.max_batch_tokens,
                       max_batch_requests=args.max_batch_requests, max_wait_ms=args.max_wait_ms,
                       max_queue=args.max_queue, max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                       body_timeout_s=args.body_timeout_s, max_questions=max_questions, escalation=escalation,
                       escalate_by_default=args.escalate_default == "on", adapters=adapters,
                       adapter_root=args.adapter_root, max_loaded_adapters=args.max_loaded_adapters,
                       max_adapter_bytes=args.max_adapter_bytes)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, load the engine, run uvicorn until interrupted."""
    args = build_parser().parse_args(argv)
    try:
        import uvicorn  # noqa: F401
        import fastapi  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is missing; install the serve extra: pip install 'noulengine[serve]'", file=sys.stderr)
        return 2
    config_from_args(args)  # fail fast on unsafe flags before loading the model
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from noulengine.cli import adapter_specs
    from noulengine.engine.engine import precheck_adapters
    from noulengine.engine.lora import AdapterError

    adapters = adapter_specs(args.adapter)
    try:  # an adapter that cannot join the model is refused before the model loads: one line, exit 2
        precheck_adapters(args.model, adapters, args.dtype, max_bytes=args.max_adapter_bytes)
    except AdapterError as exc:
        print(f"error: --adapter: {exc}", file=sys.stderr)
        return 2
    from noulengine.cli import engine_from_args
    from noulengine.threads import cli_threads

    threads = cli_threads()  # NOULENGINE_THREADS, else the usable physical cores (after the refusals: one line)
    logging.getLogger("noulengine.serve").info("torch CPU threads: %d (%s)", threads["threads"], threads["source"])
    # a trained --model (the default too) is served unmerged when adapters can be named, so they
    # join its base; registered (and loaded) by create_app, which tracks them
    engine = engine_from_args(args, unmerged=bool(adapters or args.adapter_root))
    config = config_from_args(args, engine)
    if config.max_batch_tokens > engine.config.batch_tokens:
        engine.config.batch_tokens = config.max_batch_tokens
    from noulengine.serve.app import create_app

    try:
        app = create_app(engine, config)
    except AdapterError as exc:  # an --adapter folder the model cannot serve: one line, no traceback
        print(f"error: --adapter: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=5,
                timeout_graceful_shutdown=10, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
