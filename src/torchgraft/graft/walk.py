"""One walk of a model: its ``named_modules()`` and its state-dict tensors, as torch gives them.

torch walks a module tree through a generator per level: on a model of tens of thousands of
modules each walk costs tens of milliseconds, and a graft asks for the modules, the state
dict and several facts of them. :func:`walk_model` walks once, with a stack instead of
nested generators, and reads the state dict off the same walk where that is exactly what
``state_dict(keep_vars=True)`` returns: every module class keeps torch's own ``state_dict``,
``_save_to_state_dict``, ``get_extra_state`` and ``named_modules``, no module has state-dict
hooks, and no module sits in two places. Otherwise torch's own methods are called.
"""

from __future__ import annotations

from torch import nn

from .materialise import ModelTensors
from .sides import state_tensors

__all__ = ["walk_model"]

#: The methods a module class must keep as torch's for the walk to stand for them.
_TORCH_METHODS = {name: getattr(nn.Module, name) for name in (
    "named_modules", "state_dict", "_save_to_state_dict", "get_extra_state")}
#: Module class to whether it keeps every method of :data:`_TORCH_METHODS` (asked once).
_PLAIN: dict[type, bool] = {}


def _plain(module: nn.Module) -> bool:
    """Whether torch's own walks of this module are what :func:`walk_model` computes.

    Its class keeps torch's methods (asked once per class), and neither hooks nor methods of
    its own change them.
    """
    cls = type(module)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = all(getattr(cls, name, None) is method
                                  for name, method in _TORCH_METHODS.items())
    return (plain and not module._state_dict_hooks and not module._state_dict_pre_hooks
            and _TORCH_METHODS.keys().isdisjoint(module.__dict__))  # nor set on the instance


def walk_model(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], ModelTensors]:
    """The model's ``named_modules()`` and its tensors (their state dict too), in one walk.

    Args:
        model: An unwrapped module.

    Returns:
        ``(path, module)`` in ``named_modules()`` order, and the tensors, whose ``state`` is
        the model's :func:`~.sides.state_tensors` (key to tensor, in ``state_dict`` order).
    """
    modules: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    exact = True  # the state dict can be read off this walk
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        path, module = stack.pop()
        if id(module) in seen:  # named_modules() lists it once; state_dict() in each place
            exact = False
            continue
        seen.add(id(module))
        modules.append((path, module))
        exact = exact and _plain(module)
        children = module._modules
        if children:
            prefix = f"{path}." if path else ""
            stack.extend((prefix + name, child) for name, child in reversed(children.items())
                         if child is not None)
    if not exact:
        modules = list(model.named_modules())
    tensors = ModelTensors(modules)
    if not exact:
        tensors.state = state_tensors(model)
    return modules, tensors
