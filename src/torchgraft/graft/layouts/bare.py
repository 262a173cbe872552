"""Bare parameters: tensors a module holds itself, where other code bases have a child module.

OpenAI's CLIP keeps ``positional_embedding``, ``class_embedding``, ``text_projection`` and
``proj`` as parameters of the model, where transformers has an ``nn.Embedding``'s ``weight``
or an ``nn.Linear``'s; ``nn.MultiheadAttention`` keeps its fused q, k, v as
``in_proj_weight`` and ``in_proj_bias``, where others have a ``qkv`` Linear. Which names are
which, and which are stored ``[in, out]`` (used as ``x @ W``, a Linear's weight transposed), is
data (:data:`BARE_PARAMETERS`): the name itself decides the orientation, also where a square
shape could not. A 2-D bare parameter the table does not name, against a Linear's weight, is
transposed when only its transpose fits; when it is square, nothing says which way it is stored:
a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tensors import TensorInfo

__all__ = ["BARE_PARAMETERS", "BareParameter", "in_out", "module_and_leaf", "transposed",
           "unknown_orientation"]


@dataclass(frozen=True)
class BareParameter:
    """One bare parameter's name and what it stands for.

    Attributes:
        name: The parameter's own name (the key's last part).
        module: The module name it stands for (``in_proj``).
        leaf: Its tensor in that module (``weight``, ``bias``).
        in_out: Stored ``[in, out]`` (used as ``x @ W``): a Linear's weight transposed.
    """

    name: str
    module: str
    leaf: str = "weight"
    in_out: bool = False


BARE_PARAMETERS: tuple[BareParameter, ...] = (
    BareParameter("in_proj_weight", "in_proj"),  # nn.MultiheadAttention: fused [Q; K; V]
    BareParameter("in_proj_bias", "in_proj", "bias"),
    BareParameter("positional_embedding", "positional_embedding"),  # [positions, width]
    BareParameter("class_embedding", "class_embedding"),
    BareParameter("text_projection", "text_projection", in_out=True),  # x @ W
    BareParameter("proj", "proj", in_out=True),  # OpenAI CLIP's visual.proj: x @ W
)

_BY_NAME = {bare.name: bare for bare in BARE_PARAMETERS}


def module_and_leaf(key: str) -> tuple[str, str]:
    """The module a key stands for and its tensor there, bare parameters seen as modules.

    ``blocks.0.attn.in_proj_weight`` is ``("blocks.0.attn.in_proj", "weight")``; any other key
    is its module path and its last part.

    Args:
        key: A tensor key.

    Returns:
        The module path and the leaf name.
    """
    parent, _, leaf = key.rpartition(".")
    bare = _BY_NAME.get(leaf)
    if bare is None:
        return parent, leaf
    return f"{parent}.{bare.module}" if parent else bare.module, bare.leaf


def in_out(key: str, shape: tuple[int, ...]) -> bool:
    """Whether a key is a bare projection stored ``[in, out]`` (a Linear's weight transposed).

    Args:
        key: A tensor key.
        shape: Its shape.

    Returns:
        True for a 2-D bare parameter :data:`BARE_PARAMETERS` says is stored ``[in, out]``.
    """
    bare = _BY_NAME.get(key.rpartition(".")[2])
    return bare is not None and bare.in_out and len(shape) == 2


#: The leaves of a module's own tensors: a key ending otherwise is a bare parameter.
_MODULE_LEAVES = frozenset({"weight", "bias"})


def _unnamed(info: TensorInfo) -> bool:
    """A 2-D bare parameter :data:`BARE_PARAMETERS` does not name."""
    leaf = info.name.rpartition(".")[2]
    return len(info.shape) == 2 and leaf not in _BY_NAME and leaf not in _MODULE_LEAVES


def _weight(info: TensorInfo) -> bool:
    """A Linear's (or, from a file, any module's) 2-D weight."""
    return (info.kind in ("linear", None) and info.name.rpartition(".")[2] == "weight"
            and len(info.shape) == 2)


def _against_weight(src: TensorInfo, dst: TensorInfo) -> tuple[TensorInfo, TensorInfo] | None:
    """The bare side and the weight side of a pair, when one is each."""
    return next(((bare, weight) for bare, weight in ((src, dst), (dst, src))
                 if _weight(weight) and not _weight(bare) and len(bare.shape) == 2), None)


def transposed(src: TensorInfo, dst: TensorInfo) -> bool:
    """Whether a bare projection and a Linear's weight are stored transposed to each other.

    Named ``[in, out]`` (:data:`BARE_PARAMETERS`), or, for a name the table lacks, when only
    the transpose fits.

    Args:
        src: The source tensor.
        dst: The target tensor.

    Returns:
        True when one is a bare projection stored the other way round from the other.
    """
    sides = _against_weight(src, dst)
    if sides is None:
        return False
    bare, weight = sides
    if _unnamed(bare):
        return bare.shape != weight.shape and bare.shape == weight.shape[::-1]
    return in_out(bare.name, bare.shape)


def unknown_orientation(src: TensorInfo, dst: TensorInfo) -> bool:
    """Whether nothing says which way a square bare parameter is stored against a weight.

    Args:
        src: The source tensor.
        dst: The target tensor.

    Returns:
        True for a square 2-D bare parameter the table does not name, against a 2-D weight.
    """
    sides = _against_weight(src, dst)
    return sides is not None and _unnamed(sides[0]) and sides[0].shape == sides[1].shape \
        and sides[0].shape[0] == sides[0].shape[1]
