"""Typed (pydantic) models of the HTTP bodies, and the OpenAPI document built from them.

The routes still parse bodies by hand (strict JSON: no NaN/Infinity or duplicate keys, 415 for
other content types, the rule-naming 422 ``detail[]`` shape and the status codes the Jev contract
fixes). These models declare what those parsers accept and what the routes answer, so that
``GET /openapi.json`` describes the service: clients generate bindings from it and
schema-based fuzzers start from it (``tests/test_serve_openapi.py`` checks every answer of the
service against it, and that the service accepts every body the document admits).

Every request rule JSON Schema can state is in the document: non-blank labels and instructions
(``propertyNames``, ``pattern``), noul criteria keys one per side, score maps keyed exactly
``0..n-1``, description types, counts. What no JSON Schema states is refused by the routes alone:
422 for a non-finite number (``1e400``), a lone-surrogate escape, nesting deeper than 512,
duplicate keys, an image that does not decode, an escalation budget above this server's, or a
question a forced ``--readout`` cannot read (``label-token`` with labels whose first tokens
collide in this model's vocabulary, ``symbols`` with more options than symbols); 400 for images on
a text-only model, escalation on a server without an LLM, text the tokenizer refuses; 413 for a
body, image or prompt over a limit.

The per-route question caps are server settings (``noulengine serve --max-questions``):
:func:`openapi_document` writes this server's caps into ``maxProperties``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import GenerateJsonSchema

from noulengine.records.images import ALLOWED_MIME, MAX_IMAGES
from noulengine.records.schema import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS

# -- shared pieces ------------------------------------------------------------------------------

PY_WHITESPACE_CLASS = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""The characters ``str.strip()`` removes (``str.isspace``), as the inside of a regex class that
Python and ECMA-262 read alike. The server calls a label or instructions blank by Python's rule;
JSON Schema patterns are ECMA-262, whose ``\\s`` differs (it lacks U+001C-U+001F and U+0085 and
adds U+FEFF), so ``\\S`` would admit a label the server refuses. A test checks it against
``str.isspace`` over every code point."""

NON_BLANK_PATTERN = f"[^{PY_WHITESPACE_CLASS}]"
"""Matches a string with at least one character ``str.strip()`` keeps."""

NonBlank = Annotated[str, StringConstraints(pattern=NON_BLANK_PATTERN)]
"""A string with at least one non-whitespace character (Python's whitespace)."""

_B64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
"""Standard base64 as :func:`noulengine.records.images.strict_b64decode` takes it: no whitespace,
padding only at the end, a length that is a multiple of 4."""

JsonText = Union[str, dict[str, Any], list[Any]]
"""Text the engine reads: a string as it is, an object or array rendered as JSON."""

Description = Union[str, dict[str, Any], list[Any], None]

Instructions = Union[NonBlank, Annotated[dict[str, Any], Field(min_length=1)], Annotated[list[Any], Field(min_length=1)]]

JevInstructions = Union[str, Annotated[dict[str, Any], Field(min_length=1)], Annotated[list[Any], Field(min_length=1)], None]
"""The Jev contract's instructions: missing, null or blank ones are filled in (choice, score) or
taken from the criteria (noul)."""

Probability = Annotated[float, Field(ge=0.0, le=1.0)]

_NON_BLANK_TEXT = {"anyOf": [{"type": "string", "pattern": NON_BLANK_PATTERN}, {"type": "object", "minProperties": 1},
                             {"type": "array", "minItems": 1}]}
_NOUL_NEEDS = {"anyOf": [
    {"required": ["instructions"], "properties": {"instructions": _NON_BLANK_TEXT}},
    {"required": ["criteria"], "properties": {"criteria": {"type": "object", "anyOf": [
        {"required": ["true"], "properties": {"true": {"not": {"type": "null"}}}},
        {"required": ["false"], "properties": {"false": {"not": {"type": "null"}}}}]}}},
]}

State = Annotated[Any, Field(description="The evidence: any JSON value (a plain string is read as text).")]


