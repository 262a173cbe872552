"""Inputs to compare two models on: generated from a config or from the models, or read from a file.

They are bound to each model's own ``forward`` arguments by name.

Every input has a role (token ids, pixel values, audio features); each role is made from
what a config says (vocabulary size, image size and channels, mel bins and audio length) and
goes to the ``forward`` argument whose name the role lists (``input_ids``, ``idx``, ``tokens``;
``pixel_values``, ``image``...). A ``forward`` with one tensor argument of another name gets
the one role there is.

Without a config, inputs are generated from the models themselves (:func:`from_modules`):
token ids in range of the first ``nn.Embedding``, images of the first ``nn.Conv2d``'s channels
(in a few sizes, the first the models accept is used), audio features of the first
``nn.Conv1d``'s, features of the first ``nn.Linear``'s width. :func:`of_shape` makes one
tensor of a shape the user states (the command line's ``--input-shape``).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError, shown

__all__ = ["AUDIO_LENGTHS", "IMAGE_SIZES", "MAX_INPUT_BYTES", "ROLES", "InputRole", "Inputs",
           "bind", "by_role",
           "describe_inputs", "from_config", "from_modules", "of_shape", "read_inputs"]

#: Config keys, searched at the top and in sub-configs (``text_config``...), first found wins.
Config = Mapping[str, Any]


def _found(config: Config, *keys: str) -> tuple[str, Any] | None:
    """The first of ``keys`` the config or a sub-config sets (a number or a list).

    Returns:
        The entry's name (``vision_config.image_size``) and its value; ``None`` if none is set.
    """
    scopes = [("", config), *((f"{k}.", v) for k, v in config.items() if isinstance(v, Mapping))]
    for prefix, scope in scopes:
        for key in keys:
            if isinstance(scope.get(key), (int, list, tuple)) and scope.get(key):
                return f"{prefix}{key}", scope[key]
    return None


#: The most bytes one generated input may take: a few of its kind (SAM's 1024 x 1024 images
#: are 12 MiB); a config claiming more (``image_size: 100000``, 120 GB) is refused.
MAX_INPUT_BYTES = 16 << 20


def _named(entries: list[tuple[str, Any]]) -> str:
    return ", ".join(f"'{key}' {shown(value, 40)}" for key, value in entries)


def _whole(what: str, sizes: tuple[Any, ...], entries: list[tuple[str, Any]]) -> None:
    """Refuse sizes of a generated input that are not whole numbers from 1.

    The error names the config's entries that give them.
    """
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
        raise TorchgraftError(f"{_named(entries)} would size generated {what} "
                              f"{shown(sizes, 80)}: sizes are whole numbers from 1")


def _sized(what: str, shape: tuple[Any, ...], entries: list[tuple[str, Any]]) -> tuple[int, ...]:
    """The shape of an input a config sizes, checked against :data:`MAX_INPUT_BYTES`.

    Raises:
        TorchgraftError: Naming the config's entries that size it.
    """
    _whole(what, shape, entries)
    nbytes = math.prod(shape) * 4  # float32
    if nbytes > MAX_INPUT_BYTES:
        raise TorchgraftError(
            f"{_named(entries)} would make generated {what} of shape {shape} ({nbytes:,} "
            f"bytes): more than the {MAX_INPUT_BYTES >> 20} MiB an input generated to compare "
            "outputs may take; give inputs (example_inputs=, CLI: --inputs FILE)")
    return shape


#: Contexts up to this long are generated whole: CLIP's text context.
_FULL_CONTEXT = 77


def _tokens(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    vocab = _found(config, "vocab_size", "n_vocab")
    if vocab is None or not isinstance(vocab[1], int):
        return None
    limit = _found(config, "max_position_embeddings", "n_positions", "max_target_positions",
                   "n_ctx", "context_length")
    # a short context is filled (OpenAI's CLIP takes exactly its 77 positions); a long one is
    # sampled with 8 tokens
    length = limit[1] if limit is not None and isinstance(limit[1], int) and \
        limit[1] <= _FULL_CONTEXT else 8
    _whole("token ids", (length, vocab[1]), [e for e in (vocab, limit) if e is not None])
    return torch.randint(0, vocab[1], (1, length), generator=generator)


def _pixels(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    size = _found(config, "image_size", "img_size")
    if size is None and _found(config, "num_channels", "in_chans") is None:
        return None
    channels = _found(config, "num_channels", "in_chans", "in_channels")
    value = size[1] if size is not None else 64  # a convolutional network takes any size
    sides = (value, value) if not isinstance(value, (list, tuple)) else tuple(value)[-2:]
    shape = _sized("pixel values", (1, channels[1] if channels else 3, *sides),
                   [e for e in (channels, size) if e is not None])
    return torch.randn(shape, generator=generator)


def _audio(config: Config, generator: torch.Generator) -> torch.Tensor | None:
    bins = _found(config, "num_mel_bins", "n_mels")
    positions = _found(config, "max_source_positions", "n_audio_ctx")
    if bins is None or positions is None or not all(
            isinstance(e[1], int) for e in (bins, positions)):
        return None
    shape = _sized("audio features", (1, bins[1], 2 * positions[1]),  # two stride-2 convolutions
                   [bins, positions])
    return torch.randn(shape, generator=generator)


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


def from_config(config: Config, *, seed: int = 0, path: Path | None = None) -> Inputs:
    """One small batch of every input a config describes, from a fixed seed.

    Each is at most :data:`MAX_INPUT_BYTES`.

    Args:
        config: A model config (a transformers ``config.json``'s content).
        seed: The generator's seed.
        path: The config's file, named in errors.

    Returns:
        Role name to tensor: token ids in range, pixel values of the right size...

    Raises:
        TorchgraftError: If the config sizes an input past the bound, or not in whole numbers,
            naming its entries (and the file).
    """
    generator = torch.Generator().manual_seed(seed)
    try:
        made = {role.name: role.make(config, generator) for role in ROLES}
    except TorchgraftError as exc:
        raise exc if path is None else exc.located(path) from None
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
                    f"'{parameter.name}': the inputs are {', '.join(inputs) or 'none'}; give "
                    "them as example_inputs= (CLI: --inputs FILE)")
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


#: Image sizes tried for a model whose first module is a 2-D convolution, in turn: a model of
#: one size (a ViT) takes 224, a small one 64 or 32; a convolutional network takes any.
IMAGE_SIZES = (224, 64, 32)
#: Lengths tried for a model whose first module is a 1-D convolution: Whisper's 3000 mel frames,
#: then shorter.
AUDIO_LENGTHS = (3000, 1024, 256)
#: Tokens in generated token ids, and in a generated sequence of features.
_LENGTH = 8
#: Modules whose weights say what a model's input is, and the role of what they take.
_FIRST = ((nn.Embedding, "token ids"), (nn.Conv2d, "pixel values"),
          (nn.Conv1d, "audio features"), (nn.Linear, "features"))


def _floating(module: nn.Module) -> torch.dtype:
    """The dtype of a module's weight, where floating and real; else float32."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.is_floating_point() and not weight.is_meta:
        return weight.dtype
    return torch.float32


def _vocabulary(models: tuple[nn.Module, ...]) -> int | None:
    """The smallest first ``nn.Embedding``'s size of the models: ids below it fit each."""
    sizes = [next((m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)),
                  None) for model in models]
    known = [size for size in sizes if size]
    return min(known) if known else None


