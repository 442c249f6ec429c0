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
    Only a weak reference is kept, and for ``keep_s`` seconds after each ask a strong one: once the
    last user lets go and that time has passed, the model is freed (a large model on a GPU is not held
    for a build that may never come), and the next request loads it again. A burst of builds reuses
    one copy rather than loading and freeing one each (issue 58: 170 loads in a 10-minute soak).
    A load that raises keeps nothing: the next caller loads again, and so learns why itself.
    """

    def __init__(self, keep_s: float = 0.0) -> None:
        self.keep_s = keep_s
        self._loaded: weakref.WeakValueDictionary[Hashable, T] = weakref.WeakValueDictionary()
        self._locks: weakref.WeakValueDictionary[Hashable, _KeyLock] = weakref.WeakValueDictionary()
        self._kept: dict[Hashable, tuple[T, threading.Timer]] = {}  # strong references, each until its timer
        self._lock = threading.Lock()  # guards the dicts, never held while loading

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
            self._keep(key, model)
            return model

    def _keep(self, key: Hashable, model: T) -> None:
        """Hold a strong reference to key's model for ``keep_s`` seconds from now."""
        if self.keep_s <= 0:
            return
        timer = threading.Timer(self.keep_s, self._let_go, (key,))
        timer.daemon = True
        with self._lock:
            kept = self._kept.pop(key, None)
            self._kept[key] = (model, timer)
        if kept is not None:
            kept[1].cancel()
        timer.start()

    def _let_go(self, key: Hashable) -> None:
        """Drop key's strong reference, unless a later ask replaced it (runs on the timer's own thread)."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[1] is threading.current_thread():
                del self._kept[key]


class _KeyLock:
    """A lock of one key (an object, so that a weak dictionary can hold it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
