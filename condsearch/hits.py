"""What a query found, named: one :class:`Hit` per row, a query's :class:`Hits` best first, and their tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from condsearch.errors import CondsearchError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: the columns of :meth:`Hits.to_dicts`, :meth:`Hits.to_pandas` and :meth:`Hits.to_arrow`
COLUMNS = ("rank", "id", "score", "text", "row")


@dataclass(frozen=True)
class Hit:
    """One row found for a query: its id, its score (cosine under the condition, higher is closer), text and row."""

    id: str | int
    score: float
    text: str
    row: int  # the row's position in the index


@dataclass(frozen=True)
class Hits(Sequence[Hit]):
    """One query's hits under one condition, best first (rank 1 is ``hits[0]``): a read-only sequence of Hit."""

    query: str
    condition: str
    hits: tuple[Hit, ...]

    @overload
    def __getitem__(self, i: int) -> Hit: ...
    @overload
    def __getitem__(self, i: slice) -> Hits: ...
    def __getitem__(self, i: int | slice) -> Hit | Hits:
        if isinstance(i, slice):
            return Hits(self.query, self.condition, self.hits[i])
        return self.hits[i]

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def to_dicts(self) -> list[dict[str, Any]]:
        """Return one ``{rank, id, score, text, row}`` dict per hit, best first."""
        return [{"rank": r + 1, "id": h.id, "score": h.score, "text": h.text, "row": h.row} for r, h in enumerate(self)]

    def to_arrow(self) -> pa.Table:
        """Return the hits as a pyarrow Table with columns rank, id, score, text, row."""
        import pyarrow as pa

        return pa.table(
            {
                "rank": pa.array(range(1, len(self) + 1), type=pa.int64()),
                "id": pa.array([h.id for h in self]),
                "score": pa.array([h.score for h in self], type=pa.float64()),
                "text": pa.array([h.text for h in self], type=pa.string()),
                "row": pa.array([h.row for h in self], type=pa.int64()),
            }
        )

    def to_pandas(self) -> pd.DataFrame:
        """Return the hits as a pandas DataFrame with columns rank, id, score, text, row (pandas must be installed)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise CondsearchError("Hits.to_pandas needs pandas: pip install pandas (or use to_arrow)") from exc
        return pd.DataFrame(self.to_dicts(), columns=list(COLUMNS))
