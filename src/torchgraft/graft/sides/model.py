"""Both sides of a graft, described by metadata: tensor names, shapes, module kinds, order."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError
from ..tensors import Side, TensorInfo, owner
from .heads import head_counts_of
from .inputs import bind, by_role, from_modules

__all__ = ["MODULE_KINDS", "call_order", "module_side", "module_tensors", "order_of_use",
           "ordered_by", "quantized_modules", "run_model", "state_tensors", "tied_keys", "unwrap"]

_log = logging.getLogger(__name__)

# Module class names to the kind used for layouts and structural matching.
MODULE_KINDS = {
    "Linear": "linear", "LazyLinear": "linear", "NonDynamicallyQuantizableLinear": "linear",
    "Conv1d": "conv", "Conv2d": "conv", "Conv3d": "conv",
    "ConvTranspose1d": "conv_transpose", "ConvTranspose2d": "conv_transpose",
    "ConvTranspose3d": "conv_transpose",
    "BatchNorm1d": "norm", "BatchNorm2d": "norm", "BatchNorm3d": "norm", "SyncBatchNorm": "norm",
    "LayerNorm": "norm", "GroupNorm": "norm", "RMSNorm": "norm", "InstanceNorm2d": "norm",
    "Embedding": "embedding",
    "Conv1D": "gpt2_conv1d",  # transformers.pytorch_utils.Conv1D: a Linear stored [in, out]
}


def unwrap(model: nn.Module) -> nn.Module:
    """Strip DataParallel, DistributedDataParallel and torch.compile wrappers, nested too.

    Args:
        model: A module, possibly wrapped.

    Returns:
        The innermost module.
    """
    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):
            model = inner
        else:
            return model


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """A module's state-dict tensors (``keep_vars``), named as a checkpoint of it names them.

    Entries that are not tensors (``_extra_state`` objects, a quantized module's dtype) are
    left out; a quantized module's packed ``(weight, bias)`` tuple gives ``....0`` and
    ``....1``, as torchgraft reads it from a file.

    Args:
        model: The module.

    Returns:
        Key to tensor, in state_dict order.
    """
    out: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, tuple):
            out.update((f"{name}.{i}", v) for i, v in enumerate(value)
                       if isinstance(v, torch.Tensor))
    return out


def quantized_modules(model: nn.Module,
                      tensors: dict[str, torch.Tensor] | None = None) -> dict[str, str]:
    """The modules whose weights are quantized: path to class name.

    Args:
        model: The module.
        tensors: Its :func:`state_tensors`, if already known.

    Returns:
        Module path to the class's qualified name.
    """
    found = {}
    for key, tensor in (state_tensors(model) if tensors is None else tensors).items():
        if tensor.is_quantized:
            path = key.partition("._packed_params.")[0] if "._packed_params." in key \
                else key.rpartition(".")[0]
            cls = type(model.get_submodule(path))
            found[path] = f"{cls.__module__}.{cls.__qualname__}"
    return found


def module_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, TensorInfo]:
    """Describe a module's state-dict tensors with their module kinds.

    Args:
        model: An unwrapped module.
        tensors: Its :func:`state_tensors`.

    Returns:
        Key to info, in state_dict order.
    """
    return _described(model, tensors)[0]


def _class_name(cls: type[nn.Module]) -> str:
    """The class's name, seeing through FSDP2's subclass (``FSDPLinear``: ``Linear``)."""
    name = _CLASS_NAMES.get(cls)
    if name is None:
        name = _CLASS_NAMES[cls] = next(
            (base.__name__ for base in cls.__mro__
             if not base.__module__.startswith("torch.distributed.fsdp")), cls.__name__)
    return name


_CLASS_NAMES: dict[type[nn.Module], str] = {}


def _attribute(module: nn.Module, name: str) -> Any:
    """An attribute set on the module or its class, else ``None``.

    ``getattr(module, name, None)`` costs an ``AttributeError`` raised by ``nn.Module``'s
    ``__getattr__`` for each module without it: seconds on models of 100k modules.
    """
    if name in module.__dict__:
        return module.__dict__[name]
    return getattr(module, name) if hasattr(type(module), name) else None


#: Module class to its kind and whether it has ``head_dim`` or ``head_size`` (an attribute, a
#: property): asked once per class.
_CLASS_FACTS: dict[type, tuple[str | None, bool]] = {}


def _class_facts(cls: type[nn.Module]) -> tuple[str | None, bool]:
    """A module class's kind (:data:`MODULE_KINDS`), and whether it says its heads."""
    facts = _CLASS_FACTS.get(cls)
    if facts is None:
        facts = _CLASS_FACTS[cls] = (MODULE_KINDS.get(_class_name(cls)),
                                     hasattr(cls, "head_dim") or hasattr(cls, "head_size"))
    return facts


@dataclass
class _Heads:
    """What attention modules say of their heads: sizes and counts, by module path."""

    dims: dict[str, int] = field(default_factory=dict)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, path: str, module: nn.Module) -> None:
        """What an attention module (one that has ``head_dim`` or ``head_size``) says."""
        head_dim = _attribute(module, "head_dim")
        if head_dim is None:
            head_dim = _attribute(module, "head_size")  # GPT-NeoX's attention
        if isinstance(head_dim, int):
            self.dims[path] = head_dim
            counts = head_counts_of(module)  # attention modules only: few
            if counts is not None:
                self.counts[path] = counts


