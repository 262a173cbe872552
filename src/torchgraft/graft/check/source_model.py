"""The source's own model, to verify a graft from a file by comparing outputs.

A folder with a ``config.json`` naming a transformers class (``architectures``) describes its
model fully: when transformers is importable, the class is looked up among transformers' own
exports (never imported because a file names it, never remote code), built with its
parameters on the meta device (buffers it computes, such as rotary frequencies, stay real), and
filled from the file by torchgraft, by name: transformers' own renames of older checkpoint
names (its conversion mapping: ViT files keep ``attention.attention.query``, the v5 module has
``attention.q_proj``) are the fill's rules. Any other source can pass ``source_model=``: a module
of the source's code base, or a callable that builds one; it is filled from the file the same
way.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from ...errors import TorchgraftError
from ...renames import Rule
from ..sides.config import read_config
from .inputs import Inputs, from_config

__all__ = ["MAX_AUTO_BYTES", "SourceModel", "SourceModelLike", "empty_parameters",
           "from_folder", "resolve", "transformers_renames"]

SourceModelLike = nn.Module | Callable[[], nn.Module]

#: Verification from a folder fills the source model too (as much memory again): automatic
#: only up to this many bytes of weights; ``verify=True`` asks for it whatever the size.
MAX_AUTO_BYTES = 2 << 30


def _no_renames(_model: nn.Module) -> list[Rule]:
    return []


@dataclass
class SourceModel:
    """A model of the source's code base, and the inputs its config describes.

    Attributes:
        build: Builds the module (parameters on the meta device where it can).
        inputs: Inputs generated from the config (empty when there is none).
        origin: Where it comes from, for messages.
        renames: The rules that fill the built module from the checkpoint by name (its code
            base's own renames of older names).
    """

    build: Callable[[], nn.Module]
    inputs: Inputs = field(default_factory=Inputs)
    origin: str = "source_model="
    renames: Callable[[nn.Module], list[Rule]] = _no_renames


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers real.

    Parameters take no memory and no initialisation time; buffers that a module computes
    (rotary frequencies, position ids) keep the values its constructor gives them, as a
    checkpoint does not hold them.
    """
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"),
                                                    requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _transformers_class(data: dict[str, Any]) -> type[nn.Module] | None:
    """The transformers class a config names, if transformers has it (never remote code)."""
    names = data.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        return None
    if data.get("auto_map") or importlib.util.find_spec("transformers") is None:
        return None  # remote code is never run; without transformers there is nothing to build
    import transformers

    cls = getattr(transformers, names[0], None)
    base = getattr(transformers, "PreTrainedModel", None)
    if not isinstance(cls, type) or base is None or not issubclass(cls, base):
        return None
    return cls


def from_folder(path: str | os.PathLike[str]) -> SourceModel | None:
    """The transformers model a checkpoint folder's ``config.json`` describes.

    Args:
        path: A checkpoint folder, or a file in one.

    Returns:
        The source model and generated inputs; ``None`` when the folder has no config of a
        transformers class, or transformers is not installed.

    Raises:
        TorchgraftError: If config.json is unreadable, or transformers rejects it.
    """
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    data = read_config(folder)
    cls = _transformers_class(data) if data is not None else None
    if cls is None or data is None:
        return None
    try:
        config = cls.config_class.from_dict(dict(data))  # type: ignore[attr-defined]
    except Exception as exc:
        raise TorchgraftError(f"transformers cannot read config.json for {cls.__name__}: "
                              f"{type(exc).__name__}: {exc}", path=folder) from None

    def build() -> nn.Module:
        with empty_parameters():
            model: nn.Module = cls(config)
        return model.eval()

    return SourceModel(build, from_config(data), f"{folder / 'config.json'} ({cls.__name__})",
                       transformers_renames)


def transformers_renames(model: nn.Module) -> list[Rule]:
    """The renames transformers itself makes from a checkpoint's keys to a model's, as rules.

    Its conversion mapping's plain renames (one pattern to one name, for the whole model);
    operations that fuse or split tensors are left to torchgraft's own layouts.

    Args:
        model: A transformers model.

    Returns:
        The rules; none when transformers has none for the model, or no conversion mapping.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        transforms = get_model_conversion_mapping(model)  # type: ignore[arg-type]
    except Exception:  # an older transformers, or a model it has no mapping for
        return []
    rules = []
    for transform in transforms:
        if type(transform) is not WeightRenaming or transform.scope_prefix or \
                len(transform.target_patterns) != 1:
            continue
        for pattern in transform.source_patterns:
            with contextlib.suppress(TorchgraftError):  # a pattern Python's re does not take
                rules.append(Rule(pattern, transform.target_patterns[0]))
    return rules


def resolve(source_model: SourceModelLike) -> SourceModel:
    """A ``source_model=`` argument as a :class:`SourceModel` (no inputs: it has no config).

    Args:
        source_model: A module of the source's code base, or a callable that builds one.

    Returns:
        The source model.

    Raises:
        TorchgraftError: If it is neither.
    """
    if isinstance(source_model, nn.Module):
        module = source_model
        return SourceModel(lambda: module, origin=f"source_model={type(module).__name__}")
    if callable(source_model):
        def build() -> nn.Module:
            built = source_model()
            if not isinstance(built, nn.Module):
                raise TorchgraftError(f"source_model= returned a {type(built).__name__}, not an "
                                      "nn.Module")
            return built
        return SourceModel(build, origin="source_model=")
    raise TorchgraftError(f"source_model= takes an nn.Module or a callable that builds one, "
                          f"not a {type(source_model).__name__}")

