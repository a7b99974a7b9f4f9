"""The FastAPI application factory: routes, error shapes, auth, limits and metrics wiring.

Routes: ``GET /`` (demo page), ``GET /healthz``, ``GET /metrics``, ``GET /v1/models``, ``GET /v1/limits``,
``POST /v1/systemone`` (Jev-compatible) and ``POST /v1/decide`` (canonical requests, engine
output format), ``GET``/``POST /v1/adapters`` and ``DELETE /v1/adapters/{name}`` (LoRA adapters,
:mod:`noulengine.serve.adapters`), ``GET /openapi.json`` and ``GET /docs`` (the bodies as
:mod:`noulengine.serve.schemas` declares them). All inference goes through one
:class:`~noulengine.serve.worker.BatchWorker`. No error closes a keep-alive connection: a 405
names every method of its path in ``Allow``, and an exception no handler takes is answered 500 by
:class:`~noulengine.serve.responses.InternalErrorMiddleware`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, PlainTextResponse, StreamingResponse

from noulengine import __version__
from noulengine.records.errors import RecordError, SizeLimitError
from noulengine.records.images import check_image_list
from noulengine.records.loader import _no_duplicate_keys
from noulengine.records.schema import request_from_json
from noulengine.serve import systemone
from noulengine.serve.auth import check_key
from noulengine.serve.config import ROUTES, ServeConfig
from noulengine.serve.demo import DEMO_HTML
from noulengine.serve.limits import BodyLimitMiddleware
from noulengine.serve.metrics import Metrics, MetricsMiddleware
from noulengine.serve.responses import (ApiError, FiniteJSONResponse, InternalErrorMiddleware, ValidationFailure,
                                        record_error_failure)
from noulengine.serve.schemas import openapi_document
from noulengine.serve.validation import check_body, check_json_values
from noulengine.engine.lora import AdapterError
from noulengine.serve.adapters import NAME as ADAPTER_NAME
from noulengine.serve.adapters import AdapterAccessError, AdapterExists, AdapterNotFound, AdapterRegistry
from noulengine.serve.worker import BatchWorker, QueueFull

log = logging.getLogger("noulengine.serve")

# engine error_type (Decision.error) -> (HTTP status, public error_type)
ENGINE_ERRORS = {
    "OverlengthError": (413, "request_too_long"),
    "UnsupportedModalityError": (400, "unsupported_modality"),
    "TokenizerError": (400, "unsupported_request"),
    "NonFiniteLogitsError": (500, "non_finite_logits"),  # the model's fault, not the client's
}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request):
    """The request body as JSON (strict: no NaN/Infinity), or a 422 ``json_invalid`` failure.

    A declared Content-Type other than ``application/json`` (or ``*/*+json``) is refused with 415:
    browsers send ``text/plain`` and form bodies cross-origin without a CORS preflight, so
    accepting them would let any web page make a visitor's browser spend this server's compute.
    A request without a Content-Type header is read as JSON.
    """
    ctype = request.headers.get("content-type")
    if ctype is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
            raise ApiError(415, "unsupported_media_type",
                           f"Content-Type must be application/json, got {ctype!r} (curl: add -H 'Content-Type: application/json')")
    raw = await request.body()
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise ValidationFailure([], f"the body is not UTF-8: {exc}", "json_invalid") from None
    except json.JSONDecodeError as exc:
        raise ValidationFailure([exc.pos], f"the body is not valid JSON: {exc.msg}", "json_invalid") from None
    except (ValueError, RecursionError) as exc:
        raise ValidationFailure([], f"the body is not valid JSON: {exc}", "json_invalid") from None


async def _aiter(items):
    for item in items:
        yield item


def _question_ids(body) -> list:
    qs = body.get("questions") if isinstance(body, dict) else None
    return [k for k in qs if isinstance(k, str)] if isinstance(qs, dict) else []


def create_app(engine, config: ServeConfig | None = None) -> FastAPI:
    """Build the app around a loaded :class:`~noulengine.Engine`.

    The worker thread starts with the app's lifespan (``with TestClient(app)`` or uvicorn).
    """
    config = config or ServeConfig()
    metrics = Metrics()
    metrics.prefix_store = getattr(engine, "prefix_store", None)
    worker = BatchWorker(engine, max_batch_tokens=config.max_batch_tokens, max_batch_requests=config.max_batch_requests,
                         max_wait_ms=config.max_wait_ms, max_queue=config.max_queue, metrics=metrics)
    # LoRA adapters (serve/adapters.py): loaded under the worker's engine lock, evicted least recently used
    registry = AdapterRegistry(engine, root=config.adapter_root, max_loaded=config.max_loaded_adapters,
                               max_bytes=config.max_adapter_bytes, lock=worker.engine_lock)
    for name, folder in (config.adapters or {}).items():  # --adapter NAME=PATH: any folder the operator names
        registry.register(name, folder, operator_named=True)
    worker.adapters = registry  # each batch: split by the limit, adapters loaded, refused ones failed alone
    metrics.adapters = registry
    accepted_models = {config.model_name, *config.aliases}
    escalator = None
    if config.escalation is not None:
        from noulengine.escalate.runner import Escalator

        escalator = Escalator(config.escalation)
    supports_images = bool(getattr(getattr(engine, "runner", None), "supports_images", False))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop)
            if escalator is not None:
                await escalator.aclose()

    app = FastAPI(title="noulengine", version=__version__, lifespan=lifespan, docs_url="/docs", redoc_url=None,
                  openapi_url="/openapi.json", default_response_class=FiniteJSONResponse,
                  description="Decision-model service: `POST /v1/systemone` (the Jev contract) and `POST /v1/decide` "
                              "(the engine's canonical format). Bodies are strict JSON (no NaN/Infinity, no "
                              "duplicate keys, Content-Type application/json).")

    def openapi() -> dict:
        """The OpenAPI 3.1 document: the bodies as :mod:`noulengine.serve.schemas` declares them."""
        if app.openapi_schema is None:
            base = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            app.openapi_schema = openapi_document(base, {r: config.question_cap(r) for r in ROUTES},
                                                  keyed=config.api_key is not None,
                                                  models=tuple(accepted_models | set(registry.paths)),
                                                  images=supports_images, escalation=escalator is not None)
        return app.openapi_schema

    app.openapi = openapi
    app.state.engine, app.state.worker, app.state.metrics, app.state.config = engine, worker, metrics, config

    # -- error shapes ---------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(ValidationFailure)
    async def _validation(request, exc: ValidationFailure):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request, exc: RequestValidationError):
        items = [{"loc": list(e.get("loc", ["body"])), "msg": str(e.get("msg")), "type": str(e.get("type"))}
                 for e in exc.errors()]
        return FiniteJSONResponse({"detail": items}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # every method served at this path (FastAPI names only the first route's)
            headers["Allow"] = ", ".join(allowed_methods(request.scope))
        return FiniteJSONResponse({"detail": {"error_type": kind, "message": f"{request.method} {request.url.path}: "
                                                                              f"{exc.detail}"}},
                                  status_code=exc.status_code, headers=headers or None)

    def allowed_methods(scope) -> list[str]:
        """The methods of every route whose path matches ``scope``'s (for a 405's ``Allow``)."""
        from starlette.routing import Match

        methods = set()
        for route in app.router.routes:
            match, _ = route.matches({**scope, "method": "\x00"})  # a method no route has: path matches only
            if match != Match.NONE:
                methods |= set(getattr(route, "methods", None) or ())
        return sorted(methods)

    # an exception no handler takes is answered 500 by InternalErrorMiddleware (added below), which,
    # unlike an exception handler for Exception, does not re-raise it: the connection stays open

    # -- inference --------------------------------------------------------------------------
    async def run_decision(parsed):
        """Queue one parsed request and wait for its Decision; map refusals to HTTP errors."""
        if parsed.adapter is not None and parsed.adapter not in registry.paths:
            raise ApiError(404, "adapter_not_found", f"field 'adapter': no adapter named {parsed.adapter!r} is served "
                                                     f"here (GET /v1/adapters lists {sorted(registry.paths)})")
        try:
            future = worker.submit(parsed)
        except QueueFull as exc:
            raise ApiError(429, "overloaded", f"server busy: {exc}; retry later", {"Retry-After": "1"}) from None
        except RuntimeError as exc:
            raise ApiError(503, "unavailable", str(exc), {"Retry-After": "5"}) from None
        try:
            decision = await asyncio.wait_for(asyncio.wrap_future(future), timeout=config.request_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(503, "timeout", f"no answer within {config.request_timeout_s:g} s",
                           {"Retry-After": "5"}) from None
        except AdapterNotFound as exc:  # deleted while this request waited
            raise ApiError(404, "adapter_not_found", str(exc)) from None
        except AdapterError as exc:  # its folder no longer loads (reloaded after an eviction): this request only
            raise ApiError(400, "adapter_refused", str(exc)) from None
        if decision.error:
            err = decision.error
            if err.get("error_type") == "record_error":
                raise record_error_failure(RecordError(err.get("rule") or err.get("message", ""), field=err.get("field")),
                                           [q.field for q in parsed.questions])
            status, kind = ENGINE_ERRORS.get(err.get("error_type"), (400, "bad_request"))
            raise ApiError(status, kind, str(err.get("message")))
        return decision

    async def parse_canonical(body) -> object:
        """Canonical JSON -> Request in a worker thread (image decoding can take a while)."""
        if isinstance(body, dict) and body.get("images") and not supports_images:
            images = body["images"]
            n = len(images) if isinstance(images, list) else 1
            raise ApiError(400, "unsupported_modality",
                           f"field 'images': this model is text-only and cannot read images ({n} given); "
                           "use a vision-language model or remove the images")
        def parse():
            parsed = request_from_json(body)
            check_image_list(parsed.images, record_id=parsed.id)  # count and combined-size limits
            if parsed.images:
                engine.prepare_images(parsed)  # the processor runs here, not on the model's worker thread
            return parsed

        try:
            return await run_in_threadpool(parse)
        except SizeLimitError as exc:  # a size problem: 413 like an over-limit body, with both sizes
            raise ApiError(413, "payload_too_large", str(exc)) from None
        except RecordError as exc:
            raise record_error_failure(exc, _question_ids(body)) from None

    def finite(content: dict, status: int = 200) -> FiniteJSONResponse:
        try:
            return FiniteJSONResponse(content, status_code=status)
        except ValueError as exc:
            log.error("non-finite output: %s", exc)
            raise ApiError(500, "non_finite_output", "the model produced a non-finite number") from None

    # -- routes -----------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    async def demo_page():
        """The demo page."""
        return HTMLResponse(DEMO_HTML)

    @app.get("/healthz")
    async def healthz():
        """200 once the model is loaded and the worker runs; 503 otherwise."""
        ok = worker.alive
        return FiniteJSONResponse({"status": "ok" if ok else "unavailable", "model": config.model_name,
                                   "queue_depth": worker.depth}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics_text(request: Request):
        """Prometheus text format."""
        check_key(request.headers, config.api_key)
        metrics.set_queue_depth(worker.depth)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request):
        """The served model (Jev-compatible listing)."""
        check_key(request.headers, config.api_key)
        return {"models": [{"name": config.model_name, "description": config.description,
                            "release_date": config.release_date, "x_aliases": list(config.aliases),
                            "x_modalities": ["text", "image"] if supports_images else ["text"]}]}

    @app.get("/v1/limits")
    async def limits(request: Request):
        """This server's request limits (public, like ``/healthz``: the demo page reads its question cap here)."""
        from noulengine.records import images as image_limits

        return {"max_questions": {ROUTES[r]: config.question_cap(r) for r in ROUTES},
                "max_body_bytes": config.max_body_bytes,
                "images": {"accepted": supports_images, "max_images": image_limits.MAX_IMAGES,
                           "max_image_bytes": image_limits.MAX_IMAGE_BYTES,
                           "max_total_image_bytes": image_limits.MAX_TOTAL_IMAGE_BYTES,
                           "max_image_pixels": image_limits.MAX_IMAGE_PIXELS,
                           "types": list(image_limits.ALLOWED_MIME)}}

    @app.post("/v1/systemone")
    async def system_one(request: Request):
        """Jev-compatible decisions: ``{"model", "state", "questions"}`` -> ``{"model", "answers", "usage"}``."""
        check_key(request.headers, config.api_key)
        body = await read_json(request)
        if isinstance(body, dict) and body.get("model") is not None:
            model = body["model"]
            if not isinstance(model, str):
                raise ValidationFailure(["model"], f"model must be a string, got {type(model).__name__}", "string_type")
            if model not in accepted_models and model not in registry.paths:
                raise ApiError(404, "model_not_found", f"model {model!r} is not served here; "
                                                       f"use one of {sorted(accepted_models | set(registry.paths))}")
        adapter = body.get("model") if isinstance(body, dict) and body.get("model") in registry.paths else None
        canonical, legends = systemone.translate_request(body, config.question_cap("systemone"))
        if adapter is not None:  # the request's model names a served adapter: it answers, no other model
            canonical = {**canonical, "adapter": adapter}
        parsed = await parse_canonical(canonical)
        decision = await run_decision(parsed)
        try:
            content = systemone.jev_response(adapter or config.model_name, decision, legends)
        except ValueError as exc:
            log.error("non-finite output: %s", exc)
            raise ApiError(500, "non_finite_output", "the model produced a non-finite number") from None
        return finite(content)

    def escalation_options(body: dict) -> dict | None:
        """The request's escalation overrides (``{}``: the server's settings), or None for none.

        ``"escalate"``: absent (the server's default), ``true``, ``false``, or an object with
        ``below``, ``max``, ``deadline_s``. Raises 422 for a bad value, 400 when the server has
        no escalation endpoint but the request asks for one."""
        raw = body.get("escalate")
        if raw is None:
            return {} if config.escalation is not None and config.escalate_by_default else None
        if raw is False:
            return None
        if raw is not True and not isinstance(raw, dict):
            raise ValidationFailure(["escalate"], "escalate must be true, false or an object with below, max, "
                                                  f"deadline_s; got {type(raw).__name__}", "escalate_type")
        if config.escalation is None:
            raise ApiError(400, "escalation_unavailable", "this server has no escalation endpoint (start it with "
                                                          "--escalate-url); remove \"escalate\" from the request")
        options = {} if raw is True else dict(raw)
        try:
            config.escalation.with_overrides(options)
        except ValueError as exc:
            bad = next((k for k in options if k in str(exc)), None)
            raise ValidationFailure(["escalate"] + ([bad] if bad else []), str(exc), "escalate_option") from None
        return options

    def sse(event: str, data: dict) -> str:
        """One server-sent event (strict JSON: a non-finite number raises ValueError)."""
        return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"

    @app.post("/v1/decide")
    async def decide(request: Request):
        """Canonical requests (``state``, ``images``, ``questions``, ``id``) -> ``Decision.to_dict()``.

        ``"escalate"`` (see :func:`escalation_options`) hands questions under the confidence
        threshold to the server's LLM; ``"stream": true`` answers as server-sent events: one
        ``answer`` event per question as soon as it is final (the decision model's confident
        answers first, escalated ones as they land), then one ``done`` event with usage."""
        check_key(request.headers, config.api_key)
        t0 = time.perf_counter()
        body = await read_json(request)
        check_body(body, "/v1/decide", config.question_cap("decide"))  # the frame /v1/systemone checks too
        if "id" in body and body["id"] is not None:
            if not isinstance(body["id"], str):
                raise ValidationFailure(["id"], "id must be a string", "string_type")
            check_json_values(body["id"], ["id"])
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ValidationFailure(["stream"], f"stream must be true or false, got {type(stream).__name__}", "bool_type")
        options = escalation_options(body)
        parsed = await parse_canonical(body)
        decision = await run_decision(parsed)
        if not stream:
            if options is not None:
                decision = await escalator.escalate(decision, parsed, options)
            return finite({**decision.to_dict(), "adapter": parsed.adapter})

        async def events():
            final = {}
            pairs = (escalator.stream(decision, parsed, options) if options is not None
                     else _aiter(decision.answers.items()))
            try:
                async with contextlib.aclosing(pairs):  # a client that goes away cancels its LLM calls
                    async for fld, answer in pairs:
                        final[fld] = answer
                        yield sse("answer", {"field": fld, "answer": answer.to_dict()})
            except ValueError as exc:  # a non-finite number: say so in the stream, never send NaN
                log.error("non-finite output: %s", exc)
                yield sse("error", {"error_type": "non_finite_output", "message": "the model produced a non-finite number"})
                return
            except Exception as exc:  # noqa: BLE001 - the status line is sent: end the stream with an error event
                log.exception("stream failure")
                yield sse("error", {"error_type": "internal_error", "message": type(exc).__name__})
                return
            usage = {"input_tokens": decision.input_tokens}
            if options is not None:
                from noulengine.escalate.runner import summarize

                usage["escalation"] = summarize([final[f] for f in decision.answers if f in final],
                                                wall_s=time.perf_counter() - t0)
            yield sse("done", {"id": decision.id, "usage": usage, "latency_s": decision.latency_s,
                               "wall_s": time.perf_counter() - t0, "error": None, "adapter": parsed.adapter})

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/v1/adapters")
    async def adapters_list(request: Request):
        """The registered LoRA adapters, which are loaded, and the limits."""
        check_key(request.headers, config.api_key)
        return await run_in_threadpool(registry.describe)

    @app.post("/v1/adapters")
    async def adapters_load(request: Request):
        """Register and load ``{"name", "path"}``: a folder under ``--adapter-root``."""
        check_key(request.headers, config.api_key)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ValidationFailure([], f"the body must be an object with name and path, got {type(body).__name__}",
                                    "model_type")
        unknown = sorted(set(body) - {"name", "path"})
        if unknown:
            raise ValidationFailure([unknown[0]], f"unknown field {unknown[0]!r} (give name and path)", "extra_forbidden")
        for key in ("name", "path"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise ValidationFailure([key], f"{key} must be a non-empty string", "string_type")
        if not ADAPTER_NAME.match(body["name"]):
            raise ValidationFailure(["name"], "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
                                    "string_pattern_mismatch")
        try:
            folder = registry.resolve(body["path"])
        except AdapterAccessError as exc:
            raise ApiError(403, "forbidden", str(exc)) from None
        except AdapterError as exc:  # NUL bytes, over-long components, symlink loops
            raise ApiError(400, "adapter_refused", str(exc)) from None
        if body["name"] in registry.paths:
            raise ApiError(409, "adapter_exists", f"adapter {body['name']!r} is already registered; DELETE it first")
        try:
            info = await run_in_threadpool(registry.register, body["name"], folder)
        except AdapterAccessError as exc:  # a file of the folder links out of the root: nothing of it read
            raise ApiError(403, "forbidden", str(exc)) from None
        except AdapterExists as exc:  # a concurrent POST of the same name won
            raise ApiError(409, "adapter_exists", str(exc)) from None
        except AdapterError as exc:
            raise ApiError(400, "adapter_refused", str(exc)) from None
        app.openapi_schema = None  # /v1/systemone's model enum lists the adapters
        return info

    @app.delete("/v1/adapters/{name}")
    async def adapters_delete(name: str, request: Request):
        """Unregister and unload an adapter; later requests naming it, and those waiting, get 404.

        An adapter named at start-up (``--adapter``) is deleted only when run-time loading is on
        (``--adapter-root``), and then, like every adapter request, with the key when one is set;
        otherwise 403 (it could not be loaded back until a restart)."""
        check_key(request.headers, config.api_key)
        try:
            registry.deletable(name)
            await run_in_threadpool(registry.unregister, name)
        except AdapterAccessError as exc:
            raise ApiError(403, "forbidden", str(exc)) from None
        except AdapterError as exc:
            raise ApiError(404, "adapter_not_found", str(exc)) from None
        app.openapi_schema = None
        return {"deleted": name}

    app.add_middleware(BodyLimitMiddleware, max_body_bytes=config.max_body_bytes, body_timeout_s=config.body_timeout_s)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(InternalErrorMiddleware, log=log)  # outermost of ours: a 500 never closes the connection
    return app
