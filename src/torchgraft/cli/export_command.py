"""``torchgraft export``: graft a checkpoint into a model, then export it to ONNX."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from .render import print_json, print_report

__all__ = ["export_command"]


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a shape such as 1,3,224,224") from None
    if not shape or min(shape) <= 0:
        raise click.BadParameter(f"{text!r} is not a shape such as 1,3,224,224")
    return shape


@click.command("export")
@click.argument("model_spec", metavar="MODULE:FACTORY")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None,
              help="Graft this checkpoint (any format) into the model first.")
@click.option("--model-kwargs", default=None, metavar="JSON", help="Keyword arguments for it.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="The .onnx file.")
@click.option("--input-shape", "input_shape", required=True,
              help="Shape of the example input, e.g. 1,3,224,224.")
@click.option("--opset", type=int, default=17, show_default=True,
              help="ONNX opset (9 for TensorRT 5-era tools).")
@click.option("--dynamic-batch", is_flag=True, help="Let the first dimension vary.")
@click.option("--no-check", is_flag=True, help="Skip the onnxruntime comparison.")
@click.option("--strict", is_flag=True, help="Fail if the graft leaves keys missing or unused.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the reports as JSON.")
def export_command(model_spec: str, checkpoint: Path | None, model_kwargs: str | None, out: Path,
                   input_shape: str, opset: int, dynamic_batch: bool, no_check: bool,
                   strict: bool, overwrite: bool, as_json: bool) -> int:
    """Build MODULE:FACTORY, graft --checkpoint into it, and export it to ONNX.

    Exit codes: 0 exported, 1 the graft left keys missing (nothing exported), 2 bad input.
    """
    console = Console(soft_wrap=as_json)
    if out.suffix.lower() != ".onnx":
        raise click.BadParameter(f"{out} does not end with .onnx: export writes an ONNX model "
                                 "(use convert or graft --out for checkpoints)",
                                 param_hint="'--out'")
    shape = _shape(input_shape)
    import torch  # torch is imported when the command runs, not to list or complete it

    from ..graft import graft
    from ..onnx_export import export_onnx
    from .factory import build_model

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("building the model", total=None)
        model = build_model(model_spec, model_kwargs).eval()
        report = None
        if checkpoint is not None:
            bar.update(task, description="grafting")
            report = graft(checkpoint, model, strict=strict,
                           progress=lambda done, total: bar.update(task, completed=done,
                                                                   total=total))
        if report is None or report.ok:
            bar.update(task, description="exporting and checking", completed=0, total=None)
            dynamic = {"input0": {0: "batch"}} if dynamic_batch else None
            exported = export_onnx(model, (torch.randn(shape),), out, opset=opset,
                                   dynamic_axes=dynamic, check=not no_check,
                                   overwrite=overwrite)
    if report is not None and not report.ok:
        if as_json:
            print_json(console, {"graft": report.to_dict(), "export": None})
        else:
            print_report(console, report)
            console.print("[red]not exported: the graft left keys missing[/red]")
        return 1
    if as_json:
        print_json(console, {"graft": report.to_dict() if report else None,
                             "export": exported.to_dict()})
        return 0
    if report is not None:
        print_report(console, report)
    diff = "" if exported.max_abs_diff is None else \
        f"; onnxruntime vs PyTorch: max |diff| = {exported.max_abs_diff:.3g}"
    console.print(f"exported {out} (opset {opset}){diff}")
    return 0
