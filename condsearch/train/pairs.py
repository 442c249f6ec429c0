"""Conditional training pairs from labelled columns: C-STS-shaped rows drawn from a user's own table.

Two texts that share the value of one labelled column (A) and differ on another (B) make a
*contrast pair*, written twice as C-STS writes every pair: under A's condition with the high
label and under B's with the low one. Only such pairs teach that the condition, not the texts,
decides the score. With ``contrast_only=False``, plain pairs fill what the contrast pairs leave
of ``n_pairs``: two texts alike on A (high) or unlike on A (low), one row each.

Balance: the labelled columns take turns; within a column its values take turns, in an order
shuffled by the seed, and no value is the shared value of more than ``max_per_value`` pairs (by
default twice its even share of the column's pairs), so a value held by most texts cannot
dominate. Everything random is drawn from one ``numpy`` generator seeded by ``seed``.

This module holds no file or terminal access: :mod:`condsearch.train.pairs_files` reads the table
and writes the rows, ``condsearch pairs`` (:mod:`condsearch.cli.pairs`) drives both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from condsearch.corpus.csts import LABEL_MAX, LABEL_MIN, CstsData
from condsearch.errors import CorpusError

#: draws in a row that find no new pair before a value counts as exhausted
MAX_FAILED_DRAWS = 32
#: what separates a label spec's column from its phrasings, and one phrasing from the next
SPEC_SEPARATOR, PHRASING_SEPARATOR = "=", "|"
#: one draw for (column, value): True when it added a pair
_Draw = Callable[[str, str], bool]


@dataclass(frozen=True)
class LabelSpec:
    """A labelled column and the phrasings of its condition (one is chosen per row)."""

    column: str
    phrasings: tuple[str, ...]


def parse_label_spec(text: str) -> LabelSpec:
    """Parse ``COLUMN=CONDITION[|CONDITION…]``; ValueError says what is wrong with it."""
    column, sep, rest = text.partition(SPEC_SEPARATOR)
    if not sep:
        raise ValueError(f"{text!r} is not COLUMN=CONDITION (no '=')")
    column = column.strip()
    if not column:
        raise ValueError(f"{text!r} names no column before '='")
    phrasings = tuple(p.strip() for p in rest.split(PHRASING_SEPARATOR))
    if not all(phrasings):
        raise ValueError(f"{text!r} has an empty condition (write COLUMN=CONDITION[|CONDITION…])")
    if any("\n" in p or "\r" in p for p in phrasings):
        raise ValueError(f"{text!r}: a condition is one line")
    if len(set(phrasings)) != len(phrasings):
        raise ValueError(f"{text!r} repeats a condition")
    return LabelSpec(column, phrasings)


def check_label_specs(specs: Sequence[LabelSpec], text_column: str, *, contrast_only: bool) -> None:
    """Refuse labels that cannot make pairs: none, a repeated column or condition, the text column, one alone."""
    if not specs:
        raise ValueError("name at least one labelled column (--label COLUMN=CONDITION)")
    columns = [s.column for s in specs]
    for column in columns:
        if columns.count(column) > 1:
            raise ValueError(f"column {column!r} is labelled twice; give its conditions once, joined by '|'")
        if column == text_column:
            raise ValueError(f"column {column!r} holds the texts; it cannot also be a label")
    phrasings = [p for s in specs for p in s.phrasings]
    for phrasing in phrasings:
        if phrasings.count(phrasing) > 1:
            raise ValueError(f"condition {phrasing!r} is given to two columns; each column needs its own")
    if contrast_only and len(specs) < 2:
        raise ValueError(
            "contrast pairs need two labelled columns (alike under one, unlike under the other); "
            "name another --label, or write plain pairs with --no-contrast-only"
        )


@dataclass(frozen=True)
class PairsConfig:
    """How many pairs, how balanced, which labels; the CLI's defaults are read from here."""

    #: sentence pairs to draw (a contrast pair writes two rows, a plain pair one)
    n_pairs: int = 2000
    #: most pairs that share one value of a column [default (None): twice its even share]
    max_per_value: int | None = None
    #: the label of a pair under a condition its texts are alike on, and under one they differ on
    high: float = 5.0
    low: float = 1.0
    #: only contrast pairs; False fills up to n_pairs with plain pairs
    contrast_only: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_pairs < 1:
            raise ValueError("the number of pairs must be at least 1")
        if self.max_per_value is not None and self.max_per_value < 1:
            raise ValueError("the most pairs per value must be at least 1")
        scale = f"{LABEL_MIN:g}-{LABEL_MAX:g}"
        for name, value in (("high", self.high), ("low", self.low)):
            if not (math.isfinite(value) and LABEL_MIN <= value <= LABEL_MAX):
                raise ValueError(f"the {name} label {value} is not on the {scale} scale of C-STS")
        if not self.high > self.low:
            raise ValueError(f"the high label ({self.high:g}) must exceed the low one ({self.low:g})")


