"""``torchgraft graft``: fill a model built from a factory, save it, print the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from .options import source_options
from .render import print_json, print_report, safe_text
from .text import one_line, shorten

if TYPE_CHECKING:  # torch is imported when the command runs, not to list or complete it
    from ..graft import GraftReport
    from ..graft.plan.adapt import LabelMap

__all__ = ["graft_command"]


def _label_map(text: str | None) -> LabelMap | None:
    """Parse --label-map: a JSON list of rows (null for new ones) or an object of row pairs."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--label-map") from None
    if isinstance(data, dict) and all(k.isascii() and k.isdigit() and isinstance(v, int)
                                      for k, v in data.items()):
        return {int(k): v for k, v in data.items()}
    if isinstance(data, list) and all(v is None or isinstance(v, int) for v in data):
        return data
    raise click.BadParameter("give a list of checkpoint rows (null for a new row) or an object "
                             '{"model_row": checkpoint_row}', param_hint="--label-map")


@click.command("graft")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--model", "model_spec", required=True, metavar="MODULE:FACTORY",
              help="Builds the target: package.module:factory or path/to/file.py:factory.")
@click.option("--model-kwargs", default=None, metavar="JSON", help="Keyword arguments for it.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Where to save the grafted weights; the suffix picks the format "
                   "(.safetensors, .pt/.pth/.bin, .pdparams, .npz; none: a DCP folder).")
@click.option("--rules", type=click.Path(path_type=Path), default=None,
              help="JSON/YAML file of [pattern, replacement] rules (null drops a key) and "
                   "operations ({op: concatenate|split|rotary|transpose|..., from, to}).")
@click.option("--match", type=click.Choice(["auto", "name", "structure"]), default="auto")
@click.option("--init", type=click.Choice(["keep", "normal", "zeros"]), default="keep",
              help="How new rows of adapted tensors are filled.")
@click.option("--label-map", default=None, metavar="JSON",
              help="Rows to keep when a head's rows differ: a list (item i = the checkpoint row "
                   "for model row i, null for a new row) or {model_row: checkpoint_row}.")
@click.option("--no-adapt", is_flag=True, help="Copy exact shapes only.")
@click.option("--strict", is_flag=True, help="Fail if any key is missing or unused.")
@click.option("--allow-incomplete", is_flag=True,
              help="Save --out even when the graft is not ok (keys missing, guesses not "
                   "verified, outputs differ).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--unsafe", is_flag=True, help="Let the checkpoint's pickle run code. Trusted "
                                             "files only.")
@source_options
@click.option("--verify/--no-verify", "verify", default=None,
              help="Compare outputs with the source's own model (a folder's config.json names "
                   "a transformers class, or --source-model), on inputs generated from its "
                   "config or read from --inputs; where they diverge, try the guesses of the "
                   "first diverging module. Default: when there is something to compare with "
                   "and the weights are at most 2 GiB; --verify fails (exit 2) without one.")
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path), default=None,
              help="Inputs to compare outputs on: a .safetensors or .pt file of tensors named "
                   "by forward argument (input_ids, pixel_values, input_features...).")
@click.option("--source-model", "source_spec", default=None, metavar="MODULE:FACTORY",
              help="Builds a model of the source's code base (as --model does) to fill from "
                   "SOURCE and compare outputs with.")
@click.option("--source-model-kwargs", default=None, metavar="JSON",
              help="Keyword arguments for --source-model.")
@click.option("--layout-of", "layout_of", type=click.Path(path_type=Path), default=None,
              help="Save --out in this checkpoint's names, layouts and dtypes (its metadata is "
                   "read, not its weights): the graft from it into the model, run backwards.")
@click.option("--layout-rules", type=click.Path(path_type=Path), default=None,
              help="Rules file for the graft from --layout-of into the model (as --rules).")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write the report as a page: both module trees, linked and coloured.")
