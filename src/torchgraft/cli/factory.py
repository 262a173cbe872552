"""Building the target model from ``MODULE:FACTORY`` on the command line."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import TorchgraftError

__all__ = ["build_model"]


def _module(spec: str) -> Any:
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise TorchgraftError("model file not found", path=path)
        loader = importlib.util.spec_from_file_location(path.stem, path)
        if loader is None or loader.loader is None:
            raise TorchgraftError("cannot import this file", path=path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[path.stem] = module
        loader.loader.exec_module(module)
        return module
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        return importlib.import_module(spec)
    except ImportError as exc:
        raise TorchgraftError(f"cannot import module '{spec}': {exc}") from None


def build_model(spec: str, kwargs_json: str | None) -> nn.Module:
    """Import ``MODULE:FACTORY`` (a module name or a ``.py`` path) and call it.

    Args:
        spec: ``package.module:factory`` or ``path/to/file.py:factory``; the factory is a class
            or a function returning an ``nn.Module``.
        kwargs_json: Keyword arguments for the factory, as a JSON object.

    Returns:
        The model.

    Raises:
        TorchgraftError: If the spec, the JSON or the factory is wrong.
    """
    module_name, _, factory_name = spec.rpartition(":")
    if not module_name or not factory_name:
        raise TorchgraftError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. mymodels:resnet18")
    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except ValueError as exc:
        raise TorchgraftError(f"--model-kwargs is not valid JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise TorchgraftError("--model-kwargs must be a JSON object")
    factory = getattr(_module(module_name), factory_name, None)
    if not callable(factory):
        raise TorchgraftError(f"'{module_name}' has no callable '{factory_name}'")
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise TorchgraftError(f"{spec} returned a {type(model).__name__}, not an nn.Module")
    return model
