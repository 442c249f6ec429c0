"""On-disk cache of per-sentence router states, in shards read lazily (memory-mapped)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from condsearch.base.atomic import replacing_file
from condsearch.errors import ModelError
from condsearch.model.csr.keys import state_dtype_name
from condsearch.model.csr.router import SentenceStates

#: one sentence's states, (length, hidden) each: x, k, c for the paper/extended router, x alone for the context one
Tensors = tuple[torch.Tensor, ...]
#: the names of the tensors a router caches per sentence, in the order of :data:`Tensors`
STATE_NAMES = ("x", "k", "c")
#: the storage types a state cache offers: int8 keeps one float32 scale per token and tensor
STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8}
_SCALE = ".scale"
#: per sentence, the sha256 of its key and its stored rows (:func:`state_digest`): (n, 32) uint8
_DIGESTS = "digests"
#: sentences whose rows are read at once when checking them
_CHECK_ROWS = 256


def default_state_dtype(variant: str) -> torch.dtype:
    """Return how a router variant's states are stored by default.

    The context router's int8 states route to within 4e-4 cosine of float32 ones on C-STS dev, at
    the same Spearman, in half float16's bytes (benchmarks/studies/csr_states.py); the paper and extended
    variants keep float16.
    """
    return STATE_DTYPES[state_dtype_name(variant)]


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (int8 values, float32 per-row scales) of a (tokens, hidden) tensor, symmetric about zero."""
    scale = t.float().abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return torch.round(t.float() / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Undo :func:`quantize` (float32)."""
    return values.float() * scale[:, None]


def text_key(ident: str, text: str) -> str:
    """Return the hex digest naming one sentence under one backbone identity."""
    return hashlib.sha256(f"{ident}\x1f{text}".encode()).hexdigest()


def state_digest(key: str, stored: Mapping[str, Any]) -> bytes:
    """Return the sha256 of one sentence's key and stored rows ({tensor name: its (length, …) rows, as stored})."""
    h = hashlib.sha256(bytes.fromhex(key))
    for name in sorted(stored):
        rows = np.ascontiguousarray(stored[name].numpy() if isinstance(stored[name], torch.Tensor) else stored[name])
        h.update(f"\x1f{name}{rows.dtype.str}{rows.shape}".encode())
        h.update(rows.tobytes())
    return h.digest()


class StateCache:
    """Shards of sentence states: ``keys`` (n, 32) uint8 digests, ``offsets`` (n+1,) int64 and
    the token-major state tensors (total tokens, hidden) of all n sentences, one per name in
    ``names`` (``x``, ``k``, ``c`` for the paper/extended router; ``x`` for the context one).

    Shards are written under a temporary name and renamed; reads open them with safetensors
    (no pickles) and copy out only the rows asked for, so a corpus larger than memory streams.
    With ``dtype=torch.int8`` each tensor is stored as int8 with a float32 scale per token
    (``NAME.scale``), and read back as float32. Each sentence's key and rows have their sha256
    in ``digests``; :meth:`missing` checks a sentence's once per process before it counts as
    cached, so a damaged or edited sentence (or a shard written before digests) is computed again.
    """

    def __init__(
        self, directory: Path, dtype: torch.dtype = torch.float16, names: tuple[str, ...] = STATE_NAMES
    ) -> None:
        self.directory = Path(directory)
        self.dtype = dtype
        self.names = names
        self._where: dict[str, tuple[Path, int]] | None = None
        self._offsets: dict[Path, torch.Tensor] = {}
        self._digests: dict[Path, torch.Tensor] = {}
        self._checked: set[str] = set()  # keys whose rows matched their digest
        self._seen: set[Path] = set()  # shards read into the index (damaged ones included: not read again)
        self._stamp: int | None = None  # the folder's time at the last listing

    @property
    def _stored(self) -> list[str]:
        """Return the names of the tensors each sentence's rows are stored in."""
        return [n + suffix for n in self.names for suffix in (("", _SCALE) if self.dtype == torch.int8 else ("",))]

    def _index(self) -> dict[str, tuple[Path, int]]:
        """Return where each cached key is, the folder listed again on every call: shards written since by
        another process are read, and shards removed since (a cleared cache) are forgotten, so a model kept
        between builds (a server's) never reads a shard that is gone. The folder is listed only when its
        time moved (or moved within the last 2 s, for file systems with coarse clocks): a served query asks
        on every request."""
        changed = self._folder_changed()  # called first: it records the folder's time of this listing
        if self._where is not None and not changed:
            return self._where
        if self._where is None:
            self._where = {}
        shards = set(self.directory.glob("shard-*.safetensors"))
        gone = self._offsets.keys() - shards
        if gone:
            self._where = {k: (shard, i) for k, (shard, i) in self._where.items() if shard not in gone}
            self._checked.intersection_update(self._where)
            for shard in gone:
                self._offsets.pop(shard, None)
                self._digests.pop(shard, None)
        for shard in sorted(shards - self._seen):
            self._seen.add(shard)
            try:
                with safe_open(str(shard), framework="pt") as fh:
                    keys = fh.get_tensor("keys")
                    offsets, digests = fh.get_tensor("offsets"), fh.get_tensor(_DIGESTS)
                    names = set(fh.keys())
            except Exception:  # noqa: BLE001 - a damaged shard, or one without digests, is only a cache miss
                continue
            n = len(keys)
            if offsets.shape != (n + 1,) or digests.shape != (n, 32) or not names.issuperset(self._stored):
                continue
            self._offsets[shard], self._digests[shard] = offsets, digests
            for i, row in enumerate(keys):
                self._where[bytes(row.tolist()).hex()] = (shard, i)
        self._seen &= shards
        return self._where

    def _folder_changed(self) -> bool:
        """Return whether the folder may hold other shards than at the last call (its time, or recent)."""
        try:
            stamp: int | None = self.directory.stat().st_mtime_ns
        except OSError:
            stamp = None
        changed = stamp != self._stamp or (stamp is not None and time.time_ns() - stamp < 2_000_000_000)
        self._stamp = stamp
        return changed

    def _rows(self, shard: Path, rows: Sequence[int]) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yield (row, {stored name: its rows as stored}) for rows of a shard, reading nearby rows at once."""
        offsets = self._offsets[shard]
        with safe_open(str(shard), framework="pt") as fh:
            slices = {name: fh.get_slice(name) for name in self._stored}
            ordered = sorted(rows)
            for start in range(0, len(ordered), _CHECK_ROWS):
                run = ordered[start : start + _CHECK_ROWS]
                first, last = int(offsets[run[0]]), int(offsets[run[-1] + 1])
                block = {name: s[first:last] for name, s in slices.items()}
                for row in run:
                    a, b = int(offsets[row]) - first, int(offsets[row + 1]) - first
                    yield row, {name: t[a:b] for name, t in block.items()}

    def _check(self, keys: Sequence[str]) -> None:
        """Drop from the index every key among keys whose rows do not match their digest."""
        where = self._index()
        by_shard: dict[Path, dict[int, str]] = {}
        for key in keys:
            if key in where and key not in self._checked:
                shard, row = where[key]
                by_shard.setdefault(shard, {})[row] = key
        for shard, rows in by_shard.items():
            digests = self._digests[shard]
            try:
                for row, stored in self._rows(shard, list(rows)):
                    key = rows.pop(row)
                    if state_digest(key, stored) == bytes(digests[row].tolist()):
                        self._checked.add(key)
                    else:
                        del where[key]
            except Exception:  # noqa: BLE001 - a shard damaged past its header: what is left unchecked is missing
                pass
            for key in rows.values():
                where.pop(key, None)

    def missing(self, keys: Sequence[str]) -> list[int]:
        """Return the positions of keys not in the cache (or whose cached rows fail their checksum)."""
        self._check(keys)
        where = self._index()
        return [i for i, k in enumerate(keys) if k not in where]

    def lengths(self, keys: Sequence[str]) -> list[int]:
        """Return the token count of each cached sentence (KeyError for a missing one)."""
        where = self._index()
        out = []
        for key in keys:
            shard, row = where[key]
            offsets = self._offsets[shard]
            out.append(int(offsets[row + 1] - offsets[row]))
        return out

    def put(self, keys: Sequence[str], states: Sequence[Tensors]) -> None:
        """Write the states of several sentences as one new shard."""
        if not keys:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        lengths = [s[0].shape[0] for s in states]
        offsets = torch.zeros(len(keys) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(lengths).cumsum(0)
        tensors = {
            "keys": torch.tensor([list(bytes.fromhex(k)) for k in keys], dtype=torch.uint8),
            "offsets": offsets,
        }
        for j, name in enumerate(self.names):
            joined = torch.cat([s[j] for s in states])
            if self.dtype == torch.int8:
                tensors[name], tensors[name + _SCALE] = quantize(joined)
            else:
                tensors[name] = joined.to(self.dtype).contiguous()
        digests = [
            state_digest(k, {n: tensors[n][int(offsets[i]) : int(offsets[i + 1])] for n in self._stored})
            for i, k in enumerate(keys)
        ]
        tensors[_DIGESTS] = torch.tensor([list(d) for d in digests], dtype=torch.uint8)
        digest = hashlib.sha256("".join(keys).encode()).hexdigest()[:16]
        final = self.directory / f"shard-{digest}.safetensors"
        with replacing_file(final) as tmp:
            save_file(tensors, str(tmp))
        self._seen.add(final)  # indexed here, not read back
        where = self._index()
        self._offsets[final], self._digests[final] = offsets, tensors[_DIGESTS]
        for i, k in enumerate(keys):
            where[k] = (final, i)
            self._checked.add(k)

    def get(self, keys: Sequence[str]) -> list[Tensors]:
        """Read the states of cached sentences, in order (KeyError for a missing one).

        A sentence not checked yet by :meth:`missing` is checked first (ModelError if it fails).
        """
        where = self._index()
        cached = [k for k in keys if k in where]
        self._check(cached)
        if any(k not in where for k in cached):
            raise ModelError(f"{self.directory}: cached sentence states fail their checksum; run again")
        out: list[Tensors | None] = [None] * len(keys)
        by_shard: dict[Path, list[tuple[int, int]]] = {}
        for pos, key in enumerate(keys):
            shard, row = where[key]
            by_shard.setdefault(shard, []).append((pos, row))
        for shard, rows in by_shard.items():
            offsets = self._offsets[shard]
            with safe_open(str(shard), framework="pt") as fh:
                slices = {name: fh.get_slice(name) for name in self.names}
                scales = {n: fh.get_slice(n + _SCALE) for n in self.names} if self.dtype == torch.int8 else {}
                for pos, row in rows:
                    a, b = int(offsets[row]), int(offsets[row + 1])
                    if scales:
                        out[pos] = tuple(dequantize(slices[n][a:b], scales[n][a:b]) for n in self.names)
                    else:
                        out[pos] = tuple(slices[n][a:b] for n in self.names)
        return [o for o in out if o is not None]

    def nbytes_per_sentence(self) -> float:
        """Return the mean bytes on disk per cached sentence (0 when empty)."""
        shards = list(self.directory.glob("shard-*.safetensors"))
        n = len(self._index())
        return sum(s.stat().st_size for s in shards) / n if n else 0.0


def as_stored(tensors: Tensors, dtype: torch.dtype) -> Tensors:
    """Return one sentence's states rounded as a state cache of dtype gives them back (float16, or int8 per token)."""
    if dtype == torch.int8:
        return tuple(dequantize(*quantize(t)) for t in tensors)
    return tuple(t.to(dtype) for t in tensors)


class RequestStates:
    """A state cache read, never written: the states of sentences it lacks are held here, for one request.

    What a server encodes for a query text stays in memory and goes with the request (issue 58: every
    text a client sent stayed on disk). The states are rounded as the cache would store them, so that
    a query's vector is the one a one-shot query (:mod:`condsearch.model.csr.one_shot`) gives.
    """

    def __init__(self, cache: StateCache) -> None:
        self.cache = cache
        self._held: dict[str, Tensors] = {}

    def missing(self, keys: Sequence[str]) -> list[int]:
        return [i for i in self.cache.missing(keys) if keys[i] not in self._held]

    def put(self, keys: Sequence[str], states: Sequence[Tensors]) -> None:
        for key, tensors in zip(keys, states, strict=True):
            self._held[key] = as_stored(tensors, self.cache.dtype)

    def lengths(self, keys: Sequence[str]) -> list[int]:
        on_disk = dict(zip(cached := [k for k in keys if k not in self._held], self.cache.lengths(cached), strict=True))
        return [self._held[k][0].shape[0] if k in self._held else on_disk[k] for k in keys]

    def get(self, keys: Sequence[str]) -> list[Tensors]:
        cached = list(dict.fromkeys(k for k in keys if k not in self._held))
        on_disk = dict(zip(cached, self.cache.get(cached), strict=True))
        return [self._held[k] if k in self._held else on_disk[k] for k in keys]


def collate(
    states: Sequence[Tensors], dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> SentenceStates:
    """Pad per-sentence states into one batch (k and c stay None for states of x alone)."""
    b = len(states)
    length = max(s[0].shape[0] for s in states)
    hidden = states[0][0].shape[1]
    padded = [torch.zeros(b, length, hidden, dtype=dtype) for _ in states[0]]
    mask = torch.zeros(b, length, dtype=torch.bool)
    for i, tensors in enumerate(states):
        n = tensors[0].shape[0]
        for full, t in zip(padded, tensors, strict=True):
            full[i, :n] = t
        mask[i, :n] = True
    if device is not None:
        padded, mask = [t.to(device) for t in padded], mask.to(device)
    k = padded[1] if len(padded) > 1 else None
    c = padded[2] if len(padded) > 2 else None
    return SentenceStates(padded[0], k, c, mask)


def split(states: SentenceStates) -> list[Tensors]:
    """Undo :func:`collate`: per-sentence tensors without padding, on the CPU."""
    lengths = states.mask.sum(dim=1).tolist()
    present = [t for t in (states.x, states.k, states.c) if t is not None]
    return [tuple(t[i, :n].cpu() for t in present) for i, n in enumerate(lengths)]
