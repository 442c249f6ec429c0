"""Metadata filters (issue 59): a SQL ``WHERE`` condition over an index's kept columns, as the rows it allows.

The condition is parsed by sqlglot (a SQL parser) and turned into a pyarrow compute expression, which
pyarrow evaluates over the index's kept columns (and ``id``); :func:`allowed_rows` returns the row
positions it keeps, which the search then ranks among (:mod:`condsearch.base.filtered_search`). What
it reads: comparisons (``= != <> < <= > >=``), ``AND``, ``OR``, ``NOT``, parentheses, ``IN (…)``,
``BETWEEN … AND …``, ``IS [NOT] NULL``, ``LIKE``/``ILIKE`` and literals (strings in single quotes,
numbers, ``TRUE``/``FALSE``, ``DATE '…'``, ``TIMESTAMP '…'``); a column named with spaces is quoted
``"like this"``. A string literal compared with a column of another type is read as that type
(``year >= '2020'``, ``day >= '2024-01-31'``); one that is not (``year >= 'abc'``) is refused. As in SQL, a
null never compares true. Every refusal is a one-line :class:`~condsearch.errors.FilterError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from condsearch.errors import FilterError, first_line

#: the longest filter read (a filter is a line of conditions, not a program)
MAX_WHERE_CHARS = 4096
#: the row-number column added while filtering (no kept column can be named so: names are text without NUL)
_ROW = "\x00row"
_SQL_TYPES = {"DATE": pa.date32(), "TIMESTAMP": pa.timestamp("us"), "DATETIME": pa.timestamp("us")}


@dataclass(frozen=True)
class Where:
    """A parsed filter: its text and sqlglot's tree, checked for syntax; columns and types are checked per index."""

    text: str
    tree: Any  # sqlglot.exp.Expression


def parse_where(text: object) -> Where:
    """Return the filter text parsed; refuse anything but one SQL condition, in one line."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    if not isinstance(text, str):
        raise FilterError(f"a filter is a string, not {type(text).__name__}")
    if not text.strip():
        raise FilterError("the filter is empty")
    if len(text) > MAX_WHERE_CHARS:
        raise FilterError(f"the filter is longer than {MAX_WHERE_CHARS} characters")
    try:
        tree = sqlglot.parse_one(text)
    except SqlglotError as exc:
        raise FilterError(f"cannot read the filter {text!r}: {_reason(exc)}") from None
    if tree is None or isinstance(tree, exp.Block | exp.Query | exp.Command | exp.DDL | exp.DML):
        raise FilterError(f"the filter {text!r} is not one condition (like lang = 'en' AND year >= 2020)")
    return Where(text, tree)


def _reason(exc: Exception) -> str:
    """Return a sqlglot error's first line without its ANSI markup (it underlines where it stopped)."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", first_line(exc))


def allowed_rows(where: Where, table: pa.Table) -> np.ndarray:
    """Return the positions (sorted int64) of the table's rows that the filter keeps; refuse it in one line.

    ``table`` holds the columns a filter may name (an index's kept columns and its ids), row i for row i.
    """
    expression, names = _Translator(where, table.schema).expression()
    wanted = table.select(sorted(names)) if names else table.select([])
    wanted = wanted.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    try:
        kept = wanted.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise FilterError(f"cannot apply the filter {where.text!r}: {first_line(exc)}") from None
    return kept.column(_ROW).to_numpy().astype(np.int64, copy=False)