def _described(model: nn.Module, tensors: dict[str, torch.Tensor],
               modules: Sequence[tuple[str, nn.Module]] | None = None,
               ) -> tuple[dict[str, TensorInfo], _Heads, frozenset[str]]:
    """Infos with module kinds, attention heads and persistent buffers, from one walk.

    A tight loop: a model of 100k tensors has tens of thousands of modules, most of them
    without buffers, a kind or heads.
    """
    kinds: dict[str, str] = {}
    heads = _Heads()
    buffers: set[str] = set()
    for path, module in model.named_modules() if modules is None else modules:
        prefix = f"{path}." if path else ""
        own = module._buffers
        if own:
            transient = module._non_persistent_buffers_set
            buffers.update(prefix + name for name in own if name not in transient)
        kind, heads_class = _class_facts(type(module))
        if kind is not None:
            for name in module._parameters:
                kinds[prefix + name] = kind
            for name in own:
                kinds[prefix + name] = kind
        # most modules say nothing of heads: only those that do are asked
        if heads_class or "head_dim" in module.__dict__ or "head_size" in module.__dict__:
            heads.add(path, module)
    get = kinds.get
    return {name: TensorInfo(name, tuple(t.shape), t.dtype, get(name))
            for name, t in tensors.items()}, heads, frozenset(buffers & tensors.keys())


def run_model(model: nn.Module, example_inputs: Any) -> Any:
    """Run a user's model on example inputs without gradients.

    A tuple, a lone tensor, or a mapping of keyword arguments, bound to its ``forward`` by
    argument name (:func:`~torchgraft.graft.sides.inputs.bind`).

    In the mode it is in, its buffers put back after (a norm's running statistics): running
    it never changes it.

    Args:
        model: The model.
        example_inputs: Its inputs.

    Returns:
        What the model returned.

    Raises:
        TorchgraftError: If the model fails on these inputs.
    """
    if isinstance(example_inputs, Mapping):  # by argument name, as its forward calls them
        args, kwargs = bind(model, by_role(example_inputs))
    else:
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        kwargs = {}
    # a module in training mode updates its running statistics: put them back after
    kept = [(b, b.clone()) for b in model.buffers() if not b.is_meta]
    try:
        with torch.no_grad():
            return model(*args, **kwargs)
    except Exception as exc:
        raise TorchgraftError(f"{type(model).__name__} failed on the example inputs: "
                              f"{type(exc).__name__}: {exc}") from exc
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)


