"""Building modules whose parameters take no memory.

A model of the source's code base to compare with; a module rebuilt for the buffers its
constructor computes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["empty_parameters"]


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
