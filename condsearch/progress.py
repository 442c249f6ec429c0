"""Progress bars on stderr: drawn on a terminal only, and never after ``condsearch --quiet``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

#: the bars of a router's encoding (:class:`condsearch.model.csr.encoder.CsrEncoder`): sentence states, then the
#: routed rest
CACHING_SENTENCES = "caching sentences"
ROUTING = "routing"

_quiet = False
#: per thread, who is told of every bar's progress (:func:`listening`)
_listeners = threading.local()


class RowCount:
    """How far a job is in rows: the job calls it with (done, total), whoever reports on the job reads it.

    A build on demand's progress (issue 60): the server hands one down to the build, so that the build
    reports into this lowest layer rather than calling back up into the server's code.
    """

    def __init__(self, total: int = 0) -> None:
        self.done, self.total = 0, total

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total


def set_quiet(quiet: bool) -> None:
    """Turn off every progress bar of this process (True), or let them show on a terminal again (False)."""
    global _quiet
    _quiet = quiet


def progress_bar(*, total: int, desc: str, unit: str, initial: int = 0, enabled: bool = True) -> tqdm:
    """Return a tqdm bar on stderr, off when not enabled, after :func:`set_quiet`, or where stderr is no terminal.

    ``disable=None`` is tqdm's own check, so a log file or a pipe never fills with bar redraws.
    """
    from tqdm.auto import tqdm  # imported here: `condsearch --help` need not load it

    bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=True if _quiet or not enabled else None)
    listener: Callable[[str, int, int], None] | None = getattr(_listeners, "listener", None)
    if listener is not None:
        bar.update = _told(bar.update, listener, desc, initial, total)  # type: ignore[method-assign]
    return bar


@contextmanager
def listening(listener: Callable[[str, int, int], None]) -> Iterator[None]:
    """Tell listener (desc, done, total) each time a bar this thread opens meanwhile advances, drawn or not.

    How a build on demand reports its progress within an ingest chunk (issue 59): a chunk of 8,192
    rows is encoded in batches, each a bar's step.
    """
    before = getattr(_listeners, "listener", None)
    _listeners.listener = listener
    try:
        yield
    finally:
        _listeners.listener = before


def _told(
    update: Callable[..., Any], listener: Callable[[str, int, int], None], desc: str, done: int, total: int
) -> Callable[..., Any]:
    """Return update, telling listener the bar's count after each step."""
    count = [done]

    def told(n: float = 1) -> Any:
        count[0] += int(n)
        listener(desc, count[0], total)
        return update(n)

    return told
