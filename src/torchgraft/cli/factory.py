"""Building the target model from ``MODULE:FACTORY`` on the command line.

The spelling of a spec (and that a ``.py`` file it names exists) is checked without torch,
while the command line is parsed; torch comes with the model's own module.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TorchgraftError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["build_model", "parse_spec"]


def _is_file(module: str) -> bool:
    return module.endswith(".py") or "/" in module


def parse_spec(spec: str, *, option: str = "--model") -> tuple[str, str]:
    """Split ``MODULE:FACTORY``, checking that a ``.py`` file it names exists.

    Args:
        spec: ``package.module:factory`` or ``path/to/file.py:factory``.
        option: The flag that gave it, for the message.

    Returns:
        The module (a name or a path) and the factory's name.

    Raises:
        TorchgraftError: If it is not spelled so, or names a file that is not there.
    """
    module_name, _, factory_name = spec.rpartition(":")
    if not module_name or not factory_name:
        raise TorchgraftError(f"{option} {spec!r}: expected MODULE:FACTORY, e.g. "
                              "mymodels:resnet18 or path/to/models.py:resnet18")
    if _is_file(module_name) and not Path(module_name).is_file():
        raise TorchgraftError(f"{option} {module_name}: model file not found")
    return module_name, factory_name


def _module(spec: str) -> Any:
    if _is_file(spec):
        path = Path(spec)
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


def build_model(spec: str, kwargs_json: str | None, *, option: str = "--model") -> nn.Module:
    """Import ``MODULE:FACTORY`` (a module name or a ``.py`` path) and call it.

    Args:
        spec: ``package.module:factory`` or ``path/to/file.py:factory``; the factory is a class
            or a function returning an ``nn.Module``.
        kwargs_json: Keyword arguments for the factory, as a JSON object.
        option: The flag that gave the spec, for messages.

    Returns:
        The model.

    Raises:
        TorchgraftError: If the spec, the JSON or the factory is wrong.
    """
    from torch import nn

    module_name, factory_name = parse_spec(spec, option=option)
    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except ValueError as exc:
        raise TorchgraftError(f"{option}-kwargs is not valid JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise TorchgraftError(f"{option}-kwargs must be a JSON object")
    factory = getattr(_module(module_name), factory_name, None)
    if not callable(factory):
        raise TorchgraftError(f"'{module_name}' has no callable '{factory_name}'")
    try:
        model = factory(**kwargs)
    except TypeError as exc:  # an argument the factory does not take, or lacks
        raise TorchgraftError(f"{option} {spec} with {option}-kwargs {kwargs_json or '{}'}: "
                              f"{exc}") from exc
    if not isinstance(model, nn.Module):
        raise TorchgraftError(f"{spec} returned a {type(model).__name__}, not an nn.Module")
    return model