class NoContrastPairs(CorpusError):
    """No two texts share one label column's value and differ on another's; the message names the pairs flag."""

    def __init__(self, columns: Sequence[str], hint: str = "--no-contrast-only writes plain pairs") -> None:
        self.columns = list(columns)
        names = " and ".join(repr(c) for c in columns)
        super().__init__(
            f"no two texts share the value of one of {names} and differ on another (the columns may say the "
            f"same thing); {hint}"
        )


@dataclass(frozen=True)
class PairsResult:
    """The rows drawn and how they spread over the conditions and values."""

    rows: CstsData
    n_contrast: int
    n_plain: int
    #: column -> {"high": rows, "low": rows} under its condition
    per_condition: dict[str, dict[str, int]]
    #: column -> value -> pairs whose two texts share that value
    per_value: dict[str, dict[str, int]]
    #: column -> the most pairs one of its values could share
    max_per_value: dict[str, int]

    @property
    def n_pairs(self) -> int:
        return self.n_contrast + self.n_plain

    def summary(self) -> dict[str, object]:
        """Return the counts as JSON-ready data."""
        return {
            "rows": len(self.rows),
            "pairs": self.n_pairs,
            "contrast_pairs": self.n_contrast,
            "plain_pairs": self.n_plain,
            "per_condition": self.per_condition,
            "per_value": self.per_value,
            "max_per_value": self.max_per_value,
        }


def check_label_values(column: str, values: Sequence[str | None]) -> None:
    """Refuse a labelled column with no values, or one value only (nothing to contrast)."""
    distinct = {v for v in values if v is not None}
    if not distinct:
        raise CorpusError(f"column {column!r} has no values (every row with a text has it empty)")
    if len(distinct) == 1:
        raise CorpusError(f"column {column!r} holds one value only ({next(iter(distinct))!r}): nothing to contrast")


def make_pairs(
    texts: Sequence[str],
    labels: Mapping[str, Sequence[str | None]],
    specs: Sequence[LabelSpec],
    config: PairsConfig = PairsConfig(),
) -> PairsResult:
    """Draw C-STS rows from texts and their labels (``labels[column][i]``: text i's value, None where unknown).

    Raises CorpusError for fewer than two texts, a label column with no values or a single one,
    and labels among which no pair can be drawn.
    """
    if len(texts) < 2:
        raise CorpusError(f"{len(texts)} text(s): pairs need at least two")
    for spec in specs:
        if len(labels[spec.column]) != len(texts):
            raise ValueError(f"column {spec.column!r} has {len(labels[spec.column])} values for {len(texts)} texts")
        check_label_values(spec.column, labels[spec.column])
    drawer = _Drawer(texts, labels, specs, config)
    drawer.draw_contrast()
    if drawer.n_contrast == 0 and config.contrast_only:
        raise NoContrastPairs([s.column for s in specs])
    if not config.contrast_only:
        drawer.draw_plain()
    if drawer.n_pairs == 0:
        raise CorpusError("no pair of different texts could be drawn")
    return drawer.result()


