"""The Typer application, global options and error handling shared by every command.

Errors reach the user as one line on stderr with an exit code scripts can test; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import click
import typer

from tuner import __version__
from tuner.errors import (
    ConflictError,
    InvalidStateError,
    NotFoundError,
    StagetuneError,
    ValidationError,
)

# Exit codes, documented in `stagetune --help` and the README.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # invalid input: a spec, a schedule, an option
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4  # conflict or invalid state
EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="stagetune",
    help=(
        "Auto-tune variable batch-size schedules for data-parallel PyTorch training.\n\n"
        "Exit codes: 0 ok, 1 failure, 2 invalid input, 3 not found, 4 conflict, "
        "130 interrupted."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"stagetune {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    _state["debug"] = debug
    from tuner.settings import misspelt_settings

    # Settings ignore unknown STAGETUNE_* variables; one that looks like a setting is a typo
    # that would otherwise go unnoticed (a study in the default SQLite file, say).
    for name, meant in sorted(misspelt_settings(os.environ).items()):
        typer.echo(
            f"stagetune: warning: {name} is not a setting (ignored); did you mean {meant}?",
            err=True,
        )


def exit_code_for(error: BaseException) -> int:
    """The process exit code for an error that ends a command."""
    if isinstance(error, ValidationError):
        return EXIT_USAGE
    if isinstance(error, NotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, ConflictError | InvalidStateError):
        return EXIT_CONFLICT
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_FAILURE


def build_command() -> Any:
    """The command tree of :data:`app` (Typer's own copy of click), with one help style:
    flags show no value, a value shows as its name in capitals (``--url URL``, ``STUDY``),
    as well-kept CLIs do (Typer would print each parameter's Python type: ``<bool>``,
    ``<list[str]>``); each command a one-line summary in the command list."""
    root: Any = typer.main.get_command(app)

    def tidy(command: Any) -> None:
        helper = command.get_help_option(command.context_class(command))
        for param in [*command.params, *([helper] if helper is not None else [])]:
            if getattr(param, "is_flag", False):
                param.metavar = ""
            elif param.metavar is None:
                longest = max((*param.opts, param.name or ""), key=len)
                param.metavar = longest.lstrip("-").replace("-", "_").upper()
            if param.param_type_name == "argument":
                # Typer prints an argument's Python type after its name: the name says it.
                param.display_type_rich = lambda ctx: None
        for sub in getattr(command, "commands", {}).values():
            if sub.short_help is None and sub.help:
                # The command list shows the help's first paragraph with its line breaks,
                # which wrap mid-sentence there: one line per command instead.
                sub.short_help = " ".join(sub.help.split("\n\n")[0].split())
            tidy(sub)

    tidy(root)
    return root


def main() -> None:
    """Console entry point (``stagetune``)."""
    try:
        # Without standalone mode click *returns* the code of a ``typer.Exit(code)`` raised in
        # a command (``replay --tolerance``, an interrupted ``tune``) instead of exiting.
        code = build_command().main(standalone_mode=False)
        if isinstance(code, int) and code != EXIT_OK:
            sys.exit(code)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        typer.echo("Interrupted.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:  # the one place every command's errors end up
        # Typer (0.2x) raises its own copy of click's exceptions (usage errors: exit 2).
        if isinstance(error, click.ClickException | typer.TyperException) and hasattr(
            error, "show"
        ):
            error.show()
            sys.exit(int(getattr(error, "exit_code", EXIT_USAGE)))
        if _state["debug"]:
            raise
        kind = "error" if isinstance(error, StagetuneError) else type(error).__name__
        typer.echo(f"stagetune: {kind}: {error}", err=True)
        sys.exit(exit_code_for(error))
