"""Click options whose defaults are read from a frozen config dataclass: each default has one home."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C")


def config_option(config: object, field: str, *decls: str, **attrs: Any) -> Callable[[F], F]:
    """Return ``click.option(*decls)`` for ``config.<field>``: passed as ``field``, defaulting to its value.

    ``config`` is an instance, so a default set in ``__post_init__`` (one that depends on another
    field) shows in --help too. A tuple of strings is given and shown as a comma-separated list.
    """
    value = getattr(config, field)
    if isinstance(value, tuple):
        value = ",".join(str(v) for v in value)
    return click.option(*decls, field, default=value, show_default=value is not None, **attrs)


def config_from(cls: type[C], params: Mapping[str, Any], **overrides: Any) -> C:
    """Build cls from the command's parameters named like its fields, then the overrides."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in params.items() if k in names and k not in overrides}, **overrides)


def given(ctx: click.Context, *names: str) -> list[str]:
    """Return the flags of the named parameters set on the command line (not left at their defaults)."""
    flags = {p.name: p.opts[-1] for p in ctx.command.params if isinstance(p, click.Option)}
    return [flags.get(n, n) for n in names if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]
