"""``torchgraft graft``: fill a model built from a factory, save it, print the report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape

from ..text import one_line, shorten
from .advice import settling_command
from .checks import existing_file, factory_spec, input_shape, json_object, label_rows, source_path
from .options import source_options
from .outputs import WRITERS, output_format
from .progress import steps
from .render import print_json, print_report, safe_text
from .words import cli_words

if TYPE_CHECKING:  # torch is imported when the command runs, not to list or complete it
    from torch import nn

    from ..graft import GraftReport
    from ..graft.sides.inputs import Inputs

__all__ = ["EXIT_SAVED_ANYWAY", "graft_command"]

#: A graft that is not ok, saved all the same (``--allow-incomplete``).
EXIT_SAVED_ANYWAY = 5


@click.command("graft")
@click.argument("source", type=click.Path(path_type=Path), callback=source_path)
@click.option("--model", "model_spec", required=True, metavar="MODULE:FACTORY",
              callback=factory_spec,
              help="Builds the target: package.module:factory or path/to/file.py:factory.")
@click.option("--model-kwargs", default=None, metavar="JSON", callback=json_object,
              help="Keyword arguments for it, a JSON object.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where to save the grafted weights; the suffix picks the format "
                   "(.safetensors; .pt, .pth, .bin; .pdparams; .npz), or --format. Without "
                   "--out the graft is reported, not saved.")
@click.option("--format", "fmt", type=click.Choice(list(WRITERS)), default=None,
              help="Format of --out (default: from its suffix); dcp writes a "
                   "torch.distributed.checkpoint folder, and an --out without a suffix needs "
                   "it.")
@click.option("--dry-run", is_flag=True,
              help="Graft and report, check that --out could be written, and save nothing.")
@click.option("--rules", type=click.Path(path_type=Path), default=None, callback=existing_file,
              help="JSON/YAML file of [pattern, replacement] rules (null drops a key) and "
                   "operations ({op: concatenate|split|rotary|transpose|..., from, to}).")
@click.option("--match", type=click.Choice(["auto", "name", "structure"]), default="auto",
              show_default=True,
              help="How model keys find checkpoint keys: name (exact names, wrapper prefixes, "
                   "rules and known layouts), structure (module shapes and order alone), or "
                   "auto (names, then structure for what is left).")
@click.option("--init", type=click.Choice(["keep", "normal", "zeros"]), default="keep",
              show_default=True,
              help="How new rows and re-initialised heads are filled: the model's own values, "
                   "normal (std 0.02, zero biases) or zeros.")
@click.option("--new", "new", multiple=True, metavar="PATTERN",
              help="Model keys that are new on purpose (a new head or neck): a glob such as "
                   "'head.*' or a module's name, repeatable. What they name and SOURCE does "
                   "not fill keeps the model's own values (or --init's) and is listed as new, "
                   "not missing; a pattern that names no model key is an error (exit 2).")
@click.option("--label-map", default=None, metavar="JSON", callback=label_rows,
              help="Rows to keep when a head's rows differ: a list (item i = the checkpoint row "
                   "for model row i, null for a new row) or {model_row: checkpoint_row}.")
@click.option("--no-adapt", is_flag=True,
              help="Copy exact shapes only: no new input channels, rows or re-initialised "
                   "heads.")
@click.option("--strict", is_flag=True,
              help="Save nothing and fail unless the graft is ok with every checkpoint key used "
                   "and no head re-initialised (bookkeeping buffers such as "
                   "num_batches_tracked aside), as load_state_dict(strict=True): exit 1, or "
                   "the verdict's 3 or 4.")
@click.option("--allow-incomplete", is_flag=True,
              help="Save --out even when the graft is not ok (keys missing, guesses not "
                   "verified, outputs differ); the exit code is then 5.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--unsafe", is_flag=True, help="Let the checkpoint's pickle run code. Trusted "
                                             "files only.")
@source_options
@click.option("--verify/--no-verify", "verify", default=None,
              help="Compare outputs with the source's own model (a folder's config.json names "
                   "a transformers class, or --source-model), on inputs generated from its "
                   "config or from the models (token ids in range of the first embedding, "
                   "images of the first convolution's channels in a size both take, audio), "
                   "read from --inputs or made by --input-shape; where they diverge, try the "
                   "guesses of the first diverging module. Default: when there is something to "
                   "compare with and the weights are at most 2 GiB; --verify fails (exit 2) "
                   "without one.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path), default=None,
              callback=existing_file,
              help="Inputs to compare outputs on: a .safetensors or .pt file of tensors named "
                   "by forward argument (input_ids, pixel_values, input_features...).")
@click.option("--input-shape", "shape", default=None, metavar="N,C,H,W", callback=input_shape,
              help="Compare outputs on one random input of this shape instead (e.g. "
                   "1,3,224,224: pixel values; integer --input-dtype: token ids in range of "
                   "the model's first embedding).")
@click.option("--input-dtype", type=click.Choice(["float32", "float16", "bfloat16", "float64",
                                                  "int64", "int32"]), default=None,
              help="dtype of the --input-shape input (default float32).")
@click.option("--source-model", "source_spec", default=None, metavar="MODULE:FACTORY",
              callback=factory_spec,
              help="Builds a model of the source's code base (as --model does) to fill from "
                   "SOURCE and compare outputs with.")
@click.option("--source-model-kwargs", default=None, metavar="JSON", callback=json_object,
              help="Keyword arguments for --source-model, a JSON object.")
@click.option("--layout-of", "layout_of", type=click.Path(path_type=Path), default=None,
              callback=source_path,
              help="Save --out in this checkpoint's names, layouts and dtypes (its metadata is "
                   "read, not its weights): the graft from it into the model, run backwards.")
@click.option("--layout-rules", type=click.Path(path_type=Path), default=None,
              callback=existing_file,
              help="Rules file for the graft from --layout-of into the model (as --rules).")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write the report as a page: both module trees, linked and coloured.")
@click.option("--save-rules", "rules_path", type=click.Path(path_type=Path), default=None,
              help="Write what the graft did (what comparing outputs found too) as a rules "
                   "file: fed back with --rules, the same graft is ok by rule, with no search. "
                   "Written only when the graft is ok.")
@click.option("--details", is_flag=True, help="List every renamed key (default: a summary).")
@click.option("--quiet", "-q", is_flag=True, help="Print the one-line verdict only.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def graft_command(source: Path, model_spec: str, model_kwargs: str | None, out: Path | None,
                  fmt: str | None, dry_run: bool, rules: Path | None, match: str, init: str,
                  label_map: list[int | None] | dict[int, int] | None, no_adapt: bool,
                  new: tuple[str, ...], strict: bool, allow_incomplete: bool, overwrite: bool,
                  unsafe: bool, weights_key: str | None, component: str | None,
                  follow_links: bool, verify: bool | None, inputs_path: Path | None,
                  shape: tuple[int, ...] | None, input_dtype: str | None, source_spec: str | None,
                  source_model_kwargs: str | None, layout_of: Path | None,
                  layout_rules: Path | None, html_path: Path | None, rules_path: Path | None,
                  details: bool, quiet: bool, as_json: bool) -> int:
    """Graft SOURCE (any checkpoint) into a model, report every key, and save the result.

    Exit codes: 0 ok (every model key filled, by name or structure, or outputs compared
    equal), 1 incomplete (keys missing that no --new declares, or --strict failed), 2 bad
    input, 3 unverified (every key filled, some by a guess among same-shape candidates), 4
    diverged (outputs differ), 5 saved anyway (--allow-incomplete saved --out though the
    graft is not ok), 130 interrupted. A graft that is not ok saves nothing (exit 1, 3 or 4)
    unless --allow-incomplete: settle an unverified one first with --verify --source-model
    MODULE:FACTORY (the command is printed, ready to copy). Without --out, or with --dry-run,
    nothing is saved and the exit code is the verdict's. With --layout-of, a model that does
    not fit that checkpoint's layout is bad input (exit 2) unless --allow-incomplete.
    """
    writes = _output(out, fmt, dry_run=dry_run, overwrite=overwrite, layout_of=layout_of,
                     layout_rules=layout_rules)
    if shape is not None and inputs_path is not None:
        raise click.UsageError("--inputs and --input-shape both give inputs: give one")
    if input_dtype is not None and shape is None:
        raise click.UsageError("--input-dtype is the dtype of the --input-shape input: give "
                               "--input-shape")
    from ..graft import GraftError, graft  # torch: after the arguments are checked
    from ..graft.sides.inputs import read_inputs
    from .factory import build_model

    console = Console(soft_wrap=as_json)
    inputs = read_inputs(inputs_path) if inputs_path is not None else None
    source_model = None if source_spec is None else (
        lambda: build_model(source_spec, source_model_kwargs, option="--source-model"))
    saved: Path | None = None
    settling = (None if quiet or as_json else
                _settling(source_spec is not None, inputs_path is not None or shape is not None))
    with steps("building the model", quiet=quiet) as shown:
        model = build_model(model_spec, model_kwargs)
        if shape is not None:
            inputs = _of_shape(shape, input_dtype, model)
        shown.step("grafting")
        try:
            report: GraftReport = graft(
                source, model, rules=rules, match=match, adapt=not no_adapt,  # type: ignore[arg-type]
                init=init, strict=strict, unsafe=unsafe, label_map=label_map,  # type: ignore[arg-type]
                weights_key=weights_key, component=component, follow_links=follow_links,
                verify="auto" if verify is None else verify, example_inputs=inputs,
                source_model=source_model, new=new, progress=shown.counter("tensors"))
            failed = None
        except GraftError as exc:
            report, failed = exc.report, cli_words(str(exc))
        if failed is None and out is not None and not report.ok and not allow_incomplete:
            failed = _not_saved(out, report, command_shown=settling is not None)
        if failed is None and out is not None and not dry_run:
            from ..save import save

            shown.step("saving")
            save(model, out, format=writes, overwrite=overwrite, layout_of=layout_of,
                 rules=layout_rules, allow_incomplete=allow_incomplete,
                 progress_bytes=shown.counter("bytes"))
            saved = out
    if html_path is not None:
        report.to_html(html_path)
    rules_saved = rules_path if rules_path is not None and report.ok else None
    if rules_saved is not None:
        report.to_rules(rules_saved)
    code = _exit_code(report, failed, saved)
    if as_json:
        print_json(console, {**report.to_dict(), "out": None if saved is None else str(saved),
                             "html": None if html_path is None else str(html_path),
                             "rules": None if rules_saved is None else str(rules_saved),
                             "error": failed, "exit_code": code})
        return code
    print_report(console, report, details=details, quiet=quiet)
    if settling is not None and report.verdict == "unverified":
        console.print("to settle it, compare outputs with the source's own model "
                      "(MODULE:FACTORY builds it, as --model builds yours):", highlight=False,
                      soft_wrap=True)
        console.print(f"  {escape(settling)}", highlight=False, soft_wrap=True)
    if failed:
        Console(stderr=True).print(f"[red]{safe_text(failed)}[/red]", highlight=False,
                                   soft_wrap=True)
    elif not quiet:
        _print_outcome(console, out if saved is None else saved, saved=saved is not None,
                       html_path=html_path)
    if rules_path is not None and not quiet:
        console.print(f"rules written to {escape(str(rules_saved))}: --rules takes them"
                      if rules_saved is not None else
                      f"rules not written to {escape(str(rules_path))}: the graft is not ok",
                      highlight=False, soft_wrap=True)
    return code


def _output(out: Path | None, fmt: str | None, *, dry_run: bool, overwrite: bool,
            layout_of: Path | None, layout_rules: Path | None) -> str | None:
    """The format --out is written in, every reason it could not be checked before any work."""
    if out is None:
        given = [name for name, value in (("--format", fmt), ("--layout-of", layout_of),
                                          ("--layout-rules", layout_rules)) if value]
        if given:
            raise click.UsageError(f"{given[0]} says how --out is written: give --out")
        return None
    if out.exists() and not (out.is_file() or out.is_dir()):
        raise click.UsageError(f"--out {out} is not a file or folder that a checkpoint can "
                               "replace; to report without saving, leave --out out (or pass "
                               "--dry-run)")
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite to replace it"
                               + ("" if dry_run else ", or --dry-run to save nothing"))
    return output_format(out, fmt, option="--out", choices=list(WRITERS))


def _not_saved(out: Path, report: GraftReport, *, command_shown: bool) -> str:
    settle = ("" if report.verdict != "unverified" else
              "settle it with the command above, or " if command_shown else
              "settle it with --verify --source-model MODULE:FACTORY, or ")
    return (f"not saved to {one_line(str(out))}: the graft is {report.verdict.value.upper()} "
            f"(see above); {settle}--allow-incomplete saves it anyway (exit 5)")


def _of_shape(shape: tuple[int, ...], dtype: str | None, model: nn.Module) -> Inputs:
    """The --input-shape input: random values of the shape, ids in range of the embedding."""
    import torch

    from ..graft.sides.inputs import of_shape

    return of_shape(shape, getattr(torch, dtype or "float32"), model)


def _settling(source_model: bool, inputs: bool) -> str | None:
    """The command that settles an unverified graft: the user's, with --verify and its model.

    None where it is not printed: outside the command line (a test's CliRunner), nothing to
    repeat.
    """
    typed = click.get_current_context().find_root().obj
    if not isinstance(typed, tuple):
        return None
    return settling_command(typed, source_model=source_model, inputs=inputs)


def _print_outcome(console: Console, out: Path | None, *, saved: bool,
                   html_path: Path | None) -> None:
    """``saved OUT`` (or that nothing was saved) and where the report page is."""
    room = max(console.width - 14, 20) if console.is_terminal else 1 << 16

    def path_text(path: Path) -> str:
        return escape(shorten(one_line(str(path)), room))

    if saved and out is not None:
        console.print(f"saved {path_text(out)}", highlight=False, soft_wrap=True)
    elif out is not None:
        console.print(f"dry run: nothing saved; --out {path_text(out)} would be written",
                      highlight=False, soft_wrap=True)
    else:
        console.print("report only: nothing saved (give --out to save)", highlight=False)
    if html_path is not None:
        console.print(f"report page {path_text(html_path)}", highlight=False, soft_wrap=True)


def _exit_code(report: GraftReport, failed: str | None, saved: Path | None) -> int:
    """0 ok; the verdict's 1, 3 or 4 when nothing was saved; 5 when saved anyway.

    A strict graft that failed on an ok verdict (unused keys, a re-initialised head) is 1.
    """
    if failed is not None:
        return 1 if report.ok else report.exit_code
    if saved is not None and not report.ok:
        return EXIT_SAVED_ANYWAY
    return report.exit_code
