"""Find the model weights inside what was saved, and keep the rest as plain data.

A checkpoint may be a bare state dict, a training checkpoint that nests it
(``{"epoch": 3, "state_dict": ..., "optimizer": ...}``), a whole pickled model, or a
Lightning checkpoint. The keys that hold weights are data (:data:`WEIGHT_KEYS`), tried in order.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import TorchgraftError
from .meta import TensorRef, dtype_name
from .safe_pickle import PickledObject

__all__ = ["MAX_PLAIN_DEPTH", "MAX_PLAIN_NODES", "WEIGHT_KEYS", "Selection", "all_tensors",
           "select_weights", "to_plain"]

# Keys under which training checkpoints keep model weights, most likely first. The EMA copies
# come last: they are used only when nothing else holds weights, and reported otherwise.
WEIGHT_KEYS = (
    "state_dict", "model_state_dict", "model", "net", "network", "module", "model_state",
    "params", "weights", "generator",
    "ema", "state_dict_ema", "model_ema", "ema_state_dict", "ema_model", "params_ema",
)
_MAX_DEPTH = 4


@dataclass
class Selection:
    """The weights found in a checkpoint, and everything else.

    Attributes:
        weights: Tensor name to lazy tensor, in stored order.
        key: Where the weights were found, e.g. ``"state_dict"``; ``""`` for the top level.
        model_class: The class of a pickled whole model the weights came from, if any.
        weight_sets: Every place holding weights, with its tensor count (e.g. the EMA copy).
        extras: Everything that is not the selected weights, as plain Python data.
    """

    weights: dict[str, TensorRef]
    key: str = ""
    model_class: str | None = None
    weight_sets: dict[str, int] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


def _is_module(obj: Any) -> bool:
    if not isinstance(obj, PickledObject):
        return False
    if _is_script_module(obj):
        return True
    attrs = obj.attributes()
    return isinstance(attrs.get("_parameters"), dict) and isinstance(attrs.get("_modules"), dict)


def _is_script_module(obj: Any) -> bool:
    """A TorchScript module (``torch.jit.save``): its attributes are its tensors and children."""
    return isinstance(obj, PickledObject) and obj.global_name.startswith("__torch__.")


def _module_weights(module: PickledObject, prefix: str, out: dict[str, TensorRef],
                    seen: set[int]) -> None:
    """Collect a pickled module's parameters and persistent buffers, named as state_dict does."""
    if id(module) in seen:
        return
    seen.add(id(module))
    attrs = module.attributes()
    if _is_script_module(module):
        for name, value in attrs.items():
            if isinstance(value, TensorRef):
                out[prefix + name] = value
            elif _is_script_module(value):
                _module_weights(value, f"{prefix}{name}.", out, seen)
        return
    for name, value in attrs["_parameters"].items():
        if isinstance(value, TensorRef):
            out[prefix + name] = value
    skip = attrs.get("_non_persistent_buffers_set") or set()
    for name, value in (attrs.get("_buffers") or {}).items():
        if isinstance(value, TensorRef) and name not in skip:
            out[prefix + name] = value
    for name, child in attrs["_modules"].items():
        if _is_module(child):
            _module_weights(child, f"{prefix}{name}.", out, seen)


def _weights_of(obj: Any) -> tuple[dict[str, TensorRef], str | None] | None:
    """The weights ``obj`` holds directly, as a module or a state dict; else ``None``."""
    if _is_module(obj):
        out: dict[str, TensorRef] = {}
        _module_weights(obj, "", out, set())
        return out, obj.global_name
    if isinstance(obj, dict):
        tensors: dict[str, TensorRef] = {}
        held = 0
        for k, v in obj.items():
            if isinstance(v, TensorRef):
                tensors[str(k)] = v
            elif _is_packed(v):  # a quantized module's (weight, bias) tuple
                tensors.update((f"{k}.{i}", t) for i, t in enumerate(v) if t is not None)
            else:
                continue
            held += 1
        if tensors and held >= len(obj) - held:
            return tensors, None
    return None


