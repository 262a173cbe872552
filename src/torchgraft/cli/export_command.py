"""``torchgraft export``: graft a checkpoint into a model, then export it to ONNX."""

from __future__ import annotations

import math
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from ..text import one_line
from .checks import factory_spec, json_object, source_path
from .progress import steps
from .render import print_json, print_report, safe_text
from .words import cli_words

__all__ = ["MAX_INPUT_VALUES", "MAX_OPSET", "MIN_OPSET", "export_command"]

#: The opsets export writes (as :mod:`torchgraft.onnx_export` checks them).
MIN_OPSET, MAX_OPSET = 9, 20
#: The most values an example input may hold (1 GiB of float32).
MAX_INPUT_VALUES = 1 << 28


def _shape(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, ...]:
    """``--input-shape``: positive sizes, comma-separated."""
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a shape such as 1,3,224,224") from None
    if not shape or min(shape) <= 0:
        raise click.BadParameter(f"{text!r} is not a shape such as 1,3,224,224")
    if math.prod(shape) > MAX_INPUT_VALUES:
        raise click.BadParameter(f"{text!r} holds {math.prod(shape):,} values; an example input "
                                 f"needs few (at most {MAX_INPUT_VALUES:,}): batch 1 will do")
    return shape


@click.command("export")
@click.argument("model_spec", metavar="MODULE:FACTORY", callback=factory_spec)
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              callback=source_path,
              help="Graft this checkpoint (any format) into the model first.")
@click.option("--model-kwargs", default=None, metavar="JSON", callback=json_object,
              help="Keyword arguments for the factory, a JSON object.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Where to write the ONNX model (a .onnx file).")
@click.option("--input-shape", "input_shape", required=True, callback=_shape, metavar="SHAPE",
              help="Shape of the example input, e.g. 1,3,224,224.")
@click.option("--opset", type=click.IntRange(MIN_OPSET, MAX_OPSET), default=17,
              show_default=True,
              help=f"ONNX opset, {MIN_OPSET} to {MAX_OPSET} (9 for TensorRT 5-era tools).")
@click.option("--dynamic-batch", is_flag=True, help="Let the first dimension vary.")
@click.option("--no-check", is_flag=True, help="Skip the onnxruntime comparison.")
@click.option("--strict", is_flag=True,
              help="Export nothing unless the graft is ok with every checkpoint key used and no "
                   "head re-initialised (as graft --strict).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def export_command(model_spec: str, checkpoint: Path | None, model_kwargs: str | None, out: Path,
                   input_shape: tuple[int, ...], opset: int, dynamic_batch: bool,
                   no_check: bool, strict: bool, overwrite: bool, as_json: bool) -> int:
    """Build MODULE:FACTORY, graft --checkpoint into it, and export it to ONNX.

    Exit codes: 0 exported; 1, 3 or 4 the graft is not ok (its verdict's code, as graft's:
    incomplete, unverified, diverged; nothing exported); 2 bad input; 130 interrupted.
    """
    if out.suffix.lower() != ".onnx":
        raise click.BadParameter(f"{out} does not end with .onnx: export writes an ONNX model "
                                 "(use convert or graft --out for checkpoints)",
                                 param_hint="'--out'")
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite to replace it")
    import torch  # torch: after the arguments are checked

    from ..graft import GraftError, graft
    from ..onnx_export import export_onnx
    from .factory import build_model

    console = Console(soft_wrap=as_json)
    failed = None
    with steps("building the model") as shown:
        model = build_model(model_spec, model_kwargs).eval()
        report = None
        if checkpoint is not None:
            shown.step("grafting")
            try:
                report = graft(checkpoint, model, strict=strict,
                               progress=shown.counter("tensors"))
            except GraftError as exc:
                report, failed = exc.report, cli_words(str(exc))
        if failed is None and (report is None or report.ok):
            shown.step("exporting and checking")
            dynamic = {"input0": {0: "batch"}} if dynamic_batch else None
            exported = export_onnx(model, (torch.randn(input_shape),), out, opset=opset,
                                   dynamic_axes=dynamic, check=not no_check,
                                   overwrite=overwrite)
    if report is not None and (failed is not None or not report.ok):
        code = 1 if report.ok else report.exit_code
        if as_json:
            print_json(console, {"graft": report.to_dict(), "export": None,
                                 "error": failed})
        else:
            print_report(console, report)
            why = failed or "the graft is not ok (see above)"
            Console(stderr=True).print(f"[red]not exported: {safe_text(why)}[/red]",
                                       highlight=False, soft_wrap=True)
        return code
    if as_json:
        print_json(console, {"graft": report.to_dict() if report else None,
                             "export": exported.to_dict()})
        return 0
    if report is not None:
        print_report(console, report)
    diff = "" if exported.max_abs_diff is None else \
        f"; onnxruntime vs PyTorch: max |diff| = {exported.max_abs_diff:.3g}"
    console.print(f"exported {escape(one_line(str(out)))} (opset {opset}){diff}", highlight=False)
    return 0
