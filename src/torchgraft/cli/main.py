"""The ``torchgraft`` command group, its exit codes and its error reporting.

Exit codes: 0 ok, 1 the work is incomplete (a graft left keys missing, a diff found
differences), 2 bad input (missing file, unknown format, corrupt or unsafe file, bad
arguments), 3 a graft is unverified (some keys were guessed among same-shape candidates),
4 a graft diverged (outputs compared and differ), 5 a graft that is not ok was saved anyway
(``--allow-unverified``, ``--allow-incomplete``), 130 interrupted (Ctrl-C). Errors are one
line on stderr naming the file, in the command line's words (flags, not Python arguments);
``--debug`` (anywhere on the line) adds the traceback. Arguments are checked before torch is
imported, so a bad one exits 2 at once.

Commands are imported when they run, not to list them: ``torchgraft --help``, ``--version``
and tab completion never import torch.
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
import warnings

import click

from .._version import __version__
from ..errors import TorchgraftError, TorchgraftWarning, UnknownFormatError
from ..logs import in_report
from ..text import one_line
from .interrupt import EXIT_INTERRUPTED, end_now, interrupted, interruptible
from .words import cli_words, format_names

__all__ = ["COMMANDS", "EXIT_BAD_INPUT", "EXIT_CODES", "EXIT_OK", "LazyGroup", "OneLineFormatter",
           "cli", "main"]

EXIT_OK = 0
EXIT_BAD_INPUT = 2

#: Every exit code, as ``--help`` and the README list them.
EXIT_CODES = ("0 ok; 1 incomplete (keys missing, --strict failed, differences found); 2 bad "
              "input (a missing, unknown, corrupt or unsafe file, or a bad argument); 3 "
              "unverified (a graft guessed some keys); 4 diverged (a graft's outputs differ); "
              "5 saved anyway (graft --allow-unverified or --allow-incomplete wrote --out though "
              "the graft is not ok); 130 interrupted (Ctrl-C: nothing half-written is left)")


# Command name to (module, function, one-line help): imported only when the command runs.
COMMANDS = {
    "inspect": ("inspect_command", "inspect",
                "Show a checkpoint's format, devices, wrappers, totals, extras and tensors."),
    "graft": ("graft_command", "graft_command",
              "Graft SOURCE (any checkpoint) into a model, report every key, and save the "
              "result."),
    "diff": ("diff_command", "diff_command",
             "Compare the weights of checkpoints A and B (any formats)."),
    "convert": ("convert_command", "convert_command",
                "Convert checkpoint SRC (any format) to DST, one tensor in memory at a time."),
    "export": ("export_command", "export_command",
               "Build MODULE:FACTORY, graft --checkpoint into it, and export it to ONNX."),
    "demo": ("demo_command", "demo",
             "A guided tour: fourteen checkpoint problems, the plain PyTorch error, and the "
             "fix."),
}


class LazyGroup(click.Group):
    """A command group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The command names, without importing any command."""
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import and return one command."""
        if cmd_name not in COMMANDS:
            return None
        module, name, _help = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f".{module}", __package__), name)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands in ``--help`` from their one-line help, importing none."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_m, _n, short) in COMMANDS.items()])

    def shell_complete(self, ctx: click.Context,
                       incomplete: str) -> list[click.shell_completion.CompletionItem]:
        """Complete command names from the table, importing none."""
        from click.shell_completion import CompletionItem

        return [CompletionItem(name, help=short) for name, (_m, _n, short) in COMMANDS.items()
                if name.startswith(incomplete)]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             help=f"Get any PyTorch checkpoint into any model.\n\nExit codes: {EXIT_CODES}.")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs (anywhere on "
                                            "the line).")
@click.version_option(__version__, prog_name="torchgraft")
def cli(debug: bool) -> None:
    """The ``torchgraft`` command group (its help text is built above, with the exit codes)."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(lambda record: not in_report(record))  # the report, printed, says it
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, handlers=[handler])
    # A graft that is not ok warns a script; the command line prints its report instead.
    warnings.filterwarnings("ignore", category=TorchgraftWarning)


class OneLineFormatter(logging.Formatter):
    """Log lines whose message is one line of text: names from files may hold terminal codes."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line, its message's control characters written out (a traceback stays)."""
        shown = logging.makeLogRecord(record.__dict__)
        shown.message = one_line(record.message)
        return super().formatMessage(shown)


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when ``None``, and then,
            on Ctrl-C, the process ends here (exit code 130) without the interpreter's
            teardown.

    Returns:
        The exit code.
    """
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    if debug:  # accepted anywhere: moved before the command, where the group reads it
        args = ["--debug", *(a for a in args if a != "--debug")]
    with interruptible():
        try:
            result = cli.main(args=args, prog_name="torchgraft", standalone_mode=False,
                              obj=tuple(a for a in args if a != "--debug"))  # as typed
        except TorchgraftError as exc:
            if debug:
                traceback.print_exc()
            if interrupted.is_set():  # the interrupt, as a library reported it
                return _interrupted(argv)
            click.echo(f"torchgraft: error: {one_line(error_text(exc))}", err=True)
            return EXIT_BAD_INPUT
        except click.exceptions.Exit as exc:
            return int(exc.exit_code)
        except click.ClickException as exc:  # a bad argument, found while parsing
            if debug:
                traceback.print_exc()
            click.echo(f"torchgraft: error: {one_line(exc.format_message())}", err=True)
            return EXIT_BAD_INPUT
        except (click.Abort, KeyboardInterrupt):
            return _interrupted(argv)
    return int(result) if isinstance(result, int) else EXIT_OK


def _interrupted(argv: list[str] | None) -> int:
    """Say that Ctrl-C stopped the command; end the process now if it is this one's."""
    click.echo("torchgraft: interrupted; nothing half-written is left (an existing file is as "
               "it was)", err=True)
    if argv is None:  # this process's own command line: end it now, not after a second of
        end_now(EXIT_INTERRUPTED)  # torch's teardown
    return EXIT_INTERRUPTED


def error_text(exc: TorchgraftError) -> str:
    """An error in the command line's words: flags for arguments, formats by their names."""
    text = str(exc)
    registry = sys.modules.get("torchgraft.io.registry")
    if isinstance(exc, UnknownFormatError) and registry is not None:
        readers = [fmt.name for fmt in registry.formats()]
        text = text.replace(", ".join(readers), format_names(readers))
    return cli_words(text)