def _shapes(module: nn.Module) -> list[tuple[int, ...]]:
    """Input shapes a model whose first such module is ``module`` may take, in turn."""
    if isinstance(module, nn.Conv2d):
        return [(1, module.in_channels, size, size) for size in IMAGE_SIZES]
    if isinstance(module, nn.Conv1d):
        return [(1, module.in_channels, length) for length in AUDIO_LENGTHS]
    if isinstance(module, nn.Linear):
        return [(1, module.in_features), (1, _LENGTH, module.in_features)]
    return [(1, _LENGTH)]


def from_modules(*models: nn.Module, seed: int = 0, meta: bool = False) -> list[Inputs]:
    """Inputs the models may take, read from their first modules: each to try in turn.

    The first module of each kind that says what a model's input is, in the first model's
    order: an ``nn.Embedding`` (token ids below the smallest first embedding of the models),
    an ``nn.Conv2d`` (images of its channels, :data:`IMAGE_SIZES`), an ``nn.Conv1d`` (audio
    features of its channels, :data:`AUDIO_LENGTHS`), an ``nn.Linear`` (features of its width,
    alone or as a sequence). A model whose head comes first in its code still gets its
    convolution's images, tried after the head's features.

    Args:
        models: The models that will run on them (the source's first).
        seed: The generator's seed.
        meta: Inputs on the meta device, their shapes and dtypes only (nothing drawn).

    Returns:
        One set of inputs per shape to try, in order; empty when no module says.
    """
    if not models:
        return []
    generator = torch.Generator().manual_seed(seed)
    firsts: dict[str, nn.Module] = {}
    for module in models[0].modules():
        role = next((name for kind, name in _FIRST if isinstance(module, kind)), None)
        if role is not None:
            firsts.setdefault(role, module)
    vocabulary = _vocabulary(models)
    found = []
    for role, module in firsts.items():
        for shape in _shapes(module):
            if role == "token ids":
                if vocabulary is None:
                    continue
                tensor = (torch.empty(shape, dtype=torch.long, device="meta") if meta else
                          torch.randint(0, vocabulary, shape, generator=generator))
            else:
                dtype = _floating(module)
                tensor = (torch.empty(shape, dtype=dtype, device="meta") if meta else
                          torch.randn(shape, generator=generator).to(dtype))
            found.append(Inputs({role: tensor}))
    return found


def of_shape(shape: tuple[int, ...], dtype: torch.dtype, model: nn.Module, *,
             seed: int = 0) -> Inputs:
    """One input of a shape and dtype the user states, random, named by its role.

    Integer ids are token ids below the model's first ``nn.Embedding``'s size; floating values
    of four dimensions are pixel values, of three audio features (bound to ``pixel_values``,
    ``input_features``... by name, or to a ``forward`` of one argument).

    Args:
        shape: The shape (``(1, 3, 224, 224)``).
        dtype: Its dtype.
        model: The model, whose first embedding bounds integer ids.
        seed: The generator's seed.

    Returns:
        The input.

    Raises:
        TorchgraftError: If ids are asked of a model without an embedding.
    """
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        role = {4: "pixel values", 3: "audio features"}.get(len(shape), "features")
        return Inputs({role: torch.randn(shape, generator=generator).to(dtype)})
    vocabulary = _vocabulary((model,))
    if vocabulary is None:
        raise TorchgraftError(f"integer inputs ({dtype}) are token ids below the size of the "
                              "model's first nn.Embedding, and the model has none; use a "
                              "floating dtype (CLI: --input-dtype float32)")
    return Inputs({"token ids": torch.randint(0, vocabulary, shape, generator=generator,
                                              dtype=dtype)})


def describe_inputs(inputs: Inputs) -> str:
    """Inputs in a few words: ``pixel values (1, 3, 224, 224)``."""
    return ", ".join(f"{name} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor)
                     else name for name, tensor in inputs.items())