def _is_packed(value: Any) -> bool:
    """A tuple of tensors as one state-dict entry: quantized modules' ``_packed_params``."""
    return (isinstance(value, tuple) and 0 < len(value) <= 8
            and isinstance(value[0], TensorRef)
            and all(v is None or isinstance(v, TensorRef) for v in value))


def _find(obj: Any, path: str, depth: int, found: dict[str, tuple[dict[str, TensorRef],
                                                                  str | None]]) -> None:
    """Record every container of weights under ``obj``, in :data:`WEIGHT_KEYS` order."""
    direct = _weights_of(obj)
    if direct is not None:
        found[path] = direct
        return
    if not isinstance(obj, dict) or depth >= _MAX_DEPTH:
        return
    ordered = [k for k in WEIGHT_KEYS if k in obj] + [k for k in obj if k not in WEIGHT_KEYS]
    for key in ordered:
        if isinstance(key, str):
            _find(obj[key], f"{path}.{key}" if path else key, depth + 1, found)


def _lookup(root: Any, key: str) -> Any:
    node = root
    for part in key.split(".") if key else []:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def select_weights(root: Any, *, key: str | None = None) -> Selection:
    """Pick the model weights out of a saved object.

    Args:
        root: The saved object, with :class:`~torchgraft.meta.TensorRef` leaves.
        key: Where the weights are, as a dotted path (``"state_dict_ema"``); found when ``None``.

    Returns:
        The selection.

    Raises:
        TorchgraftError: If ``key`` does not lead to weights.
    """
    found: dict[str, tuple[dict[str, TensorRef], str | None]] = {}
    _find(root, "", 0, found)
    if key is not None:
        chosen = _weights_of(_lookup(root, key))
        if chosen is None:
            available = ", ".join(repr(k) for k in found) or "none"
            raise TorchgraftError(f"'{key}' does not hold weights; weight sets found: {available}")
        found.setdefault(key, chosen)
    elif not found and isinstance(root, TensorRef):
        found[""] = ({"tensor": root}, None)
    chosen_key = key if key is not None else next(iter(found), "")
    weights, model_class = found.get(chosen_key, ({}, None))
    weight_sets = {k: len(w) for k, (w, _cls) in found.items()}
    return Selection(
        weights=weights,
        key=chosen_key,
        model_class=model_class,
        weight_sets=weight_sets,
        extras=_extras(root, chosen_key, weight_sets, set(map(id, weights.values()))),
    )


def _extras(root: Any, key: str, weight_sets: dict[str, int], used: set[int]) -> dict[str, Any]:
    """Everything outside the chosen weights, as plain data; other weight sets summarised."""
    if isinstance(root, TensorRef) or (key == "" and _is_module(root)):
        return {}
    if not isinstance(root, dict):
        return {"object": to_plain(root)}
    return _rest(root, "", key, weight_sets, used)


