"""POST /v1/embeddings: texts' vectors under a condition, in OpenAI's request and response shape.

Clients that speak OpenAI's embeddings API (the ``openai`` package, LangChain's and LlamaIndex's
OpenAI embeddings) point their base URL at ``http://HOST:PORT/v1`` and send the condition as the
extension field ``"condition"`` (the ``openai`` client: ``extra_body={"condition": ...}``). A
condition is required: every condsearch vector is a text's under a condition, and there is no
unconditional one to fall back on.

``"model"`` names what encodes: an index, a corpus or a model id, as ``GET /indexes`` lists them
(:func:`choose_model`); it may name none of them where every served index has one model. The vectors
are those :meth:`condsearch.Model.encode` gives for the same texts and condition, from the model the
chosen index was built with, run as the server runs it (:mod:`condsearch.query.resident`).

A request is counted in tokens and split as ``POST /query``'s is: its parts (:class:`EmbedJob`) go
through the server's bulk lane in turn with large queries (:func:`answer_jobs`,
:class:`condsearch.serve.batching.Lanes`), so a large request holds none of them up for longer than one
part, and no light query at all.

``GET /v1/models`` lists, in OpenAI's shape, the names ``"model"`` takes that name a model
(:func:`model_name`): a model's id, and for a router corpus its router beside it
(``MODEL+router:ROUTER``), which is also the ``"model"`` an answer names.

Its errors, one line each as everywhere, come in OpenAI's shape (:class:`OpenAIErrors`), where the
``openai`` client reads the message to show, ``param`` naming the field refused.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from condsearch.errors import StoreError, UnknownCondition
from condsearch.model import Vectorizer
from condsearch.model.artifacts import MODE_CSR
from condsearch.query import QueryJob, Resident, estimate_tokens, vectorizer_key
from condsearch.serve.batching import Lanes
from condsearch.serve.config import ServeConfig
from condsearch.serve.limits import ASGIApp, Message, Receive, Scope, Send
from condsearch.serve.paths import hide_paths
from condsearch.serve.refusals import RequestError, check_request_condition, check_text
from condsearch.serve.statuses import error_responses
from condsearch.store import Listing, Manifest, condition_key

#: what a client that sends token ids is told (LangChain's OpenAIEmbeddings sends them unless told not to)
TOKEN_IDS = (
    "input: token ids are not accepted, send texts (the server tokenizes them with the model's own "
    "tokenizer; LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))"
)
NO_CONDITION = (
    'condition is required: condsearch embeds a text under a condition; send it as "condition" '
    '(the openai client: extra_body={"condition": "..."})'
)


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request, with ``condition`` beside it. Strict, as ``POST /query`` is."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text or a list of texts (at most as many as /query's queries). "
        "Token ids, which OpenAI also takes, get a 400."
    )
    model: str | None = Field(
        None,
        description="An index, a corpus or a model id, as GET /indexes lists them, whose model encodes. "
        "Any name (or none) where every served index has the same model.",
    )
    condition: str | None = Field(None, description="The condition to embed under (an extension of OpenAI's shape).")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: each vector's little-endian float32 bytes."
    )
    dimensions: int | None = Field(None, ge=1, description="Refused (400) unless it is the model's dimension.")
    user: str | None = Field(None, description="Ignored.")

    @field_validator("input", mode="before")
    @classmethod
    def _one_kind_of_input(cls, value: object) -> object:
        # one line for any other shape, not one per member of the union
        if isinstance(value, str):
            return value
        if isinstance(value, list) and (
            all(isinstance(v, str) for v in value)
            or all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or all(isinstance(v, list) for v in value)
        ):
            return value
        raise ValueError("must be a text or a list of texts")

    @model_validator(mode="after")
    def _texts_are_text(self) -> EmbeddingsRequest:
        texts = [self.input] if isinstance(self.input, str) else self.input
        for i, text in enumerate(texts):
            if isinstance(text, str):
                try:
                    check_text(text)
                except ValueError as exc:
                    raise ValueError(f"input[{i}]: {exc}") from None
        return self

    @field_validator("condition")
    @classmethod
    def _condition(cls, value: str | None) -> str | None:
        return None if value is None else check_request_condition(value)

    def texts(self) -> list[str]:
        """Return the texts to embed; a 400 where the input is empty, holds an empty text or is token ids
        (as OpenAI answers them)."""
        texts = [self.input] if isinstance(self.input, str) else self.input
        if not texts:
            raise RequestError(400, "input: empty", param="input")
        if not all(isinstance(t, str) for t in texts):
            raise RequestError(400, TOKEN_IDS, param="input")
        for i, text in enumerate(texts):
            if not str(text).strip():
                raise RequestError(400, f"input[{i}]: empty" if len(texts) > 1 else "input: empty", param="input")
        return list(texts)  # type: ignore[arg-type]


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="The unit vector, or its float32 bytes in base64.")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="Tokens the model read of the inputs (not the condition's).")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str = Field(description="The model that made the vectors, as GET /v1/models names it.")
    usage: Usage


class ModelCard(BaseModel):
    id: str = Field(description="What `model` takes to name this model (a router corpus's: MODEL+router:ROUTER).")
    object: Literal["model"] = "model"
    created: int = Field(description="When its first index was written (Unix seconds; 0 where unknown).")
    owned_by: Literal["condsearch"] = "condsearch"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, server_error, ...")
    param: str | None = Field(description="The request field refused, where one is.")
    code: str | None = Field(description="A machine-readable code (invalid_api_key, model_not_found), or null.")


class OpenAIError(BaseModel):
    """An error on /v1, as OpenAI answers one."""

    error: OpenAIErrorDetail


@dataclass(frozen=True)
class EmbedJob:
    """Texts (or a part of a request's) to embed under a condition with one loaded model.

    ``queries``: what the model encodes of each text (cut to what it reads), named as a
    :class:`~condsearch.query.resident.QueryJob`'s, by which the batcher weighs both; ``tokens``: each one's.
    """

    vectorizer: Vectorizer
    condition: str
    queries: tuple[str, ...]
    tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return sum(self.tokens)

    def part(self, start: int, stop: int) -> EmbedJob:
        """Return the job of texts[start:stop]."""
        return EmbedJob(self.vectorizer, self.condition, self.queries[start:stop], self.tokens[start:stop])


def split_embed_job(job: EmbedJob, max_texts: int, max_tokens: int) -> list[EmbedJob]:
    """Split job into parts of at most max_texts texts and max_tokens tokens, in order.

    A text over max_tokens is a part alone.
    """
    bounds, start, cost = [], 0, 0
    for i, n in enumerate(job.tokens):
        if i > start and (i - start + 1 > max_texts or cost + n > max_tokens):
            bounds.append((start, i))
            start, cost = i, 0
        cost += n
    bounds.append((start, len(job.tokens)))
    return [job.part(a, b) for a, b in bounds]


def choose_model(listing: Listing, name: str | None) -> tuple[str, Manifest]:
    """Return the (name, manifest) of an index whose model a request's ``model`` names.

    ``name`` is tried as an index, then a corpus, then a model id; where it is none of them (or
    None), the one model every index shares. Of the indexes with that model, the one with the
    fewest rows, which is the cheapest to load where none is loaded yet. Raises a 404 (naming the
    choices) or a 409 (a corpus or model id whose indexes were built with different models).
    """
    manifests = sorted(((n, m) for n, m in listing if isinstance(m, Manifest)), key=lambda e: e[0])
    if not manifests:
        raise RequestError(404, "no index is served, so there is no model to embed with; index a corpus first")
    fields = (
        ("index", lambda n, m: n),
        ("corpus", lambda n, m: m.corpus_name),
        ("model", lambda n, m: m.model_id),
        ("model", lambda n, m: model_name(m)),  # as GET /v1/models lists it
    )
    for what, field in fields:
        # a local model's folder is named by its last part, as GET /indexes shows it (condsearch.serve.paths)
        matches = [(n, m) for n, m in manifests if name is not None and name in (field(n, m), hide_paths(field(n, m)))]
        if len({vectorizer_key(m) for _, m in matches}) > 1:
            indexes = ", ".join(n for n, _ in matches)
            raise RequestError(
                409, f"{what} {name!r} was indexed with different models; name an index: {indexes}", param="model"
            )
        if matches:
            return _smallest(matches)
    if len({vectorizer_key(m) for _, m in manifests}) == 1:
        return _smallest(manifests)
    choices = sorted({m.corpus_name for _, m in manifests} | {model_name(m) for _, m in manifests})
    asked = "no model named" if name is None else f"no index, corpus or model {name!r};"
    raise RequestError(
        404,
        f"{asked} the served indexes have several models: name one of {choices}",
        models=choices,
        param="model",
        code="model_not_found",
    )


def model_name(manifest: Manifest) -> str:
    """Return the name of an index's model as /v1/models lists it and /v1/embeddings answers with it.

    The model's id (a local folder's last part), and for a router (``--mode csr``) index the router beside it,
    ``MODEL+router:ROUTER``: the router makes the vectors, and two routers over one model make different ones.
    """
    model = hide_paths(manifest.model_id)
    router = manifest.encoder.get("router") if manifest.mode == MODE_CSR else None
    return f"{model}+router:{hide_paths(router)}" if isinstance(router, str) and router else model


def _created(manifest: Manifest) -> int:
    """Return when the index was written, in Unix seconds (0 where its manifest does not say)."""
    try:
        return int(datetime.fromisoformat(manifest.created_at).timestamp())
    except (TypeError, ValueError, OverflowError):
        return 0


def model_list(listing: Listing) -> dict[str, Any]:
    """Return GET /v1/models' answer: each name :func:`model_name` gives the listed indexes, once, oldest first."""
    created: dict[str, int] = {}
    for _, m in listing:
        if isinstance(m, Manifest):
            name, when = model_name(m), _created(m)
            created[name] = min(created.get(name, when), when)
    cards = [ModelCard(id=name, created=when) for name, when in sorted(created.items(), key=lambda e: (e[1], e[0]))]
    return ModelList(data=cards).model_dump()


