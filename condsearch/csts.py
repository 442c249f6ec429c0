"""C-STS data: sentence pairs judged similar or not under a condition."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from condsearch.errors import CorpusError

COLUMNS = ("sentence1", "sentence2", "condition", "label")
INVALID_LABEL = -1.0


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
    return ((labels - 1.0) / 4.0).astype(np.float32)


def read_csts(path: Path | str) -> CstsData:
    """Read a CSV with columns sentence1, sentence2, condition, label; drop label -1."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                found = ", ".join(reader.fieldnames or []) or "none"
                raise CorpusError(f"{path}: missing column(s) {', '.join(missing)}; columns are {found}")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CorpusError(f"{path}: cannot read C-STS file ({type(exc).__name__})") from exc
    s1, s2, cond, labels = [], [], [], []
    dropped = 0
    for line, row in enumerate(rows, start=2):
        try:
            label = float(row["label"])
        except (TypeError, ValueError) as exc:
            raise CorpusError(f"{path}:{line}: label {row['label']!r} is not a number") from exc
        if label == INVALID_LABEL or not (row["condition"] or "").strip():
            dropped += 1
            continue
        s1.append(row["sentence1"] or "")
        s2.append(row["sentence2"] or "")
        cond.append(row["condition"])
        labels.append(label)
    if not labels:
        raise CorpusError(f"{path}: no labelled rows")
    return CstsData(s1, s2, cond, np.asarray(labels, dtype=np.float32), dropped)
