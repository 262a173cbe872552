"""The ``torchgraft`` command group, its exit codes and its error reporting.

Exit codes: 0 ok, 1 the work is incomplete (a graft left keys missing, a diff found
differences), 2 bad input (missing file, unknown format, corrupt or unsafe file, bad
arguments). Errors are one line on stderr naming the file; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import logging
import sys
import traceback

import click

from .. import __version__
from ..errors import TorchgraftError
from .convert_command import convert_command
from .demo_command import demo
from .diff_command import diff_command
from .export_command import export_command
from .graft_command import graft_command
from .inspect_command import inspect

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "cli", "main"]

EXIT_OK = 0
EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(__version__, prog_name="torchgraft")
def cli(debug: bool) -> None:
    """Get any PyTorch checkpoint into any model."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


cli.add_command(inspect)
cli.add_command(graft_command)
cli.add_command(diff_command)
cli.add_command(convert_command)
cli.add_command(export_command)
cli.add_command(demo)


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit code.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        result = cli.main(args=args, prog_name="torchgraft", standalone_mode=False)
    except TorchgraftError as exc:
        if "--debug" in args:
            traceback.print_exc()
        click.echo(f"torchgraft: error: {exc}", err=True)
        return EXIT_BAD_INPUT
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return EXIT_BAD_INPUT
    except click.Abort:
        click.echo("torchgraft: aborted", err=True)
        return 130
    return int(result) if isinstance(result, int) else EXIT_OK