def _smallest(entries: list[tuple[str, Manifest]]) -> tuple[str, Manifest]:
    return min(entries, key=lambda e: e[1].n_vectors)


def embed_job(resident: Resident, model: str | None, condition: str, texts: Sequence[str]) -> tuple[EmbedJob, str]:
    """Return the job of texts under condition with the model ``model`` names (loaded now), and its model id.

    Each text is cut to what the model reads and counted, as a query is (:meth:`Resident.job`); the condition is
    put in the form that names an index of the model (lower-cased for an uncased one). Runs on a worker thread,
    not the batcher's.
    """
    try:
        name, manifest = choose_model(resident.listing(), model)
        entry = resident.get(manifest.condition, manifest.corpus_name)
    except (UnknownCondition, StoreError):
        # the index chosen for its model was deleted or replaced since the listing was read: choose again
        name, manifest = choose_model(resident.listing(fresh=True), model)
        entry = resident.get(manifest.condition, manifest.corpus_name)
    condition = condition_key(condition, manifest.model_id)
    vec = resident.vectorizer(entry.model_key)
    cutter = resident.cutter(entry.model_key)  # the server's one copy of this model's tokenizer
    if cutter is not None:
        cut, tokens = cutter.cut(texts, condition)
    else:
        max_tokens = getattr(vec.encoder, "max_length", None)
        cut, tokens = list(texts), [estimate_tokens(t, max_tokens) for t in texts]
    return EmbedJob(vec, condition, tuple(cut), tuple(tokens)), model_name(entry.manifest)