@click.option("--details", is_flag=True, help="List every renamed key (default: a summary).")
@click.option("--quiet", "-q", is_flag=True, help="Print the one-line verdict only.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def graft_command(source: Path, model_spec: str, model_kwargs: str | None, out: Path,
                  rules: Path | None, match: str, init: str, label_map: str | None,
                  no_adapt: bool, strict: bool, allow_incomplete: bool,
                  overwrite: bool, unsafe: bool, weights_key: str | None,
                  component: str | None, follow_links: bool, verify: bool | None,
                  inputs_path: Path | None, source_spec: str | None,
                  source_model_kwargs: str | None, layout_of: Path | None,
                  layout_rules: Path | None, html_path: Path | None,
                  details: bool, quiet: bool, as_json: bool) -> int:
    """Graft SOURCE (any checkpoint) into a model and save the result.

    Exit codes: 0 ok (every model key filled, by name or structure, or outputs compared
    equal), 1 incomplete (keys missing, or --strict failed), 2 bad input, 3 unverified (every
    key filled, some by a guess among same-shape candidates), 4 diverged (outputs differ).
    A graft that is not ok (incomplete, unverified or diverged) saves nothing unless
    --allow-incomplete: settle an unverified one with --verify (and --inputs or
    --source-model) first. With --layout-of, a model that does not fit that checkpoint's
    layout is bad input (exit 2) unless --allow-incomplete.
    """
    from ..graft import GraftError, graft
    from ..graft.sides.inputs import read_inputs
    from ..save import resolve_format, save
    from .factory import build_model

    console = Console(soft_wrap=as_json)
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite to replace it")
    resolve_format(out, None, legacy=False)  # an output suffix no format writes: before any work
    rows = _label_map(label_map)
    inputs = read_inputs(inputs_path) if inputs_path is not None else None
    source_model = None if source_spec is None else (
        lambda: build_model(source_spec, source_model_kwargs))
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as bar:
        task = bar.add_task("building the model", total=None)
        model = build_model(model_spec, model_kwargs)
        bar.update(task, description="grafting")
        try:
            report: GraftReport = graft(
                source, model, rules=rules, match=match, adapt=not no_adapt,  # type: ignore[arg-type]
                init=init, strict=strict, unsafe=unsafe, label_map=rows,  # type: ignore[arg-type]
                weights_key=weights_key, component=component, follow_links=follow_links,
                verify="auto" if verify is None else verify, example_inputs=inputs,
                source_model=source_model,
                progress=lambda done, total: bar.update(task, completed=done, total=total))
            failed = None
        except GraftError as exc:
            report, failed = exc.report, str(exc)
        if failed is None and not report.ok and not allow_incomplete:
            settle = ("settle what was guessed or assumed with --verify (and --inputs or "
                      "--source-model), or "
                      if report.complete else "")
            failed = (f"not saved to {one_line(str(out))}: the graft is not ok (see above); "
                      f"{settle}--allow-incomplete saves it anyway")
        if failed is None:
            bar.update(task, description="saving", completed=0, total=None)
            save(model, out, overwrite=overwrite, layout_of=layout_of, rules=layout_rules,
                 allow_incomplete=allow_incomplete,
                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    if html_path is not None:
        report.to_html(html_path)
    if as_json:
        print_json(console, {**report.to_dict(), "out": None if failed else str(out),
                             "html": None if html_path is None else str(html_path),
                             "error": failed})
        return _exit_code(report, failed)
    print_report(console, report, details=details, quiet=quiet)
    if failed:
        console.print(f"[red]{safe_text(failed)}[/red]")
    elif not quiet:
        room = max(console.width - 14, 20) if console.is_terminal else 1 << 16
        console.print(f"saved {escape(shorten(one_line(str(out)), room))}", highlight=False,
                      soft_wrap=True)
        if html_path is not None:
            console.print(f"report page {escape(shorten(one_line(str(html_path)), room))}",
                          highlight=False, soft_wrap=True)
    return _exit_code(report, failed)


def _exit_code(report: GraftReport, failed: str | None) -> int:
    """The verdict's exit code (0, 1, 3, 4); 1 when a strict graft failed on an ok verdict."""
    return 1 if failed is not None and report.ok else report.exit_code
