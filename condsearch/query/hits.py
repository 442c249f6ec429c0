"""What a query found, named: one :class:`Hit` per row, a query's :class:`Hits` best first, and their tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, overload

from condsearch.errors import CondsearchError
from condsearch.store.background import SCORE_PLACES  # noqa: F401 - a score's places, named here too

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: the columns of :meth:`Hits.to_dicts`, :meth:`Hits.to_pandas` and :meth:`Hits.to_arrow`
COLUMNS = ("rank", "id", "score", "text", "row")
#: the column calibrated hits add (:mod:`condsearch.query.calibration`)
Z_COLUMN = "z"
#: decimal places of a calibrated hit's z in an answer (JSON); a score's are SCORE_PLACES
Z_PLACES = 4
#: the column of each hit's kept columns (a dict), where its index keeps any (issue 59)
METADATA_COLUMN = "metadata"


@dataclass(frozen=True)
class Hit:
    """One row found for a query: its id, its score (cosine under the condition, higher is closer), text and row.

    ``z`` is set by a calibrated search only: the score's standard score against the index's background
    (:mod:`condsearch.query.calibration`); the score itself is the same either way. ``metadata``: the columns
    of the corpus that the index keeps, in their types. ``rank``: the hit's place in its query's results, 1 for
    the best, as :meth:`Hits.to_dicts` and the JSON answers give it; a Hit built without one (0) gets its place
    when put in a :class:`Hits`. Two hits are equal by what they found (rank is not compared).
    """

    id: str | int
    score: float
    text: str
    row: int  # the row's position in the index
    z: float | None = None
    #: the row's kept columns (``index --keep-columns``, issue 59), by name; empty where the index keeps none
    metadata: dict[str, Any] = field(default_factory=dict)
    #: 1-based place in its query's results (issue 59); 0 until a :class:`Hits` places it
    rank: int = field(default=0, compare=False)


@dataclass(frozen=True)
class Hits(Sequence[Hit]):
    """One query's hits under one condition, best first (rank 1 is ``hits[0]``): a read-only sequence of Hit.

    Each hit's ``rank`` is its place, 1 first: given (a slice keeps its hits' ranks, so ``hits[5:10]`` holds
    ranks 6 to 10), or, where a hit has none (0), its position here plus one. ``calibrated``: each hit carries
    its ``z``, and the tables a ``z`` column after ``row``. An index that keeps columns (``metadata_columns``)
    adds a ``metadata`` column last: each hit's dict of them.
    """

    query: str
    condition: str
    hits: tuple[Hit, ...]
    calibrated: bool = False
    #: the index's kept columns: where there are any, the tables carry each hit's ``metadata``
    metadata_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        hits = tuple(self.hits)
        if any(h.rank <= 0 for h in hits):  # placed here: the position, 1 first
            hits = tuple(h if h.rank > 0 else replace(h, rank=i + 1) for i, h in enumerate(hits))
        object.__setattr__(self, "hits", hits)

    @overload
    def __getitem__(self, i: int) -> Hit: ...
    @overload
    def __getitem__(self, i: slice) -> Hits: ...
    def __getitem__(self, i: int | slice) -> Hit | Hits:
        if isinstance(i, slice):
            return Hits(self.query, self.condition, self.hits[i], self.calibrated, self.metadata_columns)
        return self.hits[i]

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    @property
    def columns(self) -> tuple[str, ...]:
        """Return the tables' columns: rank, id, score, text, row, z when calibrated, metadata where any are kept."""
        columns = (*COLUMNS, Z_COLUMN) if self.calibrated else COLUMNS
        return (*columns, METADATA_COLUMN) if self.metadata_columns else columns

    def to_dicts(self) -> list[dict[str, Any]]:
        """Return one ``{rank, id, score, text, row}`` dict per hit (with ``z`` when calibrated, ``metadata`` where
        the index keeps columns), best first; ``rank`` is each hit's :attr:`Hit.rank`."""
        out = []
        for h in self:
            row: dict[str, Any] = {"rank": h.rank, "id": h.id, "score": h.score, "text": h.text, "row": h.row}
            if self.calibrated:
                row[Z_COLUMN] = h.z
            if self.metadata_columns:
                row[METADATA_COLUMN] = dict(h.metadata)
            out.append(row)
        return out

    def to_arrow(self) -> pa.Table:
        """Return the hits as a pyarrow Table with columns rank, id, score, text, row (and z when calibrated)."""
        import pyarrow as pa

        columns = {
            "rank": pa.array([h.rank for h in self], type=pa.int64()),
            "id": pa.array([h.id for h in self]),
            "score": pa.array([h.score for h in self], type=pa.float64()),
            "text": pa.array([h.text for h in self], type=pa.string()),
            "row": pa.array([h.row for h in self], type=pa.int64()),
        }
        if self.calibrated:
            columns[Z_COLUMN] = pa.array([h.z for h in self], type=pa.float64())
        if self.metadata_columns:
            fields = {name: pa.array([h.metadata.get(name) for h in self]) for name in self.metadata_columns}
            columns[METADATA_COLUMN] = pa.StructArray.from_arrays(list(fields.values()), list(fields))
        return pa.table(columns)

    def to_pandas(self) -> pd.DataFrame:
        """Return the hits as a pandas DataFrame with :attr:`columns` (pandas must be installed)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise CondsearchError("Hits.to_pandas needs pandas: pip install pandas (or use to_arrow)") from exc
        return pd.DataFrame(self.to_dicts(), columns=list(self.columns))
