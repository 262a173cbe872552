"""The source's own model, to verify a graft from a file by comparing outputs.

A folder with a ``config.json`` naming a transformers class (``architectures``) or a diffusers
one (``_class_name``) describes its model fully: when that library is importable, the class is
looked up among the library's own exports (never imported because a file names it, never
remote code), built with its parameters on the meta device (buffers it computes, such as
rotary frequencies, stay real), and filled from the file by torchgraft, by name:
transformers' own renames of older checkpoint names (its conversion mapping: ViT files keep
``attention.attention.query``, the v5 module has ``attention.q_proj``) are the fill's rules.
Any other source can pass ``source_model=``: a module of the source's code base, or a callable
that builds one; it is filled from the file the same way.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError, shown
from ...renames import Rule
from ..sides.build import empty_parameters
from ..sides.config import check_sizes, read_config
from ..sides.inputs import Inputs, from_config
from ..sides.model import state_tensors, unwrap

__all__ = ["MAX_AUTO_BYTES", "SourceModel", "SourceModelLike", "from_folder", "meta_copy",
           "resolve", "source_code", "transformers_renames", "unbuilt"]

logger = logging.getLogger("torchgraft")

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
        same_as: Whether a model is the very model this one would be (its class, its config,
            its modules' classes, no hooks or ``forward`` of their own): filled by the same
            names, comparing the two would tell nothing.
    """

    build: Callable[[], nn.Module]
    inputs: Inputs = field(default_factory=Inputs)
    origin: str = "source_model="
    renames: Callable[[nn.Module], list[Rule]] = _no_renames
    same_as: Callable[[nn.Module], bool] = lambda _model: False


#: Config entries that say where a config came from, not what the model computes.
_PROVENANCE = frozenset({"architectures", "transformers_version", "_name_or_path",
                         "name_or_path", "_commit_hash", "torch_dtype", "dtype",
                         "_attn_implementation_autoset", "_attn_implementation"})


def _modules(model: nn.Module) -> list[tuple[str, type[nn.Module]]] | None:
    """Each module's path and class.

    ``None`` when any module runs hooks or a ``forward`` set on it: not a model its class
    alone describes.
    """
    found = []
    for path, module in model.named_modules():
        if "forward" in module.__dict__ or module._forward_hooks or module._forward_pre_hooks:
            return None
        found.append((path, type(module)))
    return found


def _what_computes(config: Any) -> dict[str, Any] | None:
    """A transformers config's entries, less those of provenance; ``None`` if it has none."""
    to_dict = getattr(config, "to_dict", None)
    data = to_dict() if callable(to_dict) else None
    return {k: v for k, v in data.items() if k not in _PROVENANCE} \
        if isinstance(data, dict) else None


@dataclass(frozen=True)
class _Library:
    """A library whose configs name their model's class: where, and what its models derive."""

    name: str
    field: str  # the config's entry naming the class
    base: str  # the class every model of it derives from


#: The libraries a ``config.json`` may name a class of (transformers: ``architectures``, a
#: list; diffusers: ``_class_name``).
_LIBRARIES = (_Library("transformers", "architectures", "PreTrainedModel"),
              _Library("diffusers", "_class_name", "ModelMixin"))


def _model_class(data: dict[str, Any]) -> tuple[type[nn.Module], _Library] | str:
    """The class a config names, if its library has it; else why none is built.

    Remote code (``auto_map``) is never run, and no module is imported because a config
    names it: the class is looked up among its library's own exports.
    """
    if data.get("auto_map"):
        return (f"it asks for remote code ('auto_map': {shown(data['auto_map'], 80)}), which "
                "torchgraft never runs")
    for library in _LIBRARIES:
        named = data.get(library.field)
        name = named[0] if isinstance(named, list) and named else named
        if not isinstance(name, str):
            continue
        if importlib.util.find_spec(library.name) is None:
            return f"it names {shown(name, 80)}, and {library.name} is not installed"
        module = importlib.import_module(library.name)
        cls = getattr(module, name, None)
        base = getattr(module, library.base, None)
        if not isinstance(cls, type) or base is None or not issubclass(cls, base):
            return f"it names {shown(name, 80)}, which is no model class of {library.name}"
        return cls, library
    return ("it names no transformers class ('architectures') nor diffusers class "
            "('_class_name'): another library's config")


