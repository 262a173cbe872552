"""``tg.export_onnx``: export, check the graph, and compare onnxruntime with PyTorch."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .atomic import atomic_path
from .errors import MissingDependencyError, TorchgraftError
from .graft.search.activations import first_tensor
from .graft.sides.model import run_model, unwrap

__all__ = ["ExportReport", "export_onnx"]

MIN_OPSET, MAX_OPSET = 9, 20


@dataclass
class ExportReport:
    """What was exported.

    Attributes:
        path: The ONNX file.
        opset: The opset version.
        input_names: The graph's input names.
        output_names: The graph's output names.
        max_abs_diff: With ``check=True``: the largest difference between onnxruntime's first
            output and PyTorch's.
    """

    path: str
    opset: int
    input_names: list[str]
    output_names: list[str]
    max_abs_diff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data."""
        return dict(vars(self))

    def to_json(self, **kwargs: Any) -> str:
        """Return the report as JSON text."""
        return json.dumps(self.to_dict(), **kwargs)


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise MissingDependencyError(module, extra="onnx", feature="ONNX export") from None


def export_onnx(model: nn.Module, example_inputs: Any, path: str | os.PathLike[str], *,
                opset: int = 17, input_names: Sequence[str] | None = None,
                output_names: Sequence[str] | None = None,
                dynamic_axes: Mapping[str, Any] | None = None, check: bool = True,
                overwrite: bool = False) -> ExportReport:
    """Export a model to ONNX (in eval mode), check it, and compare onnxruntime with PyTorch.

    DataParallel, DDP and torch.compile wrappers are stripped first. The TorchScript-based
    exporter is used, which supports the old opsets TensorRT 5-era tools need (9, as older
    deployment guides use) up to 20.

    Args:
        model: The model.
        example_inputs: Positional inputs (a tuple, or a lone tensor).
        path: The ``.onnx`` file to write (atomically).
        opset: The ONNX opset version, 9 to 20.
        input_names: Names of the graph inputs (default ``input0``, ``input1``...).
        output_names: Names of the graph outputs (default ``output0``...).
        dynamic_axes: As torch.onnx.export takes it, e.g. ``{"input0": {0: "batch"}}``.
        check: Run the graph in onnxruntime and report ``max_abs_diff``.
        overwrite: Replace an existing file.

    Returns:
        The report.

    Raises:
        MissingDependencyError: Without onnx (or onnxruntime with ``check=True``).
        TorchgraftError: If the opset is out of range or the export fails.
    """
    onnx = _require("onnx")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise TorchgraftError(f"opset={opset}: torchgraft exports opsets {MIN_OPSET} to "
                              f"{MAX_OPSET}")
    module = unwrap(model)
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    inputs = list(input_names or [f"input{i}" for i in range(len(args))])
    training = module.training
    module.eval()
    try:
        expected = first_tensor(run_model(module, args))
        with atomic_path(path, overwrite=overwrite) as temporary, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(module, args, str(temporary), opset_version=opset,
                                  input_names=inputs, output_names=output_names,
                                  dynamic_axes=dict(dynamic_axes) if dynamic_axes else None,
                                  dynamo=False)
            except Exception as exc:
                raise TorchgraftError(f"torch.onnx.export failed at opset {opset}: {exc}",
                                      path=Path(path)) from exc
            graph = onnx.load(str(temporary))
            onnx.checker.check_model(graph)
    finally:
        module.train(training)
    report = ExportReport(str(Path(path)), opset, inputs, [o.name for o in graph.graph.output])
    if check:
        ort = _require("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: a.detach().cpu().numpy() for i, a in zip(session.get_inputs(), args,
                                                                   strict=False)}
        actual = session.run(None, feeds)[0]
        reference = expected.detach().cpu().numpy()
        report.max_abs_diff = float(np.abs(actual.astype(np.float64) - reference).max()) \
            if reference.size else 0.0
    return report