class ImageObject(BaseModel):
    """An image inline: its MIME type and base64 bytes (a ``data:`` URL in ``data`` is accepted too)."""

    model_config = ConfigDict(extra="allow")
    type: Literal[ALLOWED_MIME]
    data: Annotated[str, StringConstraints(pattern=rf"^(?:data:image/[a-z0-9.+-]+;base64,)?{_B64}$")] = Field(
        description="Base64 (standard alphabet, padded), or a data: URL (its media type is not read: "
                    "`type` says what the bytes are).")


ImageIn = Union[ImageObject, Annotated[str, StringConstraints(
    pattern=rf"^data:(?:{'|'.join(map(re.escape, ALLOWED_MIME))});base64,{_B64}$")]]
Images = Annotated[Union[Annotated[list[ImageIn], Field(max_length=MAX_IMAGES)], None], Field(
    description="Images, in order: `{type, data}` objects or base64 `data:` URLs (never paths or remote URLs). "
                "A text-only model answers them 400 unsupported_modality.")]


# -- /v1/systemone request (the Jev contract) -----------------------------------------------------

class JevNoulCriteria(BaseModel):
    """What ``true`` and ``false`` mean."""

    model_config = ConfigDict(extra="forbid")
    true: Description = None
    false: Description = None


class JevNoulQuestion(BaseModel):
    """A yes/no question. Needs ``instructions`` or a non-null ``criteria.true`` / ``criteria.false``."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_NOUL_NEEDS)
    type: Literal["noul"]
    instructions: JevInstructions = None
    criteria: Union[JevNoulCriteria, None] = None


class JevChoiceQuestion(BaseModel):
    """One option of an ordered option name -> description object (2 to 255 options)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["choice"]
    instructions: JevInstructions = None
    criteria: Annotated[dict[NonBlank, Description],
                        Field(min_length=2, max_length=MAX_CHOICE_OPTIONS)]


class JevScoreQuestion(BaseModel):
    """An ordinal level ``0..n-1`` of an ordered list of level descriptions (2 to 10 levels)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["score"]
    instructions: JevInstructions = None
    criteria: Annotated[list[JsonText], Field(min_length=2, max_length=MAX_SCORE_LEVELS)]


JevQuestion = Annotated[Union[JevNoulQuestion, JevChoiceQuestion, JevScoreQuestion], Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    """A Jev request. Unknown top-level fields and unknown keys inside a question are ignored."""

    model_config = ConfigDict(extra="allow")
    model: Union[str, None] = Field(None, description="The served name, `jev-latest` or `noul`; omitted: the served model.")
    state: State
    questions: Annotated[dict[Annotated[str, StringConstraints(min_length=1)], JevQuestion], Field(min_length=1)]
    images: Images = None


# -- /v1/decide request (the canonical format) -------------------------------------------------

_YES_KEY = "[Tt][Rr][Uu][Ee]|[Yy][Ee][Ss]"
_NO_KEY = "[Ff][Aa][Ll][Ss][Ee]|[Nn][Oo]"
# one key per side: two keys that are not both yes-side and not both no-side are one of each
# (a key names its side whatever its description, null included)
_ONE_PER_SIDE = {"anyOf": [{"maxProperties": 1}, {"allOf": [{"not": {"propertyNames": {"pattern": f"^({_YES_KEY})$"}}},
                                                           {"not": {"propertyNames": {"pattern": f"^({_NO_KEY})$"}}}]}]}

NoulCriteria = Annotated[dict[Annotated[str, StringConstraints(pattern=f"^({_YES_KEY}|{_NO_KEY})$")], Union[str, None]],
                         Field(max_length=2, json_schema_extra=_ONE_PER_SIDE)]
"""``true``/``false`` or ``yes``/``no`` keys (any case), at most one per side."""

# exactly "0".."n-1" for one n in 2..MAX_SCORE_LEVELS: the required keys and no others
_SCORE_KEYS_EXACT = {"anyOf": [{"required": [str(i) for i in range(n)], "maxProperties": n}
                               for n in range(2, MAX_SCORE_LEVELS + 1)]}
ScoreMap = Annotated[dict[Annotated[str, StringConstraints(pattern=f"^({'|'.join(map(str, range(MAX_SCORE_LEVELS)))})$")],
                          Union[str, None]],
                     Field(min_length=2, max_length=MAX_SCORE_LEVELS, json_schema_extra=_SCORE_KEYS_EXACT)]
"""Level descriptions keyed exactly ``"0".."n-1"`` (any key order)."""


class NoulQuestion(BaseModel):
    """A yes/no question; ``criteria`` keys are ``true``/``false`` or ``yes``/``no`` (any case, one per side)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["noul"]
    instructions: Instructions
    criteria: Union[NoulCriteria, None] = None
    answer: Any = Field(None, description="Legacy gold label (evaluation only); never reaches the model.")