class _Translator:
    """One filter's sqlglot tree into a pyarrow expression, checked against one table's columns and types."""

    def __init__(self, where: Where, schema: pa.Schema) -> None:
        self.where, self.schema = where, schema
        self.names: set[str] = set()

    def expression(self) -> tuple[pc.Expression, set[str]]:
        out = self._condition(self.where.tree)
        if not isinstance(out, pc.Expression):
            raise FilterError(f"the filter {self.where.text!r} is not a condition on columns")
        return out, self.names

    def _fail(self, node: Any, why: str) -> FilterError:
        return FilterError(f"filter {self.where.text!r}: {why} (at {node.sql()!r})")

    def _condition(self, node: Any) -> pc.Expression:
        from sqlglot import exp

        if isinstance(node, exp.Paren):
            return self._condition(node.this)
        if isinstance(node, exp.And):
            return self._condition(node.left) & self._condition(node.right)
        if isinstance(node, exp.Or):
            return self._condition(node.left) | self._condition(node.right)
        if isinstance(node, exp.Not):
            return ~self._condition(node.this)
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self._fail(node, "IS takes NULL (IS NULL, IS NOT NULL)")
            return self._column(node.this)[0].is_null()
        if isinstance(node, exp.In):
            if node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise self._fail(node, "IN takes a list of values")
            column, kind = self._column(node.this)
            values = [self._value(v, kind, node) for v in node.expressions]
            return column.isin(pa.array(values, type=kind if not pa.types.is_null(kind) else None))
        if isinstance(node, exp.Between):
            column, kind = self._column(node.this)
            low, high = self._value(node.args["low"], kind, node), self._value(node.args["high"], kind, node)
            return (column >= pc.scalar(low)) & (column <= pc.scalar(high))
        if isinstance(node, exp.Like | exp.ILike):
            column, kind = self._column(node.this)
            if not _is_string(kind):
                raise self._fail(node, f"LIKE matches text; column {node.this.sql()} holds {kind}")
            pattern = self._value(node.expression, kind, node)
            return pc.match_like(column, pattern, ignore_case=isinstance(node, exp.ILike))
        compare = _COMPARISONS.get(type(node).__name__)
        if compare is not None:
            return self._comparison(node, compare)
        if isinstance(node, exp.Column | exp.Boolean):
            if isinstance(node, exp.Column):
                column, kind = self._column(node)
                if pa.types.is_boolean(kind):
                    return column == pc.scalar(True)
            raise self._fail(node, "not a condition (compare it: flag = TRUE)")
        raise self._fail(node, f"{type(node).__name__.upper()} is not read in filters")

    def _comparison(self, node: Any, compare: str) -> pc.Expression:
        from sqlglot import exp

        left, right = node.this, node.expression
        if not isinstance(left, exp.Column) and isinstance(right, exp.Column):
            left, right, compare = right, left, _MIRRORED[compare]
        if not isinstance(left, exp.Column):
            raise self._fail(node, "a comparison names a column")
        column, kind = self._column(left)
        if isinstance(right, exp.Column):
            other, other_kind = self._column(right)
            if _family(kind) != _family(other_kind):
                raise self._fail(node, f"column {left.sql()} holds {kind}, column {right.sql()} {other_kind}")
            return _apply(compare, column, other)
        if isinstance(right, exp.Null):
            raise self._fail(node, "nothing equals NULL: write IS NULL or IS NOT NULL")
        return _apply(compare, column, pc.scalar(self._value(right, kind, node)))

    def _column(self, node: Any) -> tuple[pc.Expression, pa.DataType]:
        from sqlglot import exp

        if not isinstance(node, exp.Column) or node.table:
            raise self._fail(node, "expected a column name")
        name = node.name
        if name not in self.schema.names:
            available = ", ".join(self.schema.names) or "none"
            raise FilterError(f"filter {self.where.text!r}: no column {name!r}; the index keeps: {available}")
        kind = self.schema.field(name).type
        if _family(kind) == "other":
            raise self._fail(node, f"column {name!r} holds {kind}, which filters do not compare")
        self.names.add(name)
        return pc.field(name), kind

    def _value(self, node: Any, kind: pa.DataType, where: Any) -> Any:
        """Return a literal as a value of the column's type, refusing one of another type."""
        from sqlglot import exp

        value: Any
        if isinstance(node, exp.Paren):
            return self._value(node.this, kind, where)
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            value = -_number(node.this)
        elif isinstance(node, exp.Literal):
            value = node.this if node.is_string else _number(node)
        elif isinstance(node, exp.Boolean):
            value = bool(node.this)
        elif isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
            sql_type = node.to.sql().upper()
            if sql_type not in _SQL_TYPES:
                raise self._fail(where, f"a literal may be cast to {', '.join(_SQL_TYPES)} only")
            value = self._cast(node.this.this, _SQL_TYPES[sql_type], where)
            if _family(kind) != "time":
                raise self._fail(where, f"a {sql_type} is compared with a column of {kind}")
            return value
        elif isinstance(node, exp.Null):
            raise self._fail(where, "a list or range holds no NULL")
        else:
            raise self._fail(where, f"{node.sql()!r} is not a literal value")
        family = _family(kind)
        if family == "null":
            return value
        if isinstance(value, str):
            return value if family == "string" else self._cast(value, kind, where)
        if family == "boolean" and isinstance(value, bool):
            return value
        if family == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return value
        shown = "TRUE" if value is True else "FALSE" if value is False else repr(value)
        raise self._fail(where, f"the column holds {kind}, and {shown} is not one")

    def _cast(self, text: str, kind: pa.DataType, where: Any) -> Any:
        try:
            return pa.scalar(text).cast(kind).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            raise self._fail(where, f"the column holds {kind}, and {text!r} is not one") from None


#: sqlglot's comparison nodes and the operator each is
_COMPARISONS = {"EQ": "==", "NEQ": "!=", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<="}
#: the operator that reads the same with its sides swapped (2020 <= year is year >= 2020)
_MIRRORED = {"==": "==", "!=": "!=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _apply(op: str, left: pc.Expression, right: pc.Expression) -> pc.Expression:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == ">":
        return left > right
    if op == ">=":
        return left >= right
    if op == "<":
        return left < right
    return left <= right


def _number(node: Any) -> int | float:
    text = node.this
    try:
        return int(text)
    except ValueError:
        return float(text)


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _family(kind: pa.DataType) -> str:
    """Return which literals a column's type compares with: string, number, boolean, time, null or other."""
    if _is_string(kind):
        return "string"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "number"
    if pa.types.is_boolean(kind):
        return "boolean"
    if pa.types.is_temporal(kind):
        return "time"
    if pa.types.is_null(kind):
        return "null"
    return "other"
