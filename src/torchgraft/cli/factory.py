"""Building the target model from ``MODULE:FACTORY`` on the command line."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
        with _importing(spec):
            loader.loader.exec_module(module)
        return module
    if "" not in sys.path:
        sys.path.insert(0, "")
    with _importing(spec):
        return importlib.import_module(spec)


@contextmanager
def _importing(spec: str) -> Iterator[None]:
    """A model module that cannot be imported is the user's input: a message, not a trace."""
    try:
        yield
    except SyntaxError as exc:
        raise TorchgraftError(f"the model file has a syntax error at line {exc.lineno}: "
                              f"{exc.msg}", path=exc.filename or spec) from None
    except ImportError as exc:
        raise TorchgraftError(f"cannot import module '{spec}': {exc}") from None
    except Exception as exc:  # the user's module raised while importing
        raise TorchgraftError(f"importing '{spec}' raised {type(exc).__name__}: {exc} (run it "
                              "with python to see where)") from exc


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
    try:
        model = factory(**kwargs)
    except TypeError as exc:  # an argument the factory does not take, or lacks
        raise TorchgraftError(f"--model {spec} with --model-kwargs {kwargs_json or '{}'}: "
                              f"{exc}") from exc
    if not isinstance(model, nn.Module):
        raise TorchgraftError(f"{spec} returned a {type(model).__name__}, not an nn.Module")
    return model