class ChoiceQuestion(BaseModel):
    """One label of an ordered label -> description object (2 to 255 labels)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["choice"]
    instructions: Instructions
    criteria: Annotated[dict[NonBlank, Union[str, None]], Field(min_length=2, max_length=MAX_CHOICE_OPTIONS)]
    answer: Any = Field(None, description="Legacy gold label (evaluation only); never reaches the model.")


class ScoreQuestion(BaseModel):
    """A level ``0..n-1`` (2 to 10 levels): a list of level descriptions, or an object keyed exactly ``"0".."n-1"``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["score"]
    instructions: Instructions
    criteria: Union[Annotated[list[Union[str, None]], Field(min_length=2, max_length=MAX_SCORE_LEVELS)], ScoreMap]
    answer: Any = Field(None, description="Legacy gold label (evaluation only); never reaches the model.")


Question = Annotated[Union[NoulQuestion, ChoiceQuestion, ScoreQuestion], Field(discriminator="type")]


class EscalateOptions(BaseModel):
    """Per-request escalation overrides."""

    model_config = ConfigDict(extra="forbid")
    below: Union[Annotated[float, Field(gt=0.0, le=1.0, strict=True)], None] = Field(
        None, description="Escalate questions whose confidence (max p) is under this; null: the server's.")
    max: Union[Annotated[int, Field(ge=0, strict=True)], None] = Field(
        None, description="Escalations per request at most (may only lower the server's --escalate-max).")
    deadline_s: Union[Annotated[float, Field(gt=0.0, strict=True)], None] = Field(
        None, description="Seconds for this request's escalations in all (may only lower the server's).")


class DecideRequest(BaseModel):
    """A canonical request. Unknown top-level keys are metadata that never reaches the model;
    an unknown key inside a question is refused (422 naming it)."""

    model_config = ConfigDict(extra="allow")
    id: Union[str, None] = Field(None, description="Echoed in the answer; never reaches the model.")
    state: State
    questions: Annotated[dict[Annotated[str, StringConstraints(min_length=1)], Question], Field(min_length=1)]
    images: Images = None
    escalate: Union[bool, EscalateOptions, None] = Field(
        None, description="Hand questions under a confidence threshold to the server's LLM (--escalate-url): true "
                          "(the server's settings), false (never), or overrides; omitted: the server's default. "
                          "400 escalation_unavailable on a server without an LLM.")
    adapter: Union[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")], None] = Field(
        None, description="The LoRA adapter that answers (GET /v1/adapters); null or omitted: the served model. A name "
                          "this server has not registered: 404 adapter_not_found.")
    stream: bool = Field(False, description="true: answer as server-sent events (text/event-stream): an 'answer' "
                                            "event per question as soon as it is final, then a 'done' event.")


# -- /v1/systemone response ---------------------------------------------------------------------

class JevNoulAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["noul"]
    noul: Probability = Field(description="P(true).")


class JevChoiceAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["choice"]
    choice: str = Field(description="The most probable option.")
    probabilities: dict[str, Probability] = Field(description="Option name -> p, in criteria order.")
    confidence: Probability = Field(description="(max p - 1/n) / (1 - 1/n).")


class JevScoreAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["score"]
    score: Annotated[float, Field(ge=0.0)] = Field(description="The expected level.")
    legend: dict[str, JsonText] = Field(description="Level -> its description as given.")
    probabilities: dict[str, Probability] = Field(description="Level (\"0\", \"1\", ...) -> p.")
    confidence: Probability = Field(description="1 - spread around the mode / the uniform distribution's spread.")
    x_level: str = Field(description="The most probable level.")
    x_level_text: JsonText = Field(description="That level's description.")


