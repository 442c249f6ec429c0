"""The encoder interface: one abstract batch call, everything else derived here."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from condsearch.base.output_cache import EmbeddingCache, pair_key
from condsearch.model.artifacts.profiles import ADAPTER_KEY
from condsearch.progress import progress_bar

log = logging.getLogger(__name__)

#: pairs per encoder forward pass, wherever a caller names no other (the CLI's --batch-size default)
ENCODE_BATCH_SIZE = 64
#: conditions whose own vector f(c; I(∅)) a serving encoder keeps (:meth:`Encoder.remember_conditions`)
CONDITION_MEMO_SIZE = 256

# A (condition, sentence) input; a sentence of None stands for the bare instruction I(∅).
Pair = tuple[str, str | None]


class _Truncations(threading.local):
    """One thread's truncated inputs: their count and up to three of them."""

    def __init__(self) -> None:
        self.n = 0
        self.examples: list[str] = []


class EncodeStats:
    """Counters an encoder accumulates so that callers can report them.

    Truncations are counted per thread: an encoder shared by a server's threads or a Python host's
    reports to each caller only the inputs that caller's own calls truncated.
    """

    def __init__(self) -> None:
        self.n_forward = 0
        self._truncations = _Truncations()

    @property
    def n_truncated(self) -> int:
        """Inputs this thread's calls truncated since its last report."""
        return self._truncations.n

    @n_truncated.setter
    def n_truncated(self, n: int) -> None:
        self._truncations.n = n

    @property
    def truncated_examples(self) -> list[str]:
        """Up to three of them, cut to 60 characters (this thread's)."""
        return self._truncations.examples

    def note_truncated(self, text: str) -> None:
        self.note_many(1, [text])

    def note_many(self, n: int, examples: Sequence[str]) -> None:
        """Count n truncated inputs of this thread, keeping the first of examples."""
        tally = self._truncations
        tally.n += n
        tally.examples.extend(e[:60] for e in examples[: max(0, 3 - len(tally.examples))])

    def take_truncated(self) -> tuple[int, list[str]]:
        """Return this thread's count and examples, and reset them."""
        tally = self._truncations
        taken = (tally.n, list(tally.examples))
        tally.n = 0
        tally.examples.clear()
        return taken


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
        """Return a one-line notice if this thread's inputs were truncated since its last call, and reset."""
        n, examples = self.stats.take_truncated()
        if not n:
            return None
        return f"{n} input(s) longer than the model's limit were truncated (e.g. {examples[0]!r}…)"
