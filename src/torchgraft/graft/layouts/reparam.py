"""Re-parametrised weights: torch's weight normalisation, in either of its names, or folded.

``torch.nn.utils.weight_norm`` stores a module's ``weight`` as a magnitude and a direction,
``weight_g`` and ``weight_v``; its successor ``torch.nn.utils.parametrizations.weight_norm`` as
``parametrizations.weight.original0`` and ``original1``; a module without it (or one whose
normalisation was removed for inference) as the plain ``weight = g * v / ||v||``. These are
torch's own names, not a code base's: audio codecs and vocoders (EnCodec, DAC, HiFi-GAN) hold
every convolution so. Between two sides that store them differently, the source gets virtual
tensors, as :mod:`.fusion` gives fused projections:

- renamed, where both hold a magnitude and a direction under the two names (an identity);
- folded (:class:`~.ops.WeightNorm`), where the model holds no weight normalisation at all;
- split (:class:`~.ops.WeightNormSplit`, ``g = ||w||``, ``v = w``), where the model holds them
  and the checkpoint none: only a weight of a shape some direction of the model has, and none of
  the model's plain weights has, is split.

The dimension the norm keeps is read from the magnitude's shape (torch's: the kept dimension's
size, ones elsewhere; a scalar for the whole tensor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...meta import TensorRef
from ..tensors import Side, TensorInfo
from .ops import Chain, TensorOp, WeightNorm, WeightNormSplit, lazy
from .virtual import Virtual

__all__ = ["Normed", "add_reparametrised", "weight_norms"]

#: The old names: ``<module>.<param>_g``, ``<module>.<param>_v``.
_OLD = re.compile(r"^(?P<param>.+)_(?P<part>[gv])$")
#: The parametrization's: ``<module>.parametrizations.<param>.original0`` (g) and ``1`` (v).
_NEW = re.compile(r"^(?P<module>.*?)\.?parametrizations\.(?P<param>[^.]+)\.original(?P<part>[01])$")


@dataclass(frozen=True)
class Normed:
    """One weight-normalised parameter of a side.

    Attributes:
        weight: The key of the plain parameter it stands for (``conv.weight``).
        g: The magnitude's key.
        v: The direction's key.
        new: Whether it is stored under the parametrization's names.
        dim: The dimension the norm keeps (``-1``: none, the norm of the whole tensor).
    """

    weight: str
    g: str
    v: str
    new: bool
    dim: int


def _dim(g: tuple[int, ...], v: tuple[int, ...]) -> int | None:
    """The dimension a magnitude of shape ``g`` keeps of a direction of shape ``v``."""
    if g in ((), (1,)) and (len(v) != 1 or v == (1,)):
        return -1
    if len(g) != len(v) or not v:
        return None
    kept = [d for d, (a, b) in enumerate(zip(g, v, strict=True)) if a == b and a != 1]
    if len(kept) == 1 and all(a == 1 for d, a in enumerate(g) if d != kept[0]):
        return kept[0]
    if all(a == 1 for a in g):  # the kept dimension has size 1 too
        return next((d for d, b in enumerate(v) if b == 1), None)
    return None


def weight_norms(side: Side) -> dict[str, Normed]:
    """The weight-normalised parameters of a side, by the plain parameter's key.

    Args:
        side: A side.

    Returns:
        Plain key to its magnitude and direction (old or new names). A ``weight_v`` beside
        ``weight_orig`` and ``weight_u`` is spectral norm's, not weight normalisation's.
    """
    found: dict[str, Normed] = {}
    tensors = side.tensors
    for key, info in tensors.items():
        if not key.endswith(("_g", ".original0")):  # the magnitude's key: nothing else leads
            continue
        module, _, leaf = key.rpartition(".")
        new = _NEW.match(key)
        if new is not None and new["part"] == "0":
            param, base = new["param"], key[: -len(".original0")]
            plain = f"{new['module']}.{param}" if new["module"] else param
            g, v = key, f"{base}.original1"
        elif new is None and (old := _OLD.match(leaf)) is not None and old["part"] == "g":
            param = old["param"]
            plain = f"{module}.{param}" if module else param
            g, v = key, f"{plain}_v"
            if f"{plain}_orig" in tensors:  # spectral norm keeps weight_orig, weight_u, weight_v
                continue
        else:
            continue
        if v not in tensors:
            continue
        dim = _dim(info.shape, tensors[v].shape)
        if dim is not None:
            found[plain] = Normed(plain, g, v, new is not None, dim)
    return found


def _key(plain: str, new: bool, part: int) -> str:
    """A magnitude's (0) or direction's (1) key of a plain parameter, in one naming."""
    module, _, param = plain.rpartition(".")
    prefix = f"{module}." if module else ""
    if new:
        return f"{prefix}parametrizations.{param}.original{part}"
    return f"{plain}_{'gv'[part]}"


def _made(op: TensorOp, parts: tuple[str, ...], names: tuple[str, ...], why: tuple[str, ...],
          refs: dict[str, TensorRef]) -> list[Virtual]:
    """The outputs of ``op`` on ``parts`` as virtual tensors ``names`` (added to ``refs``)."""
    for name, ref in zip(names, lazy(op, [refs[p] for p in parts]), strict=True):
        refs[name] = ref
    return [Virtual(name, parts, text, op=op, index=k)
            for k, (name, text) in enumerate(zip(names, why, strict=True))]


def _renamed(normed: dict[str, Normed], new: bool, refs: dict[str, TensorRef]) -> list[Virtual]:
    """Magnitudes and directions under the other naming (identities)."""
    naming = "parametrization" if new else "old"
    return [v for plain, entry in normed.items() if entry.new != new
            for part, key in enumerate((entry.g, entry.v))
            for v in _made(Chain(()), (key,), (_key(plain, new, part),),
                           (f"renamed from {key} (weight normalisation's {naming} names)",),
                           refs)]


def _folded(normed: dict[str, Normed], refs: dict[str, TensorRef]) -> list[Virtual]:
    """Each weight normalisation folded into the plain weight it stands for."""
    return [v for plain, entry in normed.items()
            for v in _made(WeightNorm(entry.dim), (entry.g, entry.v), (plain,),
                           (f"weight normalisation folded: g * v / ||v|| of {entry.g}, "
                            f"{entry.v}",), refs)]


def _split(src: Side, model: dict[str, Normed], dst: Side,
           refs: dict[str, TensorRef]) -> list[Virtual]:
    """Plain weights split as the model's normalisations hold them, where shapes say so.

    A weight of a shape that some direction of the model has, under a parameter name the
    model normalises, and that none of the model's plain parameters of that name has; the
    magnitude's shape (and so the kept dimension) is the model's for that direction's shape.
    """
    magnitudes: dict[tuple[str, tuple[int, ...]], set[tuple[tuple[int, ...], int]]] = {}
    new = {entry.new for entry in model.values()} == {True}
    for plain, entry in model.items():
        by = (plain.rpartition(".")[2], dst.tensors[entry.v].shape)
        magnitudes.setdefault(by, set()).add((dst.tensors[entry.g].shape, entry.dim))
    plain_shapes = {(k.rpartition(".")[2], i.shape) for k, i in dst.tensors.items()}
    found: list[Virtual] = []
    for key, info in src.tensors.items():
        leaf = key.rpartition(".")[2]
        choices = magnitudes.get((leaf, info.shape), set())
        if len(choices) != 1 or (leaf, info.shape) in plain_shapes:
            continue
        [(shape, dim)] = choices
        found += _made(WeightNormSplit(dim, shape), (key,), (_key(key, new, 0), _key(key, new, 1)),
                       (f"split from {key} as a weight normalisation: g = ||w||",
                        f"split from {key} as a weight normalisation: v = w"), refs)
    return found


def add_reparametrised(src: Side, refs: dict[str, TensorRef],
                       dst: Side) -> tuple[Side, list[Virtual]]:
    """Give the source virtual tensors where it stores weight normalisation otherwise.

    Args:
        src: The source side.
        refs: The source's lazy tensors; virtual ones are added to it.
        dst: The target side.

    Returns:
        The source side with each virtual tensor in place of what it was made from, and the
        virtual tensors.
    """
    source, model = weight_norms(src), weight_norms(dst)
    if source and model:
        namings = {entry.new for entry in model.values()}
        virtual = _renamed(source, namings.pop(), refs) if len(namings) == 1 else []
    elif source:
        virtual = _folded(source, refs)
    elif model:
        virtual = _split(src, model, dst, refs)
    else:
        return src, []
    if not virtual:
        return src, []
    replaced = {part for v in virtual for part in v.parts}
    first: dict[str, list[Virtual]] = {}
    for v in virtual:
        first.setdefault(v.parts[0], []).append(v)
    order: list[str] = []
    tensors: dict[str, TensorInfo] = {}
    for name in src.order:
        for v in first.get(name, ()):
            meta = refs[v.name].meta
            order.append(v.name)
            tensors[v.name] = TensorInfo(v.name, meta.shape, meta.dtype, src.tensors[name].kind)
        if name not in replaced:
            order.append(name)
            tensors[name] = src.tensors[name]
    return src.with_tensors(tensors, order), virtual