JevAnswer = Annotated[Union[JevNoulAnswer, JevChoiceAnswer, JevScoreAnswer], Field(discriminator="type")]


class JevUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_tokens: Annotated[int, Field(ge=0)]
    output_tokens: Literal[0]


class SystemOneResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="The served model's name.")
    answers: dict[str, JevAnswer] = Field(description="Question id -> answer, in question order.")
    usage: JevUsage


# -- /v1/decide response ------------------------------------------------------------------------

class EscalationRecord(BaseModel):
    """What happened to one question under the escalation threshold."""

    model_config = ConfigDict(extra="forbid")
    status: Literal["escalated", "invalid_answer", "timeout", "unreachable", "http_error", "bad_response",
                    "budget", "deadline"]
    below: Probability
    model_label: str
    model_confidence: Probability
    llm_model: str
    llm_label: Union[str, None]
    reason: Union[str, None] = Field(description="Why the decision model's answer stands (null when escalated).")
    usage: dict[str, Annotated[int, Field(ge=0)]] = Field(description="The LLM's token counts, as it reports them.")
    latency_s: Union[Annotated[float, Field(ge=0.0)], None]
    llm_text: Union[str, None] = Field(None, description="The LLM's raw answer (first 500 characters).")
    changed: Union[bool, None] = Field(None, description="Escalated: whether the LLM's label differs from the model's.")
    called: Union[bool, None] = Field(None, description="Deadline: whether the LLM call had begun.")


class EscalationUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    escalated: Annotated[int, Field(ge=0)] = Field(description="Questions answered by the LLM.")
    sent: Annotated[int, Field(ge=0)] = Field(description="Questions sent to the LLM.")
    kept: dict[str, Annotated[int, Field(ge=0)]] = Field(description="Status -> questions where the model's answer stood.")
    prompt_tokens: Annotated[int, Field(ge=0)]
    completion_tokens: Annotated[int, Field(ge=0)]
    wall_s: Union[Annotated[float, Field(ge=0.0)], None]


class _EngineAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[str] = Field(description="Candidate labels in criteria order.")
    probabilities: dict[str, Probability] = Field(description="Label -> p (after temperature), summing to 1.")
    confidence: Probability = Field(description="max p.")
    label: str = Field(description="The answer: the argmax label, or the LLM's label when source is 'escalated'.")
    logprobs: list[float] = Field(description="The candidates' log-probabilities before temperature.")
    x_mass: Annotated[float, Field(ge=0.0)] = Field(description="The candidates' raw probability mass before "
                                                               "renormalisation (near 0: the model wanted to say something else).")
    readout: str
    temperature: Annotated[float, Field(gt=0.0)]
    debias: str
    flip_rate: Union[Probability, None] = Field(None, description="With permutation debiasing only.")
    source: Literal["model", "escalated"] = Field(description="Who chose 'label': the decision model or the LLM.")
    escalation: Union[EscalationRecord, None] = Field(None, description="Questions under the threshold only.")


class NoulAnswer(_EngineAnswer):
    type: Literal["noul"]
    noul: Probability = Field(description="P(yes).")


class ChoiceAnswer(_EngineAnswer):
    type: Literal["choice"]
    choice: str = Field(description="The answer (as label).")


class ScoreAnswer(_EngineAnswer):
    type: Literal["score"]
    score: Annotated[float, Field(ge=0.0)] = Field(description="The expected level.")
    level_texts: dict[str, Union[str, None]] = Field(description="Level -> its description as given.")
    level_text: Union[str, None] = Field(description="The argmax level's description.")


EngineAnswer = Annotated[Union[NoulAnswer, ChoiceAnswer, ScoreAnswer], Field(discriminator="type")]


class DecideUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_tokens: Annotated[int, Field(ge=0)]
    escalation: Union[EscalationUsage, None] = None


class DecideResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Union[str, None]
    adapter: Union[str, None] = Field(None, description="The LoRA adapter that answered (null: the served model).")
    answers: dict[str, EngineAnswer] = Field(description="Question id -> answer, in question order.")
    usage: DecideUsage
    latency_s: Annotated[float, Field(ge=0.0)]
    error: None = Field(description="Always null in a 200 answer.")


class StreamAnswerEvent(BaseModel):
    """The data of an ``answer`` server-sent event (``"stream": true`` on ``/v1/decide``)."""

    model_config = ConfigDict(extra="forbid")
    field: str = Field(description="The question id.")
    answer: EngineAnswer


class StreamDoneEvent(BaseModel):
    """The data of the closing ``done`` server-sent event."""

    model_config = ConfigDict(extra="forbid")
    id: Union[str, None]
    usage: DecideUsage
    latency_s: Annotated[float, Field(ge=0.0)] = Field(description="The decision model's seconds for the request.")
    wall_s: Annotated[float, Field(ge=0.0)] = Field(description="Seconds from the request's arrival to this event.")
    error: None
    adapter: Union[str, None] = Field(None, description="The LoRA adapter that answered (null: the served model).")


class StreamErrorEvent(BaseModel):
    """The data of an ``error`` event (a non-finite number met while streaming; the stream ends)."""

    model_config = ConfigDict(extra="forbid")
    error_type: str
    message: str


STREAM_EVENTS = {"answer": StreamAnswerEvent, "done": StreamDoneEvent, "error": StreamErrorEvent}


def sse_event_schema() -> dict:
    """One server-sent event of ``/v1/decide``'s stream, as OpenAPI's ``text/event-stream``
    schema: the ``event`` name and its JSON ``data`` (``contentSchema`` by event)."""
    return {"type": "object", "required": ["event", "data"],
            "properties": {"event": {"type": "string", "enum": list(STREAM_EVENTS)},
                           "data": {"type": "string", "contentMediaType": "application/json",
                                    "contentSchema": {"oneOf": [_ref(m.__name__) for m in STREAM_EVENTS.values()]}},
                           "id": {"type": "string"}, "retry": {"type": "integer"}}}


# -- errors -------------------------------------------------------------------------------------

class ValidationItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    loc: list[Union[str, int]] = Field(description='Where: ["body", field, ...].')
    msg: str = Field(description="The rule broken.")
    type: str = Field(description="The kind of rule (missing, literal_error, too_long, finite_number, ...).")


class ValidationErrorResponse(BaseModel):
    """422: the body breaks a rule."""

    model_config = ConfigDict(extra="forbid")
    detail: list[ValidationItem] = Field(min_length=1)


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    error_type: str
    message: str


class ErrorResponse(BaseModel):
    """Every other error."""

    model_config = ConfigDict(extra="forbid")
    detail: ErrorDetail


# -- the other routes ---------------------------------------------------------------------------

class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    release_date: str
    x_aliases: list[str]
    x_modalities: list[Literal["text", "image"]]


class ModelsResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[ModelInfo]


class AdapterInfo(BaseModel):
    """One registered LoRA adapter (noulengine/serve/adapters.py)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    path: str
    loaded: bool = Field(description="Loaded on the model now (false: evicted, loaded again when a request names it).")
    requests: Annotated[int, Field(ge=0)] = Field(description="Engine calls (batches) that served it since the server started.")
    ranks: Union[list[int], None] = None
    modules: Union[int, None] = None
    bytes: Union[int, None] = None
    base: Union[str, None] = None
    calibrated: Union[bool, None] = None


class AdaptersResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adapters: list[AdapterInfo]
    max_loaded: Union[int, None] = Field(description="--max-loaded-adapters (null: no limit).")
    max_adapter_bytes: Union[int, None] = Field(
        None, description="--max-adapter-bytes: one adapter's factors at most, in bytes as stored (null: no cap).")
    root: Union[str, None] = Field(description="--adapter-root: POST /v1/adapters loads from under it (null: off).")
    evictions: Annotated[int, Field(ge=0)]


class AdapterLoadRequest(BaseModel):
    """``POST /v1/adapters``: register and load the adapter in a folder under ``--adapter-root``."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    path: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="The folder, relative to --adapter-root (or absolute, inside it).")


