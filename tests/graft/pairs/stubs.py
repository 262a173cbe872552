"""Stand-ins for packages the real code bases import but never use in a forward pass.

The torchvision wheel does not import here (it is built against another torch), numba has no
wheel for this numpy, torchtune refuses to import without torchao, torchaudio has no wheel for
this torch, and lightning (a trainer) is not installed. timm, open_clip, whisper, torchtune,
encodec and litgpt import them at module level (transforms, datasets, a FrozenBatchNorm2d class,
``numba.jit``, NF4 tensors, audio file loading, Fabric's lazy loader) for features these tests
never call. A stand-in answers any
attribute with an inert class, so the import succeeds; a test that reached one would fail
loudly when it tried to use it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

STUBBED = ("torchvision", "numba", "torchao", "torchaudio", "lightning")


class _InertType(type):
    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"  # enum-like members (InterpolationMode.NEAREST)


class _Inert(metaclass=_InertType):
    """Any attribute of a stand-in module: a class that can be subclassed or used as a decorator."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # numba.jit(f) and @numba.jit(...)(f) leave f as it is
        return self


def _decorator(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda function: function


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("jit", "njit", "vectorize", "guvectorize", "cfunc"):
            return _decorator
        value = type(name, (_Inert,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Sequence[str]) -> None:
        self.roots = tuple(roots)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__version__ = "0.0+stub"  # type: ignore[attr-defined]


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:
        sys.modules.pop(name, None)
        return False
    return True


def install(check: Callable[[str], bool] = _importable) -> list[str]:
    """Put stand-ins in place of the packages of :data:`STUBBED` that do not import.

    Returns:
        The packages stubbed.
    """
    return stand_in(*STUBBED, check=check)


def stand_in(*names: str, check: Callable[[str], bool] = _importable) -> list[str]:
    """Put stand-ins in place of the packages named that do not import (a code base's config
    loader or remote-file client that building and running its model never calls).

    Returns:
        The packages stubbed.
    """
    missing = [name for name in names if (name in sys.modules and isinstance(
        sys.modules[name], _StubModule)) or not check(name)]
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
    return missing


def bare_package(name: str) -> None:
    """Make ``name`` importable without running its ``__init__`` (torchtune's imports its
    datasets and recipes, which need packages a model does not)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return
    module = types.ModuleType(name)
    module.__path__ = list(spec.submodule_search_locations)
    module.__spec__ = spec
    sys.modules[name] = module