@dataclass
class _Drawer:
    """The sampling state of one make_pairs call: the rows drawn so far, the pairs used, the counts per value."""

    texts: Sequence[str]
    labels: Mapping[str, Sequence[str | None]]
    specs: Sequence[LabelSpec]
    config: PairsConfig
    rng: np.random.Generator = field(init=False)
    sentence1: list[str] = field(default_factory=list)
    sentence2: list[str] = field(default_factory=list)
    condition: list[str] = field(default_factory=list)
    label: list[float] = field(default_factory=list)
    used: set[tuple[int, int]] = field(default_factory=set)
    n_contrast: int = 0
    n_plain: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.config.seed)
        self.columns = [s.column for s in self.specs]
        self.phrasings = {s.column: s.phrasings for s in self.specs}
        # column -> value -> rows holding it, values in sorted order so that the draw does not
        # depend on where in the file a value first appears
        self.rows_by_value: dict[str, dict[str, list[int]]] = {}
        for column in self.columns:
            groups: dict[str, list[int]] = {}
            for i, v in enumerate(self.labels[column]):
                if v is not None:
                    groups.setdefault(v, []).append(i)
            self.rows_by_value[column] = {v: groups[v] for v in sorted(groups)}
        self.per_value = {c: dict.fromkeys(self.rows_by_value[c], 0) for c in self.columns}
        self.per_condition = {c: {"high": 0, "low": 0} for c in self.columns}
        self.cap = {c: self._cap(c) for c in self.columns}

    @property
    def n_pairs(self) -> int:
        return self.n_contrast + self.n_plain

    def _cap(self, column: str) -> int:
        if self.config.max_per_value is not None:
            return self.config.max_per_value
        share = self.config.n_pairs / (len(self.columns) * len(self.rows_by_value[column]))
        return max(1, math.ceil(2 * share))

    def _pick(self, rows: Sequence[int]) -> int:
        return rows[int(self.rng.integers(len(rows)))]

    def _new_pair(self, i: int, j: int) -> bool:
        """Take (i, j) if neither it nor (j, i) was drawn before and the texts differ."""
        key = (min(i, j), max(i, j))
        if i == j or key in self.used or self.texts[i] == self.texts[j]:
            return False
        self.used.add(key)
        return True

    def _write(self, i: int, j: int, rows: Sequence[tuple[str, float]]) -> None:
        """Append the pair's rows, (column, label) each, in one random order of its two texts."""
        if self.rng.random() < 0.5:
            i, j = j, i
        for column, label in rows:
            phrasings = self.phrasings[column]
            self.sentence1.append(self.texts[i])
            self.sentence2.append(self.texts[j])
            self.condition.append(phrasings[int(self.rng.integers(len(phrasings)))])
            self.label.append(label)
            self.per_condition[column]["high" if label == self.config.high else "low"] += 1

    def _turns(self, candidates: Mapping[str, list[str]], draw: _Draw, *, capped: bool) -> None:
        """Give each column a draw in turn, each column's values a draw in turn, until n_pairs or none is left.

        A value leaves the turns after MAX_FAILED_DRAWS draws in a row that found no new pair, and
        with ``capped`` once it is the shared value of its column's most pairs per value.
        """
        active = {c: list(candidates[c]) for c in self.columns}
        for values in active.values():
            self.rng.shuffle(values)
        turn = dict.fromkeys(self.columns, 0)
        failed: dict[tuple[str, str], int] = {}

        def full(column: str, value: str) -> bool:
            return capped and self.per_value[column][value] >= self.cap[column]

        while self.n_pairs < self.config.n_pairs and any(active.values()):
            for column in self.columns:
                values = active[column]
                if self.n_pairs >= self.config.n_pairs or not values:
                    continue
                at = turn[column] % len(values)
                value = values[at]
                if not full(column, value):
                    failed[column, value] = 0 if draw(column, value) else failed.get((column, value), 0) + 1
                if full(column, value) or failed[column, value] >= MAX_FAILED_DRAWS:
                    values.pop(at)  # the next value takes this turn's place
                    turn[column] = at
                else:
                    turn[column] = at + 1

    def draw_contrast(self) -> None:
        """Draw contrast pairs: alike on a column's value, unlike on another column."""
        # column -> value -> other column -> its values there -> rows; only other columns with two values or more
        cells: dict[str, dict[str, dict[str, list[list[int]]]]] = {}
        for column in self.columns:
            cells[column] = {}
            for value, rows in self.rows_by_value[column].items():
                by_other: dict[str, list[list[int]]] = {}
                for other in self.columns:
                    if other == column:
                        continue
                    split: dict[str, list[int]] = {}
                    for i in rows:
                        w = self.labels[other][i]
                        if w is not None:
                            split.setdefault(w, []).append(i)
                    if len(split) >= 2:
                        by_other[other] = [split[w] for w in sorted(split)]
                if by_other:
                    cells[column][value] = by_other

        def draw(column: str, value: str) -> bool:
            by_other = cells[column][value]
            others = list(by_other)
            other = others[int(self.rng.integers(len(others)))]
            groups = by_other[other]
            a, b = self.rng.choice(len(groups), size=2, replace=False)
            i, j = self._pick(groups[int(a)]), self._pick(groups[int(b)])
            if not self._new_pair(i, j):
                return False
            self._write(i, j, [(column, self.config.high), (other, self.config.low)])
            self.per_value[column][value] += 1
            self.n_contrast += 1
            return True

        self._turns({c: list(cells[c]) for c in self.columns}, draw, capped=True)

    def draw_plain(self) -> None:
        """Fill up to n_pairs with plain pairs: alike on a column's value (high) or unlike on it (low), in turn."""

        def draw(column: str, value: str) -> bool:
            rows = self.rows_by_value[column]
            below_cap = self.per_value[column][value] < self.cap[column]
            if self.n_plain % 2 == 0 and below_cap and len(rows[value]) >= 2:  # alike: two texts of this value
                i, j = self._pick(rows[value]), self._pick(rows[value])
                label = self.config.high
            else:  # unlike: a text of this value and one of another, the other value drawn evenly
                others = [v for v in rows if v != value]
                i, j = self._pick(rows[value]), self._pick(rows[others[int(self.rng.integers(len(others)))]])
                label = self.config.low
            if not self._new_pair(i, j):
                return False
            self._write(i, j, [(column, label)])
            if label == self.config.high:
                self.per_value[column][value] += 1
            self.n_plain += 1
            return True

        self._turns({c: list(self.rows_by_value[c]) for c in self.columns}, draw, capped=False)

    def result(self) -> PairsResult:
        rows = CstsData(
            list(self.sentence1), list(self.sentence2), list(self.condition), np.asarray(self.label, dtype=np.float32)
        )
        per_value = {c: {v: n for v, n in counts.items() if n} for c, counts in self.per_value.items()}
        return PairsResult(rows, self.n_contrast, self.n_plain, self.per_condition, per_value, dict(self.cap))