def _rest(obj: dict[Any, Any], prefix: str, key: str, weight_sets: dict[str, int],
          used: set[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in obj.items():
        if _used(value, used):  # the chosen weights: most entries, no path to build
            continue
        path = f"{prefix}{name}"
        if path == key or key.startswith(path + "."):
            if isinstance(value, dict):
                rest = _rest(value, path + ".", key, weight_sets, used)
                if rest:
                    out[str(name)] = rest
        elif path in weight_sets:
            out[str(name)] = (f"<weights: {weight_sets[path]} tensors; "
                              f"open with weights_key='{path}'>")
        else:
            out[str(name)] = to_plain(value)
    return out


def _used(value: Any, used: set[int]) -> bool:
    if isinstance(value, TensorRef):
        return id(value) in used
    return _is_packed(value) and all(v is None or id(v) in used for v in value)


#: Plain data deeper than this is cut: no real checkpoint nests its extras so deep.
MAX_PLAIN_DEPTH = 64
#: Containers expanded before shared ones are no longer expanded again.
MAX_PLAIN_NODES = 100_000


def to_plain(obj: Any) -> Any:
    """Turn saved data into plain Python: tensors become short descriptions.

    Optimizer states are summarised (their per-parameter tensors are not listed), pickled
    objects become dicts with a ``"__class__"`` entry. At most :data:`MAX_PLAIN_NODES`
    containers are expanded; past that, a container already expanded once says
    ``"<shared>"``, so a pickle whose lists share themselves (``x = [x, x]``, 60 levels)
    takes bounded time. Cycles say ``"<cycle>"``, nesting past :data:`MAX_PLAIN_DEPTH`
    ``"<nested too deeply>"``.

    Args:
        obj: The saved data.

    Returns:
        JSON-ready data (dict keys may be ints).
    """
    return _Plainer().plain(obj, 0)


#: What :class:`_Plainer` expands (the rest are leaves).
_CONTAINERS = (dict, list, tuple, set, frozenset, PickledObject)


class _Plainer:
    """One walk of :func:`to_plain`: what was expanded already, and what is being expanded."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.active: set[int] = set()
        self.budget = MAX_PLAIN_NODES

    def plain(self, obj: Any, depth: int) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if not isinstance(obj, _CONTAINERS):
            return self._leaf(obj)
        key = id(obj)
        if key in self.active:
            return "<cycle>"
        if key in self.done and self.budget <= 0:
            return "<shared>"
        if depth >= MAX_PLAIN_DEPTH:
            return "<nested too deeply>"
        self.active.add(key)
        self.budget -= 1
        try:
            return self._container(obj, depth + 1)
        finally:
            self.active.discard(key)
            self.done.add(key)

    @staticmethod
    def _leaf(obj: Any) -> Any:
        if isinstance(obj, TensorRef):
            return obj.meta.describe()
        if isinstance(obj, (bytes, bytearray)):
            return f"<{len(obj)} bytes>"
        if isinstance(obj, torch.dtype):
            return dtype_name(obj)
        if isinstance(obj, (torch.device, torch.layout, torch.memory_format, complex,
                            datetime.date, datetime.time, datetime.timedelta)):
            return str(obj)
        return repr(obj)

    def _container(self, obj: Any, depth: int) -> Any:
        if isinstance(obj, dict):
            if {"state", "param_groups"} <= obj.keys():
                return self._optimizer(obj, depth)
            return {(k if isinstance(k, (str, int)) else str(k)): self.plain(v, depth)
                    for k, v in obj.items()}
        if isinstance(obj, (list, tuple, set, frozenset)):
            return [self.plain(v, depth) for v in obj]
        if _is_module(obj):
            weights = _weights_of(obj)
            count = len(weights[0]) if weights else 0
            return f"<module {obj.global_name} with {count} tensors>"
        plain: dict[str, Any] = {"__class__": obj.global_name}
        if obj.called:
            plain["__call__"] = self.plain(list(obj.args), depth)
        plain.update({str(k): self.plain(v, depth) for k, v in obj.attributes().items()})
        if obj.items:
            plain["items"] = self.plain(obj.items, depth)
        if obj.list_items:
            plain["list"] = self.plain(obj.list_items, depth)
        return plain

    def _optimizer(self, state_dict: dict[str, Any], depth: int) -> dict[str, Any]:
        tensors = all_tensors(state_dict["state"])
        return {
            "param_groups": self.plain(state_dict.get("param_groups"), depth),
            "state": f"<optimizer state for {len(state_dict['state'] or {})} parameters: "
                     f"{len(tensors)} tensors, {sum(t.meta.nbytes for t in tensors)} bytes>",
        }


def all_tensors(obj: Any) -> list[TensorRef]:
    """Every tensor anywhere in a saved object, each once.

    Args:
        obj: The saved object.

    Returns:
        The tensors, in the order first met.
    """
    out: dict[int, TensorRef] = {}
    stack = [obj]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, TensorRef):
            out.setdefault(id(node), node)
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(reversed(list(node)))
        elif isinstance(node, PickledObject):
            stack.extend([node.state, *node.args, *node.items.values(), *node.list_items])
    return list(out.values())
