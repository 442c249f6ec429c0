"""Progress bars on stderr: drawn on a terminal only, and never after ``condsearch --quiet``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Turn off every progress bar of this process (True), or let them show on a terminal again (False)."""
    global _quiet
    _quiet = quiet


def progress_bar(*, total: int, desc: str, unit: str, initial: int = 0, enabled: bool = True) -> tqdm:
    """Return a tqdm bar on stderr, off when not enabled, after :func:`set_quiet`, or where stderr is no terminal.

    ``disable=None`` is tqdm's own check, so a log file or a pipe never fills with bar redraws.
    """
    from tqdm.auto import tqdm  # imported here: `condsearch --help` need not load it

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=True if _quiet or not enabled else None)
