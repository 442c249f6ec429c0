"""The server's settings: one frozen dataclass, the single home of every default the CLI shows."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from condsearch.defaults import DEFAULT_INDEX_DIR
from condsearch.errors import CondsearchError
from condsearch.model.encoders import BACKEND_CHOICES, Backend, CpuConfig, available_cores
from condsearch.query import QueryConfig

API_KEY_ENV = "CONDSEARCH_API_KEY"
#: headers a client may carry the key in (``Authorization: Bearer KEY`` also works)
API_KEY_HEADER = "X-API-Key"
#: the header that names a request: echoed when the client sends a fitting one, made otherwise
REQUEST_ID_HEADER = "X-Request-ID"
LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

__all__ = [
    "API_KEY_ENV",
    "API_KEY_HEADER",
    "LOG_FORMATS",
    "REQUEST_ID_HEADER",
    "BACKEND_CHOICES",
    "Backend",
    "LogFormat",
    "ServeConfig",
    "available_cores",
    "check_cors_origin",
    "is_loopback",
]


@dataclass(frozen=True)
class ServeConfig:
    """How `condsearch serve` listens, batches and answers."""

    index_dir: Path = DEFAULT_INDEX_DIR
    #: a Milvus database to serve instead of index_dir: milvus-lite:PATH.db or milvus://HOST:PORT
    store: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    #: required on every request when set (401 otherwise)
    api_key: str | None = None
    #: torch device for the models (None: CUDA when present, as everywhere else)
    device: str | None = None
    trust_remote_code: bool = False
    #: default k when a request names none (every front end's: :class:`condsearch.query.config.QueryConfig`)
    k: int = QueryConfig.k
    #: queries one request may carry
    max_queries: int = 256
    #: a request body larger than this gets a 413, refused before it is read whole (bytes)
    max_body_bytes: int = 1024 * 1024
    #: a query or condition longer than this gets a 422 (characters; a model reads at most a few hundred tokens)
    max_text_chars: int = 10_000
    #: a connection whose request line and headers have not all arrived this long after it opened (or
    #: after its previous answer) is closed, so half-open clients cannot pile up (seconds)
    head_timeout_s: float = 10.0
    #: a request whose body has not all arrived this long after its headers gets a 408 (seconds)
    body_timeout_s: float = 30.0
    #: an idle keep-alive connection is closed after this long (seconds)
    keep_alive_s: int = 5
    #: request line and headers larger than this are refused with a 400 (bytes)
    max_head_bytes: int = 16 * 1024
    #: how long the batcher waits for more requests after the first one arrives (milliseconds). 0: a request that
    #: finds its lane idle runs at once; under load, batches still form from what queues while one runs. 100,000
    #: rows, 2 cores, two runs each: p50 at 1 client 20.8-20.9 ms at 0 against 24.7-24.8 at 2, queries/s at 32
    #: clients 98-113 against 84-99, batches of 13-15 either way (benchmarks/systems/serving.md, issue 61)
    batch_window_ms: float = 0.0
    #: queries encoded together at most (one forward pass per model and condition)
    max_batch: int = 64
    #: tokens encoded together at most: a request over this (or over max_batch queries) is answered in
    #: parts, in turn with other requests, so that it holds none of them up for longer than one part
    #: (8 queries at the default model's 256 tokens; a long query counts only the tokens the model reads).
    #: 4096 doubled the wait of a small request beside a large one and answered the large one no sooner
    max_batch_tokens: int = 2048
    #: a request of one part and at most this many tokens (a query of a few words) is light: it runs on the quick
    #: lane, never behind heavy parts (embeddings of many texts, a batch of long queries), which run on the bulk
    #: lane at a lower CPU priority (:class:`condsearch.serve.batching.Lanes`)
    light_request_tokens: int = 64
    #: how often the store listing is re-read to notice replaced, added or removed indexes (seconds)
    reload_interval_s: float = QueryConfig.reload_interval_s
    #: a request waiting longer than this for its batch gets a 503
    request_timeout_s: float = 120.0
    #: a query under a condition that a router (--mode csr) corpus has no index for builds it, from the
    #: corpus's rows and cached sentence states; False refuses it (404) as for any other corpus
    build: bool = True
    #: builds on demand that run at once, each on its own thread with its own copy of the model
    max_builds: int = 1
    #: builds on demand running or waiting at most; past it a new condition gets a 503
    max_pending_builds: int = 8
    #: builds on demand running or waiting at most that one client (an address) asked for; past it a 429, so that
    #: one client cannot take every slot
    max_pending_builds_per_client: int = 2
    #: indexes built on demand that the store may hold at most (counted across restarts); past it a 507
    max_on_demand_indexes: int = 32
    #: and their bytes on disk at most (a memory size: 512M, 4G)
    max_on_demand_bytes: str = "1G"
    #: whether a server without an API key builds on demand (None: on a loopback bind, where the Host header is
    #: checked, and off beyond it, where anyone who reaches the port could fill its disk)
    open_builds: bool | None = None
    #: a corpus of at most this many rows is built and answered in the request that asked; a larger one
    #: gets a 202 naming a job to poll (GET /builds/ID). 1,000 rows took about 2 s here (docs/serve.md)
    build_inline_rows: int = 1000
    #: indexes kept loaded at most; past it the least recently used is dropped (loaded again when asked for)
    max_resident_indexes: int = QueryConfig.max_resident_indexes
    #: load every index and its model at startup instead of on first use
    preload: bool = False
    #: refuse indexes built with another quantisation ("none" or "int8"); None: each as built
    quantize: str | None = None
    #: what runs the encoders (see :data:`condsearch.model.encoders.cpu.Backend`)
    backend: Backend = CpuConfig.backend
    #: the encoders' intra-op threads on the CPU, torch's or onnxruntime's (None: every core)
    threads: int | None = CpuConfig.threads
    #: FAISS's OpenMP threads for searching (None: every core for an exact index, FAISS's own default;
    #: one for an IVF or HNSW index, whose queries FAISS walks on one thread). Encoding and searching
    #: take turns on each lane's thread; what to measure before changing either is in docs/serve.md
    search_threads: int | None = None
    #: the server's log lines (each naming its request's X-Request-ID): "text", or "json", one object a line
    log_format: LogFormat = "text"
    #: web origins (scheme://host[:port]) whose pages may call the API from a browser (CORS); none: CORS is off
    cors_origins: tuple[str, ...] = ()
    #: whether /health and /metrics need the API key too (else they answer without it, for probes and scrapers)
    private_health: bool = False

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            # an empty key would turn authentication off without a word (issue 58)
            raise CondsearchError(f"the API key is empty: give a key, or unset {API_KEY_ENV} and leave out --api-key")
        if self.log_format not in LOG_FORMATS:
            raise CondsearchError(f"log format {self.log_format!r}: choose one of {', '.join(LOG_FORMATS)}")
        for origin in self.cors_origins:
            check_cors_origin(origin)

    @property
    def builds_open(self) -> bool:
        """Return whether a query under a new condition may build it: with a key, or as ``open_builds`` says."""
        if self.api_key:
            return True
        return is_loopback(self.host) if self.open_builds is None else self.open_builds

    @property
    def encode_threads(self) -> int:
        """Return the encoders' intra-op threads: ``threads``, else every core this process may use."""
        return self.threads or available_cores()


def check_cors_origin(origin: str) -> str:
    """Return origin if a browser could send it (scheme://host[:port], no path; or *), else raise CondsearchError."""
    parts = urlsplit(origin)
    if origin != "*" and (parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query):
        raise CondsearchError(f"CORS origin {origin!r}: give scheme://host[:port], with no path (or *)")
    return origin


def is_loopback(host: str) -> bool:
    """Return whether host names only this machine (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