def embed_batch(jobs: Sequence[EmbedJob]) -> list[np.ndarray | BaseException]:
    """Return each job's vectors, (n, dim) float32: one forward pass per (model, condition).

    A group whose pass raises is encoded again job by job, so only a job that breaks the model fails.
    """
    answers: list[np.ndarray | BaseException | None] = [None] * len(jobs)
    groups: dict[tuple[int, str], list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault((id(job.vectorizer), job.condition), []).append(j)
    for members in groups.values():
        try:
            vectors = _encode([jobs[j] for j in members])
        except Exception as exc:  # noqa: BLE001 - reported to the jobs that raise it
            if len(members) == 1:
                answers[members[0]] = exc
                continue
            for j in members:
                try:
                    answers[j] = _encode([jobs[j]])[0]
                except Exception as alone:  # noqa: BLE001
                    answers[j] = alone
            continue
        for j, vecs in zip(members, vectors, strict=True):
            answers[j] = vecs
    return answers  # type: ignore[return-value]


def _encode(jobs: Sequence[EmbedJob]) -> list[np.ndarray]:
    texts = [t for job in jobs for t in job.queries]
    vectors = jobs[0].vectorizer.encode(texts, jobs[0].condition, batch_size=max(1, len(texts)))
    return np.split(vectors, np.cumsum([len(job.queries) for job in jobs])[:-1])


def answer_jobs(resident: Resident, jobs: Sequence[QueryJob | EmbedJob]) -> list[Any]:
    """Answer a batch of the server's jobs, in order: an Answer, an array or the exception raised for each.

    Queries through :meth:`Resident.answer_batch`, embeddings through :func:`embed_batch`.
    """
    queries = [job for job in jobs if isinstance(job, QueryJob)]
    embeds = [job for job in jobs if isinstance(job, EmbedJob)]
    if not embeds:
        return list(resident.answer_batch(queries))
    answered = iter(resident.answer_batch(queries) if queries else [])
    embedded = iter(embed_batch(embeds))
    return [next(answered) if isinstance(job, QueryJob) else next(embedded) for job in jobs]


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()  # float32 to float64 is exact, and JSON writes each float64 so that it reads back


#: OpenAI's error types, by status
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
}
#: OpenAI's error codes, by status (null for the others, as OpenAI's own are for most)
_ERROR_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
#: the field a one-line error begins with ("input[1]: empty", "dimensions: ...", "model.x: ..."): its ``param``
_LEADING_FIELD = re.compile(r"([A-Za-z_]\w*)(?:\[\d+\])*(?:\.\w+)*: ")