def unbuilt(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """Why the ``config.json`` beside a checkpoint describes no model torchgraft builds.

    Args:
        path: A checkpoint folder, or a file in one.

    Returns:
        The config's path and the reason; ``None`` when there is no readable config, or it
        describes a model (:func:`from_folder` builds it).
    """
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    config = folder / "config.json"
    try:
        data = read_config(folder)
    except TorchgraftError:
        return None
    if data is None:
        return (config, "it is not a JSON object") if config.is_file() else None
    found = _model_class(data)
    return (config, found) if isinstance(found, str) else None


def from_folder(path: str | os.PathLike[str], *,
                shapes: Mapping[str, tuple[int, ...]]) -> SourceModel | None:
    """The transformers or diffusers model a checkpoint folder's ``config.json`` describes.

    Its sizes are checked against the checkpoint's (:func:`.check_sizes`) and the inputs it
    describes against their bound (:func:`.from_config`) before anything is built.

    Args:
        path: A checkpoint folder, or a file in one.
        shapes: The checkpoint's tensors' shapes, by key.

    Returns:
        The source model and generated inputs; ``None`` when the folder has no config of a
        class of those libraries, or the library is not installed.

    Raises:
        TorchgraftError: If config.json is unreadable, sizes a model past what the checkpoint
            holds or an input past its bound, or the library rejects it.
    """
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    data = read_config(folder)
    found = _model_class(data) if data is not None else None
    if found is None or isinstance(found, str) or data is None:
        return None
    cls, library = found
    check_sizes(data, shapes, path=folder / "config.json")
    inputs = from_config(data, path=folder / "config.json")
    origin = f"{folder / 'config.json'} ({cls.__name__})"
    if library.name == "diffusers":
        entries = {k: v for k, v in data.items() if not k.startswith("_")}
        return _described(cls, lambda: cls.from_config(entries),  # type: ignore[attr-defined]
                          lambda model: _diffusers_config(model, entries), inputs, origin,
                          _no_renames)
    try:
        config = cls.config_class.from_dict(dict(data))  # type: ignore[attr-defined]
    except Exception as exc:
        raise TorchgraftError(f"transformers cannot read config.json for {cls.__name__}: "
                              f"{type(exc).__name__}: {exc}", path=folder) from None
    described = _what_computes(config)

    def same_config(model: nn.Module) -> bool:
        return described is not None and \
            _what_computes(getattr(model, "config", None)) == described

    return _described(cls, lambda: cls(config), same_config, inputs, origin,
                      transformers_renames)


def _described(cls: type[nn.Module], make: Callable[[], nn.Module],
               same_config: Callable[[nn.Module], bool], inputs: Inputs, origin: str,
               renames: Callable[[nn.Module], list[Rule]]) -> SourceModel:
    """The model a config describes: built with its parameters on meta, in eval mode.

    A model is the very one it describes when its class and config (``same_config``) are, and
    its modules are those a twin built on meta has.

    Args:
        cls: The config's class.
        make: Builds the model of the config's class.
        same_config: Whether a model has the config's entries.
        inputs: The inputs the config describes.
        origin: Where it comes from, for messages.
        renames: Its library's renames of older names.
    """
    def build() -> nn.Module:
        with empty_parameters():
            model = make()
        return model.eval()

    def same_as(model: nn.Module) -> bool:
        if type(model) is not cls or not same_config(model):
            return False
        with torch.device("meta"):
            twin = make()
        return _modules(twin) == _modules(model)

    return SourceModel(build, inputs, origin, renames, same_as)


def _diffusers_config(model: nn.Module, entries: Mapping[str, Any]) -> bool:
    """Whether a diffusers model's config has these entries.

    Its own entries that start with ``_`` say where it is from, not what it computes.
    """
    config = getattr(model, "config", None)
    return isinstance(config, Mapping) and all(
        json.dumps(config.get(k), default=str) == json.dumps(v, default=str)
        for k, v in entries.items())


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


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with its state-dict tensors on the meta device, to be filled.

    The caller's own module is never filled. The copy costs no memory for its weights (the
    fill gives them storage); the tensors no state dict holds (non-persistent buffers its
    code computed) are copied as they are.

    Args:
        module: A module of the source's code base.

    Returns:
        The copy.

    Raises:
        TorchgraftError: If the module cannot be copied.
    """
    memo: dict[int, Any] = {}
    for tensor in state_tensors(module).values():
        if id(tensor) not in memo and isinstance(tensor, torch.Tensor):
            empty = torch.empty_like(tensor, device="meta")
            memo[id(tensor)] = (nn.Parameter(empty, requires_grad=tensor.requires_grad)
                                if isinstance(tensor, nn.Parameter) else empty)
    try:
        return copy.deepcopy(module, memo)
    except Exception as exc:
        raise TorchgraftError(f"source_model={type(module).__name__} could not be copied "
                              f"(it is never filled in place): {type(exc).__name__}: {exc}; "
                              "pass a callable that builds the module instead") from exc


def resolve(source_model: SourceModelLike) -> SourceModel:
    """A ``source_model=`` argument as a :class:`SourceModel` (no inputs: it has no config).

    A module is filled as a copy (:func:`meta_copy`), never in place.

    Args:
        source_model: A module of the source's code base, or a callable that builds one.

    Returns:
        The source model.

    Raises:
        TorchgraftError: If it is neither.
    """
    if isinstance(source_model, nn.Module):
        module = source_model
        return SourceModel(lambda: meta_copy(module),
                           origin=f"source_model={type(module).__name__}")
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



def source_code(source: object, module: nn.Module | None,
                source_model: SourceModelLike | None, *,
                shapes: Mapping[str, tuple[int, ...]]) -> nn.Module | None:
    """A module of the source's code base, where there is one: to read its norms and order.

    Its module; else a ``source_model=`` module (of the file's own code base, named as the
    file; a callable is called once more for this, on the meta device); else the model its
    folder's ``config.json`` describes, built on meta. Code that fails says none here
    (comparing outputs reports it); a bare file has none.

    Args:
        source: What was grafted (a path, a module, a state dict).
        module: The source as a module, if it is one.
        source_model: The ``source_model=`` argument.
        shapes: The checkpoint's tensors' shapes, by key (a folder's config is checked
            against them before its model is built).

    Returns:
        The module, unwrapped; None where there is none.
    """
    found: object = module if module is not None else source_model
    try:
        if found is None and isinstance(source, (str, os.PathLike)):
            described = from_folder(source, shapes=shapes)
            found = described.build() if described is not None else None
        elif found is not None and not isinstance(found, nn.Module) and callable(found):
            with torch.device("meta"):
                found = found()
    except Exception:  # the source's own code or config: verification names its error
        logger.debug("the source's model could not be built to read its norms", exc_info=True)
        return None
    return unwrap(found) if isinstance(found, nn.Module) else None
