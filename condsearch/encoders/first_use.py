"""Loading models on several threads at once: one load through transformers at a time, and one model per key.

transformers reaches its classes through lazy modules (``transformers.AutoModel``, each model family's
``transformers.models.bert``) that import their submodule on first attribute access. Two threads
doing that at once in a fresh process find a module half set up, and one fails with an ImportError:
a server's first builds on demand, several at once, did (issue 58, item 4). So every load through
transformers holds :data:`LOAD_LOCK` (re-entrant: the loaders nest) and an ImportError on the way is
a one-line ModelError (:func:`loading`); and :class:`LoadedOnce` gives one model per key to the
threads of a process, loaded by the first to ask while the others wait for it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from condsearch.errors import ModelError

#: held by every load through transformers (tokenizer, model, a model's weights), one at a time per process
LOAD_LOCK = threading.RLock()

T = TypeVar("T")


@contextmanager
def loading(model_id: str | None) -> Iterator[None]:
    """Hold the loading lock while a model loads; an ImportError in it becomes a one-line ModelError.

    An ImportError there is this install's (a package the model needs is missing), never the caller's
    to catch: every front end shows a CondsearchError in one line.
    """
    with LOAD_LOCK:
        try:
            yield
        except ImportError as exc:
            raise ModelError.cannot_load(model_id or "default", exc) from exc


class LoadedOnce(Generic[T]):
    """Models by key, each loaded once however many threads ask at once, and kept while someone holds it.

    The first thread to ask for a key loads it; the others wait for that load and share the model.
    Only a weak reference is kept: once the last user lets go the model is freed (a large model on a
    GPU is not held for a build that may never come), and the next request loads it again. A load
    that raises keeps nothing: the next caller loads again, and so learns why itself.
    """

    def __init__(self) -> None:
        self._loaded: weakref.WeakValueDictionary[Hashable, T] = weakref.WeakValueDictionary()
        self._locks: weakref.WeakValueDictionary[Hashable, _KeyLock] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()  # guards the two dicts, never held while loading

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        """Return key's model, loading it with ``load`` unless it is loaded or being loaded (then wait for it)."""
        with self._lock:
            key_lock = self._locks.get(key)
            if key_lock is None:
                key_lock = self._locks[key] = _KeyLock()
        with key_lock.lock:  # key_lock is held here, so its entry lives as long as a thread waits on it
            with self._lock:
                model = self._loaded.get(key)
            if model is None:
                model = load()
                with self._lock:
                    self._loaded[key] = model
            return model


class _KeyLock:
    """A lock of one key (an object, so that a weak dictionary can hold it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
