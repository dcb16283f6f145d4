"""What every ``miniverl`` sub-command shares: consoles and the user-error exit path.

A :class:`~miniverl.errors.MiniverlError` is printed as message + hint on stderr (never
parsed as rich markup, so ``[a-z]`` in a message survives) with exit status 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from miniverl.errors import MiniverlError
from miniverl.utils.io import is_disk_full, storage_error


def _hide_flag_types() -> None:
    """Show no value type for a boolean flag in ``--help``.

    Typer renders every flag (``--version``, ``--fast``, ``--help``) with a ``<bool>`` type
    column, which reads as if the flag took a value. Flags take none, so their type column
    is left empty; every other option keeps its type.
    """
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_miniverl_flags_hidden", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    display_type_rich._miniverl_flags_hidden = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_hide_flag_types()

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

F = TypeVar("F", bound=Callable[..., Any])

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted overrides, validated like the file, e.g. train.cycles=4 loss.divergence=reverse_kl."
    ),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or event echo.")]
Verbose = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Also echo one line per cycle (rollouts, loss, KL)."),
]


def split_list(raw: str, option: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; an empty list is a usage error, not "use the defaults"."""
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items:
        raise fail(f"{option} needs a comma-separated list", code=2)
    return items


def fail(message: str, hint: str | None = None, code: int = 1) -> typer.Exit:
    """Print a user error and return the ``typer.Exit`` to raise."""
    err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    if hint:
        err_console.print(Text.assemble(("  hint: ", "dim"), hint), soft_wrap=True)
    return typer.Exit(code)


def handles_errors(func: F) -> F:
    """Turn MiniverlError into a clean message and a non-zero exit (no traceback).

    A full disk that escaped as a bare ``OSError`` is reported as ``RunStorageError``;
    any other exception is a bug and keeps its traceback (tests/hostile catches those).
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MiniverlError as exc:
            raise fail(exc.message, exc.hint) from None
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            error = storage_error(exc.filename or ".")
            raise fail(error.message, error.hint) from None

    return wrapper  # type: ignore[return-value]
