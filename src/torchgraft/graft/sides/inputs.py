"""Inputs to compare two models on: generated from a config or read from a file.

They are bound to each model's own ``forward`` arguments by name.

Every input has a role (token ids, pixel values, audio features); each role is made from
what a config says (vocabulary size, image size and channels, mel bins and audio length) and
goes to the ``forward`` argument whose name the role lists (``input_ids``, ``idx``, ``tokens``;
``pixel_values``, ``image``...). A ``forward`` with one tensor argument of another name gets
the one role there is.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError

__all__ = ["ROLES", "InputRole", "Inputs", "bind", "by_role", "from_config", "read_inputs"]

#: Config keys, searched at the top and in sub-configs (``text_config``...), first found wins.
Config = Mapping[str, Any]


def _find(config: Config, *keys: str) -> Any:
    for scope in (config, *(v for v in config.values() if isinstance(v, Mapping))):
        for key in keys:
            if isinstance(scope.get(key), (int, list, tuple)) and scope.get(key):
                return scope[key]
    return None


#: Contexts up to this long are generated whole: CLIP's text context.
_FULL_CONTEXT = 77


def _tokens(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    vocab = _find(config, "vocab_size", "n_vocab")
    if not isinstance(vocab, int):
        return None
    limit = _find(config, "max_position_embeddings", "n_positions", "max_target_positions",
                  "n_ctx", "context_length")
    # a short context is filled (OpenAI's CLIP takes exactly its 77 positions); a long one is
    # sampled with 8 tokens
    length = limit if isinstance(limit, int) and limit <= _FULL_CONTEXT else 8
    return torch.randint(0, vocab, (1, length), generator=generator)


def _pixels(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    size = _find(config, "image_size", "img_size")
    if size is None and _find(config, "num_channels", "in_chans") is None:
        return None
    size = size or 64  # a convolutional network takes any size: 64 goes through 5 strides
    height, width = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    channels = _find(config, "num_channels", "in_chans", "in_channels") or 3
    return torch.randn(1, int(channels), int(height), int(width), generator=generator)


def _audio(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    bins = _find(config, "num_mel_bins", "n_mels")
    positions = _find(config, "max_source_positions", "n_audio_ctx")
    if not isinstance(bins, int) or not isinstance(positions, int):
        return None
    return torch.randn(1, bins, 2 * positions, generator=generator)  # two stride-2 convolutions


@dataclass(frozen=True)
class InputRole:
    """One kind of input.

    Attributes:
        name: Shown in messages.
        arguments: ``forward`` argument names that take it, in the code bases known.
        make: Makes it from a config (``None`` when the config says nothing of it).
    """

    name: str
    arguments: tuple[str, ...]
    make: Callable[[Config, torch.Generator], torch.Tensor | None]


ROLES = (
    InputRole("token ids", ("input_ids", "decoder_input_ids", "idx", "tokens", "token_ids",
                            "text", "input_tokens"), _tokens),
    InputRole("pixel values", ("pixel_values", "images", "image", "img", "pixels"), _pixels),
    InputRole("audio features", ("input_features", "mel", "audio_features", "features"),
              _audio),
)

class Inputs(dict[str, torch.Tensor]):
    """Inputs by role (``"token ids"``...) or by argument name.

    :func:`bind` gives each to the ``forward`` argument of its role, so the same inputs fit
    models of different code bases.
    """


def from_config(config: Config, *, seed: int = 0) -> Inputs:
    """One small batch of every input a config describes, from a fixed seed.

    Args:
        config: A model config (a transformers ``config.json``'s content).
        seed: The generator's seed.

    Returns:
        Role name to tensor: token ids in range, pixel values of the right size...
    """
    generator = torch.Generator().manual_seed(seed)
    made = {role.name: role.make(config, generator) for role in ROLES}
    return Inputs({name: tensor for name, tensor in made.items() if tensor is not None})


def _parameters(model: nn.Module) -> list[inspect.Parameter]:
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return []
    return [p for p in signature.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def bind(model: nn.Module, inputs: Inputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Give each of ``model.forward``'s arguments the input of its role.

    Args:
        model: The model.
        inputs: Role name to tensor (:func:`from_config`), or argument name to tensor.

    Returns:
        Positional and keyword arguments for ``model(*args, **kwargs)``.

    Raises:
        TorchgraftError: If a required argument gets no input.
    """
    by_argument = {argument: inputs[role.name] for role in ROLES if role.name in inputs
                   for argument in role.arguments}
    by_argument.update({k: v for k, v in inputs.items() if k not in {r.name for r in ROLES}})
    parameters = _parameters(model)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    left = dict(inputs)
    for parameter in parameters:
        value = by_argument.get(parameter.name)
        if value is None and parameter.default is parameter.empty and len(left) == 1:
            value = next(iter(left.values()))  # forward(x): the one input there is
        if value is None:
            if parameter.default is parameter.empty:
                raise TorchgraftError(
                    f"cannot give {type(model).__name__}.forward its argument "
                    f"'{parameter.name}': the inputs are {', '.join(inputs) or 'none'}; pass "
                    "example_inputs (and source_inputs) yourself")
            continue
        left = {k: v for k, v in left.items() if v is not value}
        if parameter.kind is parameter.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[parameter.name] = value
    return tuple(args), kwargs


_MAX_INPUTS_BYTES = 1 << 30


def read_inputs(path: str | os.PathLike[str]) -> Inputs:
    """Inputs from a file: a safetensors or ``.pt`` (weights-only) file of named tensors.

    Names are ``forward`` argument names (``input_ids``) or role names (``token ids``).

    Args:
        path: The file.

    Returns:
        Name to tensor.

    Raises:
        TorchgraftError: If the file cannot be read or holds no tensors.
    """
    from ...checkpoint import open as open_checkpoint

    file = Path(path)
    if not file.is_file():
        raise TorchgraftError("inputs file not found", path=file)
    if file.stat().st_size > _MAX_INPUTS_BYTES:
        raise TorchgraftError(f"an inputs file is at most {_MAX_INPUTS_BYTES >> 20} MiB",
                              path=file)
    with open_checkpoint(file) as checkpoint:
        tensors = {name: ref.read() for name, ref in checkpoint.tensor_refs().items()}
    if not tensors:
        raise TorchgraftError("the inputs file holds no tensors", path=file)
    return by_role(tensors)


def by_role(named: Mapping[str, Any]) -> Inputs:
    """Inputs named by ``forward`` argument names, as roles where a role lists the name.

    Bound with :func:`bind`, ``{"input_ids": ids}`` then reaches a ``forward(idx)`` too.

    Args:
        named: Argument (or role) name to value.

    Returns:
        The same values, by role where the name is one of a role's arguments.
    """
    roles = {argument: role.name for role in ROLES for argument in role.arguments}
    return Inputs({roles.get(name, name): value for name, value in named.items()})
