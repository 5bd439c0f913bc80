"""How every kubegpu command writes for people and for scripts (the README's "Output and exit codes").

- On a terminal: colour, and tables at the terminal's full width whose cells wrap only between words, so
  a file path, a device ID or a rule name is never cut; a table that cannot fit that way is printed as
  plain lines instead.
- Piped or redirected: no colour, no tables, no wrapping: one plain line per row (or `--json`), so grep
  and cut see whole records.
- Errors: one line on stderr (`error: ...`). Exit codes: 0 ok, 1 findings or errors found, 2 bad usage or
  input (EXIT_* below).
- A reader that goes away (`| head -1`) ends the command quietly (`quiet_broken_pipe`).

rich is imported only when a console is made: the daemons import this package and never draw tables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
# A command stopped by its reader going away: what a shell reports for any filter killed by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13


def is_terminal() -> bool:
    """Whether stdout is a terminal a person reads (tables, colour) rather than a pipe or a file."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        return False


def console() -> Console:
    """A rich console for stdout: the terminal's width and colour there, plain unwrapped lines otherwise."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich's own exits 1
            self.quiet = True
            quiet_broken_pipe()

    if is_terminal():
        return _Console(highlight=False, soft_wrap=True)
    # Not a terminal: no colour codes and no wrapping at all (rich would wrap at 80 columns).
    return _Console(highlight=False, soft_wrap=True, color_system=None, width=10_000, force_terminal=False)


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def error(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """The convention's error: one line on stderr, then exit (2, bad usage or input, unless told)."""
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()
    sys.exit(code)


def quiet_broken_pipe() -> NoReturn:
    """Stop quietly after stdout's reader went away: no traceback, no 'Exception ignored' at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout then goes nowhere
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(EXIT_BROKEN_PIPE)


def flush_stdout() -> None:
    """Flush what is buffered for stdout before exiting; a reader that went away ends us quietly."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_broken_pipe()
    except (OSError, ValueError):
        pass


def _plain(cell: Any) -> str:
    return one_line(cell.plain if hasattr(cell, "plain") else str(cell))


def _longest_word(cell: Any) -> int:
    text = cell.plain if hasattr(cell, "plain") else str(cell)
    return max((len(word) for word in text.split()), default=0)


def print_table(
    out: Console,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    plain: Callable[[Sequence[Any]], str] | None = None,
) -> None:
    """Rows as a table on a terminal (wrapping only between words), else one plain line per row.

    `plain` makes a row's line, which then says by itself what it is (default: the title and the header,
    then the cells joined by tabs); the same lines are used on a terminal too narrow for the
    table's longest words.
    """
    if rows and out.is_terminal and _fits(out.width, columns, rows):
        from rich.table import Table
        from rich.text import Text

        table = Table(title=title, title_justify="left")
        for index, name in enumerate(columns):
            widest = max([_longest_word(name), *(_longest_word(r[index]) for r in rows)])
            table.add_column(name, min_width=widest, overflow="fold")
        for row in rows:
            table.add_row(*[c if isinstance(c, Text) else Text(str(c)) for c in row])
        out.print(table, soft_wrap=False)
        return
    if not rows:
        return
    lines = [plain(row) if plain else "\t".join(_plain(c) for c in row) for row in rows]
    if plain is None:  # generic rows, tab-separated (`cut -f`): the title and the header say what they are
        lines[:0] = [f"{title}:", "\t".join(columns)] if title else ["\t".join(columns)]
    for line in lines:
        print_line(out, line)


def print_line(out: Console, line: str, style: str | None = None) -> None:
    """One record: whole when piped; on a terminal wrapped only between words (continuations indented),
    a word longer than the terminal left whole on a line of its own. `style`: rich's, on a terminal."""
    if not out.is_terminal:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    import textwrap

    wrapped = textwrap.wrap(
        line, out.width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    for part in wrapped or [""]:
        out.print(part, markup=False, highlight=False, overflow="ignore", crop=False, style=style)


def _fits(width: int, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bool:
    """Whether each column can be as wide as its longest word: borders and padding take 3 per column + 1."""
    needed = sum(
        max([_longest_word(name), *(_longest_word(r[i]) for r in rows)]) for i, name in enumerate(columns)
    )
    return needed + 3 * len(columns) + 1 <= width
