"""The encoder interface: one abstract batch call, everything else derived here."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from condsearch.artifacts.profiles import ADAPTER_KEY
from condsearch.cache import EmbeddingCache, pair_key
from condsearch.progress import progress_bar

log = logging.getLogger(__name__)

#: pairs per encoder forward pass, wherever a caller names no other (the CLI's --batch-size default)
ENCODE_BATCH_SIZE = 64
#: conditions whose own vector f(c; I(∅)) a serving encoder keeps (:meth:`Encoder.remember_conditions`)
CONDITION_MEMO_SIZE = 256

# A (condition, sentence) input; a sentence of None stands for the bare instruction I(∅).
Pair = tuple[str, str | None]


@dataclass
class EncodeStats:
    """Counters an encoder accumulates so that callers can report them."""

    n_forward: int = 0
    n_truncated: int = 0
    truncated_examples: list[str] = field(default_factory=list)

    def note_truncated(self, text: str) -> None:
        self.n_truncated += 1
        if len(self.truncated_examples) < 3:
            self.truncated_examples.append(text[:60])


class ConditionalEncoder(Protocol):
    """What indexing and querying need: texts under a condition -> vectors (CASE or CSR)."""

    model_id: str
    revision: str
    dim: int

    def encode(
        self,
        texts: Sequence[str],
        conditions: Sequence[str] | str,
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        progress: bool = False,
    ) -> np.ndarray: ...

    def describe(self) -> dict[str, object]: ...

    def report_truncation(self) -> str | None: ...


class Encoder(ABC):
    """Turn (condition, sentence) pairs into pooled vectors f(c; I(s)).

    Subclasses implement :meth:`encode_batch` only. This base class derives
    de-duplication, length-sorted batching, progress bars, caching (:meth:`encode_pairs`) and
    the CASE difference ``f(c; I(s)) - f(c; I(∅))`` (:meth:`encode`, the public verb).
    """

    #: model identity recorded in index manifests and caches
    model_id: str
    #: a fingerprint of the weights (hub commit, package version or file digest)
    revision: str
    #: pooled vector size
    dim: int

    def __init__(self) -> None:
        self.stats = EncodeStats()
        #: f(c; I(∅)) by condition, kept only when :meth:`remember_conditions` asked for it
        self._condition_memo: OrderedDict[str, np.ndarray] | None = None
        self._memo_size = 0
        self._memo_lock = threading.Lock()

    def remember_conditions(self, size: int = CONDITION_MEMO_SIZE) -> None:
        """Keep the last ``size`` conditions' own vectors f(c; I(∅)), so a query pays one pass, not two.

        For models whose weights no longer change (a server, an API handle); a model being trained
        must not keep them. ``size`` 0 turns it off.
        """
        if size < 0:
            raise ValueError("the condition memo's size must be at least 0")
        self._memo_size = size
        self._condition_memo = OrderedDict() if size else None

    def _condition_vectors(
        self, conditions: Sequence[str], batch_size: int, cache: EmbeddingCache | None
    ) -> np.ndarray:
        """Return f(c; I(∅)) of distinct conditions, from the memo where it holds them."""
        memo = self._condition_memo
        if memo is None:
            return self.encode_pairs([(c, None) for c in conditions], batch_size=batch_size, cache=cache)
        with self._memo_lock:  # a Python API store may be searched from several threads
            known = {c: memo[c] for c in conditions if c in memo}
        missing = [c for c in conditions if c not in known]
        if missing:
            computed = self.encode_pairs([(c, None) for c in missing], batch_size=batch_size, cache=cache)
            known.update(zip(missing, computed, strict=True))
        with self._memo_lock:
            for c in conditions:
                memo[c] = known[c]
                memo.move_to_end(c)
            while len(memo) > self._memo_size:
                memo.popitem(last=False)
        return np.stack([known[c] for c in conditions])

    @abstractmethod
    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        """Return f(c; I(s)) for each pair of one batch: (len(pairs), dim) float32 (the subclass's forward pass)."""

    #: an adapter named apart from its profile (``--adapter``): its folder, recorded so a query reloads it
    adapter_path = ""

    def describe(self) -> dict[str, object]:
        """Return the settings that change the vectors (recorded in manifests, keyed in caches)."""
        info: dict[str, object] = {"model_id": self.model_id, "revision": self.revision, "dim": self.dim}
        if self.adapter_path:  # absent otherwise, so that earlier manifests and caches still match
            info[ADAPTER_KEY] = self.adapter_path
        return info

    def sort_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        """Return the lengths :meth:`encode_pairs` batches pairs by: characters, a cheap proxy for tokens."""
        return [len(c) + len(s or "") for c, s in pairs]

    def encode_pairs(
        self,
        pairs: Sequence[Pair],
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        progress: bool = False,
        cache: EmbeddingCache | None = None,
        desc: str = "encoding",
    ) -> np.ndarray:
        """Return f(c; I(s)) of pairs, each distinct pair once, in length-sorted batches: (n, dim) float32.

        Not :meth:`encode`: the raw pooled vectors, no CASE difference (what that difference is made of;
        a pair of sentence None gives f(c; I(∅)), the condition's own vector).
        """
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        unique: dict[Pair, int] = {}
        for pair in pairs:
            unique.setdefault(pair, len(unique))
        distinct = list(unique)
        out = np.empty((len(distinct), self.dim), dtype=np.float32)
        todo = list(range(len(distinct)))
        keys: list[str] = []
        if cache is not None:
            ident = self._cache_ident()
            keys = [pair_key(ident, c, s) for c, s in distinct]
            found = cache.get_many(keys)
            todo = []
            for i, key in enumerate(keys):
                vec = found.get(key)
                if vec is None:
                    todo.append(i)
                else:
                    out[i] = vec
        # Longest first, so that each batch pads little (stable: equal lengths keep their order)
        lengths = self.sort_lengths([distinct[i] for i in todo])
        todo = [todo[j] for j in sorted(range(len(todo)), key=lambda j: -lengths[j])]
        bar = progress_bar(total=len(todo), desc=desc, unit="pair", enabled=progress and bool(todo))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            vecs = self.encode_batch([distinct[i] for i in chunk])
            out[chunk] = vecs
            self.stats.n_forward += len(chunk)
            bar.update(len(chunk))
        bar.close()
        if cache is not None and todo:
            cache.put_many([keys[i] for i in todo], out[todo])
        index = np.fromiter((unique[p] for p in pairs), dtype=np.int64, count=len(pairs))
        return out[index]

    def encode(
        self,
        texts: Sequence[str],
        conditions: Sequence[str] | str,
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        progress: bool = False,
        cache: EmbeddingCache | None = None,
    ) -> np.ndarray:
        """Return raw CASE vectors f(c; I(s)) - f(c; I(∅)) of texts, under one condition or one each: (n, dim)."""
        if isinstance(conditions, str):
            conditions = [conditions] * len(texts)
        if len(conditions) != len(texts):
            raise ValueError("texts and conditions differ in length")
        distinct = list(dict.fromkeys(conditions))
        # f(c; I(∅)) once per distinct condition
        base = self._condition_vectors(distinct, batch_size, cache)
        row = {c: i for i, c in enumerate(distinct)}
        pairs: list[Pair] = list(zip(conditions, texts, strict=True))
        cond = self.encode_pairs(pairs, batch_size=batch_size, progress=progress, cache=cache)
        return cond - base[[row[c] for c in conditions]]

    def _cache_ident(self) -> str:
        items = sorted(self.describe().items())
        return "|".join(f"{k}={v}" for k, v in items)

    def report_truncation(self) -> str | None:
        """Return a one-line notice if inputs were truncated since the last call, and reset."""
        if not self.stats.n_truncated:
            return None
        msg = (
            f"{self.stats.n_truncated} input(s) longer than the model's limit were truncated "
            f"(e.g. {self.stats.truncated_examples[0]!r}…)"
        )
        self.stats.n_truncated = 0
        self.stats.truncated_examples.clear()
        return msg
