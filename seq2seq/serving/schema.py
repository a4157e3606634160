"""What the server's OpenAPI schema (``GET /openapi.json``) says of each route: request bodies,
answers and every error, as pydantic models.

The handlers read their bodies themselves (``server.parse``: one-paragraph messages, a byte-order
mark, deep nesting and huge integers refused as 4xx), so FastAPI cannot infer the bodies from
their signatures; the routes declare them here instead, with this server's limits (sentences a
request, characters a sentence, the largest beam, the models served) written into the request
schema, so that a client or a schema-driven tester can build valid requests from it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorAnswer(BaseModel):
    """Every 4xx and 5xx: one sentence naming the field at fault and how to fix it."""

    model_config = ConfigDict(extra="forbid")
    error: str


class Alternative(BaseModel):
    tgt: str
    pred_score: float


class AttentionMap(BaseModel):
    src_tokens: list[str]
    tgt_tokens: list[str]
    weights: list[list[float]] = Field(
        description="(len(tgt_tokens), len(src_tokens)): row j is where target token j looked"
    )


class Result(BaseModel):
    """One sentence's answer; the optional fields come only when asked for (or, ``truncated``,
    when the source was cut to the model's longest input)."""

    src: str
    tgt: str
    truncated: bool | None = None
    unknown: list[str] | None = Field(
        None,
        description="the source's words the vocabulary lacks (the model read them as <unk>), "
        "each once, in order; only where there are any",
    )
    pred_score: float | None = None
    n_best: list[Alternative] | None = None
    attention: AttentionMap | None = None


class TranslateAnswer(BaseModel):
    model: str
    results: list[Result]


class ModelDescription(BaseModel):
    name: str
    architecture: str
    decoder: str | None
    scoring: str
    scaled: bool | None
    normalizer: str
    alpha: float | str | None
    window: str
    window_size: int | None
    key_bias: bool
    coverage: bool
    input_feeding: bool
    num_heads: int | None
    parameters: int
    backend: str
    src_vocab_size: int
    tgt_vocab_size: int


class ModelsAnswer(BaseModel):
    models: list[ModelDescription]


class HealthAnswer(BaseModel):
    """200 when every model is loaded (``ready``, with the requests pending per model); 503
    while they load (``loading (n of m models loaded)``) or when one could not be (``failed``,
    with the reason)."""

    status: str
    models: list[str] | None = None
    pending: dict[str, int] | None = None
    error: str | None = None


class LiveAnswer(BaseModel):
    status: str


class ExploreAnswer(BaseModel):
    """The explorer's data for one sentence (``seq2seq.explorer.explorer_data``'s shape): the
    models' descriptions, and the sentence with each model's translation and attention."""

    models: list[dict[str, Any]]
    sentence: dict[str, Any]


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that may answer these error statuses, each ``ErrorAnswer``."""
    return {status: {"model": ErrorAnswer, "description": WHY[status]} for status in statuses}


WHY = {
    400: "the body is not UTF-8 JSON, or nests or counts beyond what the parser takes",
    401: "an API key is required: Authorization: Bearer KEY",
    404: "no such model",
    405: "the method is not allowed on this route",
    408: "the body did not arrive within --body-timeout",
    413: "the body, or the work or attention it asks for, is over a limit",
    415: "the Content-Type is not JSON (application/json; none is read as JSON too)",
    422: "a field is missing, of the wrong type or out of its range; the error names it",
    500: "the model failed on this request; the server goes on",
    503: "the models are not loaded yet, the queue or the connections are full (Retry-After), "
    "or the server is shutting down",
    504: "the request was not answered within --request-timeout; what the model had not "
    "started of it was dropped",
}


def translate_request_schema(
    models: list[str],
    max_sentences: int,
    max_chars: int,
    max_beam_size: int,
    ctranslate2_models: Sequence[str] = (),
) -> dict[str, Any]:
    """POST /translate's body as JSON Schema, with this server's models and limits. The rules
    between fields are written out too, as JSON Schema can: n_best at most beam_size (one
    clause per beam size; beam_size left out is 1), no coverage penalty for a CTranslate2
    model."""
    n_best_within_beam = [
        {
            "if": {"properties": {"beam_size": {"const": beam}}, "required": ["beam_size"]},
            "then": {"properties": {"n_best": {"maximum": beam}}},
        }
        for beam in range(1, max_beam_size + 1)
    ]
    default_beam = {
        "if": {"not": {"required": ["beam_size"]}},
        "then": {"properties": {"n_best": {"maximum": 1}}},
    }
    no_coverage = [
        {
            "if": {"properties": {"model": {"const": name}}, "required": ["model"]},
            "then": {"properties": {"coverage_penalty": {"maximum": 0}}},
        }
        for name in ctranslate2_models
    ]
    if len(models) == 1 and ctranslate2_models:  # the model may be left out: it is that one
        no_coverage.append(
            {
                "if": {"not": {"required": ["model"]}},
                "then": {"properties": {"coverage_penalty": {"maximum": 0}}},
            }
        )
    return {
        "allOf": [*n_best_within_beam, default_beam, *no_coverage],
        "type": "object",
        "additionalProperties": False,
        "required": ["src"] if len(models) == 1 else ["model", "src"],
        "properties": {
            # One model: it may be left out (or null); several: the request names one.
            "model": {"type": ["string", "null"], "enum": [*models, None]}
            if len(models) == 1
            else {"type": "string", "enum": models},
            "src": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_sentences,
                "items": {"type": "string", "maxLength": max_chars},
                "description": "the sentences, translated in order; a blank one gives ''",
            },
            "beam_size": {"type": "integer", "minimum": 1, "maximum": max_beam_size, "default": 1},
            "length_penalty": {"type": "number", "minimum": 0, "maximum": 10, "default": 0.6},
            "coverage_penalty": {
                "type": "number",
                "minimum": 0,
                "maximum": 10,
                "default": 0,
                "description": "GNMT's β; 0 for a CTranslate2 model",
            },
            "n_best": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": max_beam_size,
                "description": "at most beam_size",
            },
            "return_attention": {"type": "boolean", "default": False},
            "return_scores": {"type": "boolean", "default": False},
        },
    }


def explore_request_schema(max_chars: int) -> dict[str, Any]:
    """POST /explore's body: one non-blank sentence."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["src"],
        "properties": {
            "src": {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": r"\S"}
        },
    }


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A route's ``openapi_extra`` declaring its JSON request body."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