class OpenAIErrors:
    """Answer errors under ``/v1/`` as OpenAI does, ``{"error": {"message", "type", "param", "code"}}``.

    The server's errors are ``{"error": "one line", ...}``; OpenAI's clients show ``error.message``
    only, so without this they would say no more than "Error code: 400". The line, the status and
    any other fields are kept; ``param`` names the field refused (a refusal's own ``param``, else the
    field its line begins with), ``code`` is a string or null, as OpenAI's. Plain ASGI, outside the
    API key and body limits, so their errors too.
    """

    def __init__(self, app: ASGIApp, prefix: str = "/v1/") -> None:
        self.app, self.prefix = app, prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_openai(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is whole
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _openai_error(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_openai)


def _openai_error(status: int, body: bytes) -> bytes:
    """Return an error body {"error": "line", ...} as {"error": {"message": "line", ...}, ...}; any other as it is."""
    try:
        got = json.loads(body)
    except ValueError:
        return body
    if not isinstance(got, dict) or not isinstance(got.get("error"), str):
        return body
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    message = got["error"]
    # a refusal may name its field and code (RequestError's extra fields); else the field its line begins with
    param, code = got.pop("param", None), got.pop("code", None) or _ERROR_CODES.get(status)
    if param is None and 400 <= status < 500 and (leading := _LEADING_FIELD.match(message)):
        param = leading.group(1)
    got["error"] = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps(got).encode()


def add_embeddings(app: FastAPI, resident: Resident, batcher: Lanes[Any, Any], config: ServeConfig) -> None:
    """Add ``POST /v1/embeddings`` to app, answered through batcher (whose run function is :func:`answer_jobs`).

    Call it after every other middleware is added: its errors' shape (:class:`OpenAIErrors`) goes outside them.
    """
    app.add_middleware(OpenAIErrors)
    errors = error_responses(400, 404, 409, 422, 503, model=OpenAIError)

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(model=OpenAIError))
    def models() -> dict[str, Any]:
        """List the models /v1/embeddings encodes with, in OpenAI's shape: what its `model` takes to name each."""
        return model_list(resident.listing())

    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses=error_responses(404, model=OpenAIError))
    def model(model: str) -> dict[str, Any]:
        """One of the models /v1/models lists, by its id."""
        for card in model_list(resident.listing())["data"]:
            if card["id"] == model:
                return dict(card)
        raise RequestError(
            404, f"no model {model[:200]!r}: GET /v1/models lists them", param="model", code="model_not_found"
        )

    @app.post("/v1/embeddings", response_model=EmbeddingsResponse, responses=errors)
    async def embeddings(body: EmbeddingsRequest) -> JSONResponse:
        """Return the vectors of `input` under `condition`, as `condsearch.Model.encode` gives them (OpenAI's shape)."""
        texts = body.texts()
        if body.condition is None:
            raise RequestError(400, NO_CONDITION, param="condition")
        if len(texts) > config.max_queries:
            raise RequestError(422, f"at most {config.max_queries} inputs per request, got {len(texts)}", param="input")
        for name, text in ((f"input[{i}]", t) for i, t in enumerate(texts)):
            if len(text) > config.max_text_chars:
                raise RequestError(422, f"{name}: longer than {config.max_text_chars:,} characters ({len(text):,})")
        job, model_id = await run_in_threadpool(embed_job, resident, body.model, body.condition, texts)
        dim = job.vectorizer.dim
        if body.dimensions is not None and body.dimensions != dim:
            raise RequestError(400, f"dimensions: this model's vectors have {dim}; leave dimensions out")
        future = batcher.submit_parts(split_embed_job(job, config.max_batch, config.max_batch_tokens))
        try:
            parts = await asyncio.wait_for(asyncio.wrap_future(future), config.request_timeout_s)
        except asyncio.TimeoutError as exc:
            raise RequestError(503, "the server is too busy; try again") from exc
        vectors = np.concatenate(parts)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        n_tokens = job.n_tokens
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return JSONResponse({"object": "list", "data": data, "model": model_id, "usage": usage})