class AdapterDeleted(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deleted: str


class ImageLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    accepted: bool
    max_images: int
    max_image_bytes: int
    max_total_image_bytes: int
    max_image_pixels: int
    types: list[str]


class LimitsResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_questions: dict[str, Union[Annotated[int, Field(ge=1)], None]]
    max_body_bytes: int
    images: ImageLimits


class HealthResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: Literal["ok", "unavailable"]
    model: str
    queue_depth: Annotated[int, Field(ge=0)]


# -- the document -------------------------------------------------------------------------------

_ERROR_TEXT = {
    400: "Unsupported modality (images on a text-only model), a request the tokenizer cannot take, "
         "escalation asked of a server without an LLM, or an adapter folder that cannot be loaded "
         "(adapter_refused: the message names the file, the field and the rule).",
    401: "Missing or wrong API key.",
    403: "Loading adapters at run time is off here (no --adapter-root), the folder or a file in it lies outside "
         "the root, or an adapter named at start-up cannot be deleted while run-time loading is off.",
    404: "Unknown model, adapter or route item.",
    409: "An adapter of that name is already registered.",
    408: "The body was not received in time.",
    413: "The body, an image or the prompt is over a limit.",
    415: "A Content-Type other than application/json.",
    422: "The body breaks a rule: detail[] names the field (loc) and the rule (msg, type).",
    429: "The queue is full (Retry-After).",
    500: "The model produced a non-finite number (never the client's fault).",
    503: "The worker is stopped or no answer came in time (Retry-After).",
}

# route -> (method, request model or None, 200 model, error statuses, needs the key)
ROUTE_MODELS = {
    "/v1/systemone": ("post", SystemOneRequest, SystemOneResponse,
                      (400, 401, 404, 408, 413, 415, 422, 429, 500, 503), True),
    "/v1/decide": ("post", DecideRequest, DecideResponse, (400, 401, 404, 408, 413, 415, 422, 429, 500, 503), True),
    "/v1/models": ("get", None, ModelsResponse, (401,), True),
    "/v1/limits": ("get", None, LimitsResponse, (), False),
    "/healthz": ("get", None, HealthResponse, (), False),
}
# routes sharing a path with another method: (path, method, request model, 200 model, errors, needs the key)
ADAPTER_ROUTES = [
    ("/v1/adapters", "get", None, AdaptersResponse, (401,), True),
    ("/v1/adapters", "post", AdapterLoadRequest, AdapterInfo, (400, 401, 403, 408, 409, 413, 415, 422), True),
    ("/v1/adapters/{name}", "delete", None, AdapterDeleted, (401, 403, 404), True),
]
_CAP_ROUTES = {"/v1/systemone": "systemone", "/v1/decide": "decide"}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


class ClosedKeysJsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema generator, with one change: an object whose key type has a pattern.

    pydantic writes ``dict[Annotated[str, pattern], V]`` as ``patternProperties``, which admits
    every key that does not match, with any value (a ``""`` label with a boolean description).
    The routes refuse such keys, so here the pattern goes to ``propertyNames`` and ``V`` to
    ``additionalProperties``, as pydantic itself validates the dict.
    """

    def dict_schema(self, schema):
        out = super().dict_schema(schema)
        patterns = out.pop("patternProperties", None)
        if patterns:
            (pattern, values), = patterns.items()  # one key type, one pattern
            out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
            out["additionalProperties"] = values
        return out


def component_schemas() -> dict:
    """Every model's JSON Schema (2020-12, as OpenAPI 3.1 takes it), keyed by component name."""
    from pydantic.json_schema import models_json_schema

    models = {m for _, req, resp, _, _ in ROUTE_MODELS.values() for m in (req, resp) if m is not None}
    models |= {m for _, _, req, resp, _, _ in ADAPTER_ROUTES for m in (req, resp) if m is not None}
    models |= {ValidationErrorResponse, ErrorResponse, *STREAM_EVENTS.values()}
    _, top = models_json_schema([(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
                                ref_template="#/components/schemas/{model}", schema_generator=ClosedKeysJsonSchema)
    return top["$defs"]


def openapi_document(base: dict, caps: dict, keyed: bool, models: tuple = (), *, images: bool = True,
                     escalation: bool = True) -> dict:
    """FastAPI's generated document (paths, info) with the two POST routes' bodies and every
    route's answers declared from the models above; ``caps`` (``{"decide": 16, ...}``, None for
    no cap) become ``maxProperties`` of each route's ``questions``; ``keyed`` adds the API-key
    security schemes to the routes that need the key; ``models`` (the accepted model names) become
    the enum of ``/v1/systemone``'s ``model``. The document offers only what this server can do:
    without ``images`` (a text-only model) a request's ``images`` may only be null, and without
    ``escalation`` (no ``--escalate-url``) ``/v1/decide``'s ``escalate`` may only be false or null,
    so a client generated from it never sends what the server answers 400 (issue #46)."""
    doc = dict(base)
    components = dict(doc.get("components") or {})
    schemas = dict(components.get("schemas") or {})
    schemas.update(component_schemas())
    if models:
        model = schemas["SystemOneRequest"]["properties"]["model"]
        schemas["SystemOneRequest"]["properties"]["model"] = {
            **model, "anyOf": [{"type": "string", "enum": sorted(models)}, {"type": "null"}],
            "description": "One of the names this server accepts (its own and the aliases, GET /v1/models); "
                           "null or omitted: the served model. Any other name: 404 model_not_found."}
    for route, name in _CAP_ROUTES.items():
        cap = caps.get(name)
        req = ROUTE_MODELS[route][1].__name__
        questions = dict(schemas[req]["properties"]["questions"])
        questions.pop("maxProperties", None)
        if cap is not None:
            questions["maxProperties"] = cap
        questions["description"] = (f"Question id -> question, 1 to {cap} (this server's --max-questions "
                                    f"{name}={cap})." if cap is not None else "Question id -> question (no cap here).")
        schemas[req] = {**schemas[req], "properties": {**schemas[req]["properties"], "questions": questions}}
    if not images:
        for req in ("SystemOneRequest", "DecideRequest"):
            props = dict(schemas[req]["properties"])
            props["images"] = {"type": "null", "description": "This server's model is text-only: a request with "
                                                              "images gets 400 unsupported_modality; null or omitted."}
            schemas[req] = {**schemas[req], "properties": props}
    if not escalation:
        props = dict(schemas["DecideRequest"]["properties"])
        props["escalate"] = {"anyOf": [{"const": False}, {"type": "null"}],
                             "description": "This server has no LLM to escalate to (no --escalate-url): false or "
                                            "null only; true or options get 400 escalation_unavailable."}
        schemas["DecideRequest"] = {**schemas["DecideRequest"], "properties": props}
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    components["schemas"] = schemas
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"},
                                         "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    doc["components"] = components
    paths = {p: dict(ops) for p, ops in (doc.get("paths") or {}).items()}
    for route, method, req, resp, errors, needs_key in [(r, *v) for r, v in ROUTE_MODELS.items()] + ADAPTER_ROUTES:
        op = dict(paths.get(route, {}).get(method) or {})
        if req is not None:
            op["requestBody"] = {"required": True, "content": _json(_ref(req.__name__))}
        responses = {"200": {"description": "OK", "content": _json(_ref(resp.__name__))}}
        if route == "/v1/decide":
            responses["200"]["description"] = ("OK: one JSON answer, or with \"stream\": true server-sent events "
                                               "(event 'answer': {field, answer}; then event 'done': {id, usage, "
                                               "latency_s, wall_s, error})")
            responses["200"]["content"]["text/event-stream"] = {"schema": sse_event_schema()}
        for status in errors:
            model = "ValidationErrorResponse" if status == 422 else "ErrorResponse"
            responses[str(status)] = {"description": _ERROR_TEXT[status], "content": _json(_ref(model))}
        if route == "/healthz":
            responses["503"] = {"description": "The worker is not running.", "content": _json(_ref(resp.__name__))}
        op["responses"] = responses
        if keyed and needs_key:
            op["security"] = [{"bearer": []}, {"apiKey": []}]
        paths.setdefault(route, {})[method] = op
    doc["paths"] = paths
    return doc
