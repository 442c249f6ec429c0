"""C-STS data: sentence pairs judged similar or not under a condition."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condsearch.base.regular_files import open_regular_file
from condsearch.errors import CorpusError

COLUMNS = ("sentence1", "sentence2", "condition", "label")
INVALID_LABEL = -1.0
#: the similarity scale of C-STS labels (inclusive); INVALID_LABEL marks a row to drop
LABEL_MIN, LABEL_MAX = 1.0, 5.0


@dataclass(frozen=True)
class CstsData:
    """Rows of a C-STS file with invalid (label -1) rows dropped."""

    sentence1: list[str]
    sentence2: list[str]
    condition: list[str]
    labels: np.ndarray  # (n,) float32 on the 1..5 scale
    n_dropped: int = 0

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> CstsData:
        """Return the first n rows (for smoke runs)."""
        return CstsData(self.sentence1[:n], self.sentence2[:n], self.condition[:n], self.labels[:n])


def scale_labels(labels: np.ndarray) -> np.ndarray:
    """Map labels 1..5 onto 0..1, the target of the cosine regression."""
    return ((labels - LABEL_MIN) / (LABEL_MAX - LABEL_MIN)).astype(np.float32)


def parse_label(text: str | None) -> float:
    """Return a label as a number on the 1..5 scale (or INVALID_LABEL); ValueError says why it is not one."""
    try:
        label = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError("is not a number") from None
    if label == INVALID_LABEL:
        return label
    scale = f"{LABEL_MIN:g}-{LABEL_MAX:g}"
    if not math.isfinite(label):
        raise ValueError(f"is not a finite number (labels are {scale}; {INVALID_LABEL:g} drops a row)")
    if not LABEL_MIN <= label <= LABEL_MAX:
        raise ValueError(f"is outside the {scale} scale ({INVALID_LABEL:g} drops a row)")
    return label


def read_csts(path: Path | str) -> CstsData:
    """Read a CSV with columns sentence1, sentence2, condition, label; drop label -1.

    A label that is not a number on the 1..5 scale (NaN, inf, 0, 6) is a CorpusError naming its line;
    so is a path that is not a regular file (``/dev/zero`` never ends, a FIFO blocks), refused before any read.
    """
    path = Path(path)
    rows: list[tuple[int, dict[str, str | None]]] = []
    try:
        with io.TextIOWrapper(open_regular_file(path, CorpusError), newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                found = ", ".join(reader.fieldnames or []) or "none"
                raise CorpusError(f"{path}: missing column(s) {', '.join(missing)}; columns are {found}")
            for row in reader:
                rows.append((reader.line_num, row))  # the line the row ends on (a quoted field may span lines)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CorpusError(f"{path}: cannot read C-STS file ({type(exc).__name__})") from exc
    s1, s2, cond, labels = [], [], [], []
    dropped = 0
    for line, row in rows:
        try:
            label = parse_label(row["label"])
        except ValueError as exc:
            raise CorpusError(f"{path}:{line}: label {row['label']!r} {exc}") from exc
        if label == INVALID_LABEL or not (row["condition"] or "").strip():
            dropped += 1
            continue
        s1.append(row["sentence1"] or "")
        s2.append(row["sentence2"] or "")
        cond.append(row["condition"] or "")
        labels.append(label)
    if not labels:
        raise CorpusError(f"{path}: no labelled rows")
    return CstsData(s1, s2, cond, np.asarray(labels, dtype=np.float32), dropped)