def call_order(model: nn.Module, example_inputs: Any, names: Sequence[str], *,
               run: Callable[[nn.Module, Any], Any] = run_model) -> list[str]:
    """Order state-dict keys by when their module is first called on ``example_inputs``.

    Args:
        model: An unwrapped module.
        example_inputs: Its inputs (a tuple, a lone tensor, or keyword arguments by name).
        names: The module's state-dict keys, in definition order.
        run: What runs the model on them (:func:`run_model`).

    Returns:
        The keys, modules called earlier first; keys of modules never called keep their
        definition order at the end.
    """
    paths = {module: path for path, module in model.named_modules(remove_duplicate=False)}
    first_call: dict[str, int] = {}

    def hook(module: nn.Module, _args: Any) -> None:
        first_call.setdefault(paths.get(module, ""), len(first_call))

    handles = [m.register_forward_pre_hook(hook) for m in model.modules()]
    try:
        run(model, example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    end = len(first_call)
    position = {name: (first_call.get(owner(name), end), i)
                for i, name in enumerate(names)}
    return sorted(names, key=position.__getitem__)


def order_of_use(model: nn.Module, names: Sequence[str]) -> list[str] | None:
    """A model's keys in order of use, from one forward on the meta device: no value is read.

    The model runs on inputs generated from its first modules
    (:func:`~torchgraft.graft.sides.inputs.from_modules`) with every parameter and buffer
    stood in for by a meta tensor of its shape and its own forward hooks set aside; what its
    forward sets on its modules (a cache of rotary angles made on meta) is put back after, so
    it is left as it was. A forward that cannot run on
    meta (one that reads a value) says nothing, and a sharded model is not run.

    Args:
        model: An unwrapped module.
        names: Its state-dict keys, in definition order.

    Returns:
        The keys, modules called earlier first (:func:`call_order`); None where no generated
        input runs.
    """
    kept = [(m, _attributes(m)) for m in model.modules()]
    if _sharded(model, (t for _, (_, held) in kept for key in ("_parameters", "_buffers")
                        for t in held.get(key, {}).values())):
        return None
    try:
        _stand_in_meta(kept)
        for inputs in from_modules(model, meta=True):
            try:
                return call_order(model, inputs, names, run=_on_meta)
            except Exception as exc:  # any failure on meta says nothing of the order
                _log.debug("order of use on %s: %s", list(inputs), exc)
    except Exception as exc:  # a tensor subclass with no meta twin (a quantized weight)
        _log.debug("order of use: %s", exc)
    finally:
        for module, (attributes, held) in kept:
            module.__dict__.clear()
            module.__dict__.update(attributes)
            for key, entries in held.items():  # the very dicts others hold, as they were
                attributes[key].clear()
                attributes[key].update(entries)
    return None


def _stand_in_meta(kept: list[tuple[nn.Module, tuple[dict[str, Any], dict[str, Any]]]],
                   ) -> None:
    """Stand a meta tensor of its shape in for every parameter and buffer, hooks set aside.

    A tensor two modules share (tied weights) gets one stand-in; the model's own forward
    hooks are not run on meta. Both are put back by :func:`order_of_use`.
    """
    stand_ins: dict[int, torch.Tensor] = {}

    def stand_in(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in stand_ins:
            empty = torch.empty_like(tensor, device="meta")
            stand_ins[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) \
                if isinstance(tensor, nn.Parameter) else empty
        return stand_ins[id(tensor)]

    for module, _ in kept:
        for key in _HOOKS:
            if key in module.__dict__:
                module.__dict__[key] = type(module.__dict__[key])()
        for key in ("_parameters", "_buffers"):
            entries: dict[str, Any] = module.__dict__.get(key) or {}
            for name, tensor in entries.items():
                if tensor is not None:
                    entries[name] = stand_in(tensor)


def ordered_by(side: Side, model: nn.Module) -> None:
    """Give a file's keys the order of use of its own code base's model, when first asked.

    A file stored sorted says nothing of its modules' order, and a file's order of definition
    is not its order of use; the model of its code base (a ``source_model=``, or the class its
    ``config.json`` names) says it, run on meta (:func:`order_of_use`) only if the order is
    asked (a graft whose keys all pair by name never asks). Only where every key of the file
    is the model's: a file of another layout keeps its own order.

    Args:
        side: The file's side, changed in place.
        model: A module of the file's code base.
    """
    names = list(state_tensors(model))
    if side.tensors and side.tensors.keys() <= set(names):
        side.given_order, side.given_ordered = [], True
        side.order_of_use = partial(_of_file, model, names, frozenset(side.tensors))


def _of_file(model: nn.Module, names: list[str], keys: frozenset[str]) -> list[str] | None:
    found = order_of_use(model, names)
    return None if found is None else [name for name in found if name in keys]


def _of_module(model: nn.Module, names: list[str]) -> list[str]:
    return order_of_use(model, names) or names


def _sharded(model: nn.Module, tensors: Iterable[torch.Tensor]) -> bool:
    """Whether a model is sharded across processes (DTensor tensors, FSDP).

    Its forward gathers from other ranks, which a run on one rank's meta tensors must not
    start.
    """
    return any(type(t).__name__ == "DTensor" for t in tensors) or any(
        type(m).__name__.startswith(("FSDP", "FullyShardedDataParallel"))
        for m in model.modules())


#: A module's forward hooks, set aside while it runs on meta.
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
          "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
#: A module's dicts others may hold (a walk of its tensors): put back as the same objects.
_HELD = ("_parameters", "_buffers", "_modules")


def _attributes(module: nn.Module) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A module's attributes, and the entries of its dicts of parameters, buffers, children."""
    return dict(module.__dict__), {key: dict(module.__dict__[key]) for key in _HELD
                                   if isinstance(module.__dict__.get(key), dict)}


def _on_meta(model: nn.Module, inputs: Any) -> Any:
    """Run a model whose tensors stand on meta on meta inputs."""
    args, kwargs = bind(model, by_role(inputs))
    with torch.no_grad():
        return model(*args, **kwargs)


def tied_keys(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Map each key holding the very same tensor object as an earlier key to that key.

    Args:
        tensors: A ``state_dict(keep_vars=True)``.

    Returns:
        Later key to first key, for tied tensors only.
    """
    first: dict[int, str] = {}
    ties: dict[str, str] = {}
    for name, tensor in tensors.items():
        owner = first.setdefault(id(tensor), name)
        if owner != name:
            ties[name] = owner
    return ties


def module_side(model: nn.Module, example_inputs: Any = None, *,
                tensors: dict[str, torch.Tensor] | None = None,
                modules: Sequence[tuple[str, nn.Module]] | None = None) -> Side:
    """Describe an unwrapped module as a graft side.

    Args:
        model: The module.
        example_inputs: If given, tensors are ordered by use on these inputs; else by use on
            generated inputs on meta, when first asked (:func:`order_of_use`), or by
            definition where the model cannot run so.
        tensors: Its :func:`state_tensors`, if already known.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        Its tensors with their module kinds, in order of use, its ties and head sizes.
    """
    tensors = state_tensors(model) if tensors is None else tensors
    infos, heads, buffers = _described(model, tensors, modules)
    names = list(infos)
    given = example_inputs is not None
    return Side(infos, call_order(model, example_inputs, names) if given else [],
                ties=tied_keys(tensors), head_dims=heads.dims, head_counts=heads.counts,
                buffers=buffers, order_of_use=None if given else partial(_of_module, model, names))
