"""Mixture-of-experts layers: per-expert tensors <-> stacked ``[E, ...]`` parameters, both ways.

The Hub stores each expert's projections apart (``mlp.experts.3.gate_proj.weight``, Mixtral's
``block_sparse_moe.experts.3.w1.weight``); transformers 5 and many hand-written models hold
one 3-D parameter per projection for all experts (``experts.gate_up_proj [E, 2I, H]``,
``experts.down_proj [E, H, I]``). When one side has the experts apart and the other stacked,
the source gets virtual tensors, as :mod:`~torchgraft.graft.layouts.fusion` does for q/k/v:

- stacking: ``experts.gate_up_proj`` made of every expert's gate and up projections; read
  lazily, each expert straight into its slice of the target's storage (no stacked copy);
- unstacking: ``experts.3.gate_proj.weight`` as a slice of the stacked tensor.

Which projections make a stacked parameter, in which order, and whether it is stored
``[E, out, in]`` (``nn.Linear``'s order) or ``[E, in, out]`` is data: :data:`ROLES`,
:data:`STACKED` and :data:`CONVENTIONS`; the orientation is read from the shapes where they
tell, else from the convention. A layer whose experts cannot be stacked (unequal shapes, an
expert or a projection missing, another number of experts than the model's) gets no virtual
tensor and a reason naming the layer and the experts, never a partial stack.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ...errors import TorchgraftError
from ...meta import TensorMeta, TensorRef
from ...renames import Rule, rename
from ...text import few
from ..tensors import Side, TensorInfo
from .layout import Layout

__all__ = ["CONVENTIONS", "MIXTRAL_TO_MLP", "MLP_TO_MIXTRAL", "ROLES", "STACKED", "Convention",
           "ExpertTensors", "HUB_NAMES",
           "HUB_RENAMES", "add_experts", "expert_layouts", "per_expert"]

#: Each projection of an expert, by role, with the names it goes by.
ROLES: dict[str, tuple[str, ...]] = {
    "gate": ("gate_proj", "w1", "gate"),
    "up": ("up_proj", "w3", "up"),
    "down": ("down_proj", "w2", "down"),
}

#: Stacked parameters (a leaf of an ``experts`` module), by name: the roles they hold, in
#: order along the output dimension. ``<name>_bias`` holds the same roles' biases.
STACKED: dict[str, tuple[str, ...]] = {
    "gate_up_proj": ("gate", "up"), "w13": ("gate", "up"),
    "down_proj": ("down",), "w2": ("down",),
    "gate_proj": ("gate",), "w1": ("gate",),
    "up_proj": ("up",), "w3": ("up",),
}

Orientation = Literal["out_in", "in_out"]


@dataclass(frozen=True)
class Convention:
    """How a family of models stacks its experts, where the shapes cannot tell.

    Attributes:
        name: For reports.
        marker: A leaf whose presence in the stacked ``experts`` module selects this
            convention (``""``: the default).
        orientation: ``"out_in"`` (``[E, out, in]``, as ``nn.Linear`` stores a weight) or
            ``"in_out"`` (``[E, in, out]``).
        interleaved: Gate and up rows alternate (gate, up, gate, up...) instead of following
            each other (all gate rows, then all up rows).
    """

    name: str
    marker: str
    orientation: Orientation
    interleaved: bool = False


#: Known conventions, the first whose marker is present applying. GPT-OSS stores
#: ``gate_up_proj [E, H, 2I]`` with gate and up interleaved, and biases beside it.
CONVENTIONS = (
    Convention("gpt-oss", "gate_up_proj_bias", "in_out", interleaved=True),
    Convention("transformers", "", "out_in"),
)

#: Mixtral's Hub files call the MoE block ``block_sparse_moe``; transformers 5 calls it ``mlp``.
MIXTRAL_TO_MLP = Layout(
    name="mixtral-moe",
    applies=lambda src, dst: (any(".block_sparse_moe." in n for n in src.tensors)
                              and not any(".block_sparse_moe." in n for n in dst.tensors)
                              and any(".mlp.experts." in n for n in dst.tensors)),
    renames=(Rule(r"\.block_sparse_moe\.", ".mlp."),),
    exports=(Rule(r"\.mlp\.(experts|gate)\.", r".block_sparse_moe.\1."),),
    across=False,
)
MLP_TO_MIXTRAL = Layout(
    name="mlp->mixtral-moe",
    applies=lambda src, dst: MIXTRAL_TO_MLP.applies(dst, src),
    renames=MIXTRAL_TO_MLP.exports,
    exports=MIXTRAL_TO_MLP.renames,
    across=False,
)

_PER_EXPERT = re.compile(r"^(?P<block>(?:.*\.)?experts)\.(?P<index>\d+)\.(?P<proj>\w+)\."
                         r"(?P<param>weight|bias)$")
_STACKED = re.compile(r"^(?P<block>(?:.*\.)?experts)\.(?P<leaf>\w+?)(?P<bias>_bias)?$")
_ROLE_OF = {name: role for role, names in ROLES.items() for name in names}


def expert_layouts(src: Side, dst: Side) -> list[Layout]:
    """The MoE block renames that stand between a source and a target."""
    return [layout for layout in (MIXTRAL_TO_MLP, MLP_TO_MIXTRAL) if layout.applies(src, dst)]


@dataclass
class ExpertTensors:
    """What :func:`add_experts` made, and what it could not.

    Attributes:
        side: The source side with virtual tensors in place of their parts.
        virtual: Virtual key to (its parts, why), for the plan's ``derived``.
        problems: Target key to why its layer's experts could not be stacked or unstacked.
        unused: Source key to the same reason, for the source's tensors of such a layer.
    """

    side: Side
    virtual: dict[str, tuple[tuple[str, ...], str]]
    problems: dict[str, str]
    unused: dict[str, str]


def _rename(block: str, layouts: Sequence[Layout]) -> str:
    """An experts module's path on the other side (the layouts' renames applied)."""
    new, _rule = rename(block + ".", [rule for layout in layouts for rule in layout.renames])
    return (new or block + ".")[:-1]


def _per_expert(side: Side) -> dict[str, dict[int, dict[tuple[str, str], TensorInfo]]]:
    """Experts module path -> expert index -> (role, weight|bias) -> tensor."""
    found: dict[str, dict[int, dict[tuple[str, str], TensorInfo]]] = {}
    for name, info in side.tensors.items():
        match = _PER_EXPERT.match(name)
        if match and match["proj"] in _ROLE_OF:
            experts = found.setdefault(match["block"], {})
            experts.setdefault(int(match["index"]), {})[(_ROLE_OF[match["proj"]],
                                                         match["param"])] = info
    return found


def _stacked(side: Side) -> dict[str, dict[tuple[str, str], TensorInfo]]:
    """Experts module path -> (stacked leaf, weight|bias) -> tensor (3-D weights, 2-D biases)."""
    found: dict[str, dict[tuple[str, str], TensorInfo]] = {}
    for name, info in side.tensors.items():
        tail = name.rpartition("experts.")[2]
        match = _STACKED.match(name) if tail and "." not in tail else None  # cheap test first
        if match and match["leaf"] in STACKED:
            param = "bias" if match["bias"] else "weight"
            if len(info.shape) == (2 if param == "bias" else 3):
                found.setdefault(match["block"], {})[(match["leaf"], param)] = info
    return found


def _convention(leaves: set[str], orientation: Orientation | None = None) -> Convention:
    """The first convention whose marker is present and whose orientation the shapes allow."""
    return next(c for c in CONVENTIONS if not c.marker or (
        c.marker in leaves and orientation in (None, c.orientation)))


def _orientation(stacked: tuple[int, ...], part: tuple[int, ...], count: int,
                 convention: Convention) -> Orientation | None:
    """How a stacked weight ``[E, a, b]`` holds ``count`` parts of shape ``[out, in]``."""
    out_in = stacked[1:] == (part[0] * count, part[1])
    in_out = stacked[1:] == (part[1], part[0] * count)
    if out_in and in_out:
        return convention.orientation
    return "out_in" if out_in else "in_out" if in_out else None


def _block_orientation(stacked: dict[tuple[str, str], TensorInfo],
                       expert: dict[tuple[str, str], TensorInfo]) -> Orientation | None:
    """The orientation the shapes of a layer's first stacked weight tell, if they do."""
    for (leaf, param), info in stacked.items():
        roles = STACKED[leaf]
        if param == "weight" and (roles[0], param) in expert:
            part = expert[(roles[0], param)].shape
            out_in = info.shape[1:] == (part[0] * len(roles), part[1])
            in_out = info.shape[1:] == (part[1], part[0] * len(roles))
            if out_in != in_out:
                return "out_in" if out_in else "in_out"
    return None


def _rows(index: int, count: int, rows: int, interleaved: bool) -> slice:
    """The rows of part ``index`` of ``count`` along a stacked output dimension."""
    return slice(index, None, count) if interleaved else slice(index * rows, (index + 1) * rows)


def _view(stacked: torch.Tensor, expert: int, part: slice, orientation: Orientation,
          bias: bool) -> torch.Tensor:
    """One part of one expert in a stacked tensor, as ``[out, in]`` (or ``[out]``)."""
    if bias:
        return stacked[expert, part]
    return stacked[expert, part] if orientation == "out_in" else stacked[expert][:, part].T


def _stack_into(parts: list[list[TensorRef]], orientation: Orientation, interleaved: bool,
                bias: bool, out: torch.Tensor) -> None:
    """Read every expert's parts straight into their slices of ``out``."""
    for expert, refs in enumerate(parts):
        for k, ref in enumerate(refs):
            rows = ref.meta.shape[0]
            ref.read_into(_view(out, expert, _rows(k, len(refs), rows, interleaved),
                                orientation, bias))


def _stack(parts: list[list[TensorRef]], orientation: Orientation, interleaved: bool,
           bias: bool, meta: TensorMeta) -> torch.Tensor:
    out = torch.empty(meta.shape, dtype=meta.dtype)
    _stack_into(parts, orientation, interleaved, bias, out)
    return out


def _unstack(ref: TensorRef, expert: int, part: slice, orientation: Orientation,
             bias: bool) -> torch.Tensor:
    return _view(ref.read(), expert, part, orientation, bias)


def _check(block: str, experts: dict[int, dict[tuple[str, str], TensorInfo]], count: int,
           keys: list[tuple[str, str]]) -> str | None:
    """Why a layer's experts cannot be stacked into ``count`` experts, else ``None``."""
    where = f"Cannot stack the experts of '{block}'"
    if set(experts) != set(range(count)):
        lacking = sorted(set(range(count)) - set(experts))
        extra = sorted(set(experts) - set(range(count)))
        text = ([f"missing: {few(lacking, 5)}"] if lacking else []) + (
            [f"beyond the model's {count}: {few(extra, 5)}"] if extra else [])
        return (f"{where}: the checkpoint has {len(experts)} experts, the model {count} "
                f"(experts {'; '.join(text)}); no expert of this layer was loaded")
    for role, param in keys:
        lacking = [e for e in range(count) if (role, param) not in experts[e]]
        if lacking:
            return (f"{where}: experts {few(lacking, 5)} have no {role} {param} (expected "
                    f"'{block}.{lacking[0]}.{ROLES[role][0]}.{param}'); no expert of this "
                    "layer was loaded")
        first = experts[0][(role, param)]
        odd = [e for e in range(count) if (experts[e][(role, param)].shape,
                                           experts[e][(role, param)].dtype)
               != (first.shape, first.dtype)]
        if odd:
            other = experts[odd[0]][(role, param)]
            return (f"{where}: '{other.name}' is {other.shape} {other.dtype}, '{first.name}' "
                    f"{first.shape} {first.dtype} (experts {few(odd, 5)} differ from expert 0); "
                    "no expert of this layer was loaded")
    return None


def _suffix(param: str) -> str:
    return "_bias" if param == "bias" else ""


def add_experts(src: Side, refs: dict[str, TensorRef], dst: Side) -> ExpertTensors:
    """Give the source stacked or per-expert virtual tensors where the model holds the other.

    Args:
        src: The source side.
        refs: The source's lazy tensors; virtual ones are added to it.
        dst: The target side.

    Returns:
        The source side with each virtual tensor in place of its parts, the virtual tensors,
        and the layers that could not be converted.
    """
    layouts = expert_layouts(src, dst)
    found = ExpertTensors(src, {}, {}, {})
    infos: dict[str, TensorInfo] = {}
    src_stacked, dst_stacked = _stacked(src), _stacked(dst)
    if not src_stacked and not dst_stacked:
        return found  # nothing stacked on either side: nothing to stack or unstack
    src_apart, dst_apart = _per_expert(src), _per_expert(dst)
    for block, experts in src_apart.items():
        target = _rename(block, layouts)
        if target in dst_stacked and block not in src_stacked and target not in dst_apart:
            _stack_block(block, experts, dst_stacked[target], target, refs, found, infos)
    for block, stacked in src_stacked.items():
        target = _rename(block, layouts)
        if target in dst_apart and block not in src_apart and target not in dst_stacked:
            _unstack_block(block, stacked, dst_apart[target], refs, found, infos)
    if not found.virtual:
        return found
    replaced = {part for parts, _ in found.virtual.values() for part in parts}
    first: dict[str, list[str]] = {}
    for name, (parts, _) in found.virtual.items():
        first.setdefault(parts[0], []).append(name)
    order: list[str] = []
    for name in src.order:
        order += first.get(name, [])
        if name not in replaced:
            order.append(name)
    tensors = {n: i for n, i in src.tensors.items() if n not in replaced} | infos
    found.side = src.with_tensors(tensors, order)
    return found


@dataclass(frozen=True)
class _Block:
    """One MoE layer being stacked or unstacked, and where what is made goes."""

    name: str
    experts: dict[int, dict[tuple[str, str], TensorInfo]]
    refs: dict[str, TensorRef]
    found: ExpertTensors
    infos: dict[str, TensorInfo]


def _stack_block(block: str, experts: dict[int, dict[tuple[str, str], TensorInfo]],
                 stacked: dict[tuple[str, str], TensorInfo], target: str,
                 refs: dict[str, TensorRef], found: ExpertTensors,
                 infos: dict[str, TensorInfo]) -> None:
    leaves = {leaf + _suffix(param) for leaf, param in stacked}
    count = next(iter(stacked.values())).shape[0]
    keys = [(role, param) for (leaf, param) in stacked for role in STACKED[leaf]]
    why_not = _check(block, experts, count, keys)
    if why_not is not None:
        found.problems.update({f"{target}.{leaf}{_suffix(param)}": why_not
                               for leaf, param in stacked})
        found.unused.update({i.name: why_not for parts in experts.values()
                             for i in parts.values()})
        return
    convention = _convention(leaves, _block_orientation(stacked, experts[0]))
    making = _Block(block, experts, refs, found, infos)
    for (leaf, param), info in stacked.items():
        _stack_leaf(making, (leaf, param), info, count, convention)


def _stacked_shape(count: int, rows: int, columns: int, orientation: Orientation,
                   bias: bool) -> tuple[int, ...]:
    if bias:
        return (count, rows)
    return (count, rows, columns) if orientation == "out_in" else (count, columns, rows)


def _stack_leaf(block: _Block, key: tuple[str, str], info: TensorInfo, count: int,
                convention: Convention) -> None:
    """One stacked tensor of the model, made from every expert's parts."""
    leaf, param = key
    roles = STACKED[leaf]
    bias = param == "bias"
    first = block.experts[0][(roles[0], param)]
    rows = first.shape[0]
    orientation = "out_in" if bias else _orientation(info.shape, first.shape, len(roles),
                                                     convention)
    if orientation is None or (bias and info.shape[1:] != (rows * len(roles),)):
        block.found.problems[info.name] = (
            f"Cannot stack the experts of '{block.name}' into '{info.name}' {info.shape}: "
            f"each expert's {' + '.join(roles)} {param} is {first.shape}")
        return
    interleaved = convention.interleaved and len(roles) > 1
    parts = [[block.refs[block.experts[e][(r, param)].name] for r in roles]
             for e in range(count)]
    shape = _stacked_shape(count, rows * len(roles), first.shape[-1], orientation, bias)
    meta = TensorMeta.of(shape, first.dtype)
    args = (parts, orientation, interleaved, bias)
    name = f"{block.name}.{leaf}{_suffix(param)}"
    block.refs[name] = TensorRef(meta, functools.partial(_stack, *args, meta),
                                 functools.partial(_stack_into, *args))
    names = tuple(block.experts[e][(r, param)].name for e in range(count) for r in roles)
    axes = "" if bias else ", [E, out, in]" if orientation == "out_in" else ", [E, in, out]"
    block.found.virtual[name] = (names, (
        f"stacked from {count} experts' {' and '.join(ROLES[r][0] for r in roles)} "
        f"{param}s ({convention.name} order{', interleaved' if interleaved else ''}{axes})"))
    block.infos[name] = TensorInfo(name, shape, meta.dtype)


def _unstack_block(block: str, stacked: dict[tuple[str, str], TensorInfo],
                   experts: dict[int, dict[tuple[str, str], TensorInfo]],
                   refs: dict[str, TensorRef], found: ExpertTensors,
                   infos: dict[str, TensorInfo]) -> None:
    sample = {key: info for parts in experts.values() for key, info in parts.items()}
    convention = _convention({leaf + _suffix(param) for leaf, param in stacked},
                             _block_orientation(stacked, sample))
    own = {key: info.name.split(".")[-2] for parts in experts.values()
           for key, info in parts.items()}  # the model's own name for each role
    making = _Block(block, experts, refs, found, infos)
    for (leaf, param), info in stacked.items():
        if all((r, param) in own for r in STACKED[leaf]):
            _unstack_leaf(making, (leaf, param), info, convention, own)


def _unstack_leaf(block: _Block, key: tuple[str, str], info: TensorInfo,
                  convention: Convention, own: dict[tuple[str, str], str]) -> None:
    """Each expert's parts of one stacked tensor of the source."""
    leaf, param = key
    roles = STACKED[leaf]
    bias = param == "bias"
    count = info.shape[0]
    experts = block.experts
    if set(experts) != set(range(count)):
        why = (f"Cannot unstack '{info.name}' ({count} experts) into the model's "
               f"{len(experts)} experts of '{block.name}'; no expert of this layer was loaded")
        block.found.problems.update({i.name: why for parts in experts.values()
                                     for (r, p), i in parts.items() if r in roles and p == param})
        block.found.unused[info.name] = why
        return
    part = next(parts[(roles[0], param)].shape for parts in experts.values()
                if (roles[0], param) in parts)
    orientation: Orientation | None = "out_in" if bias else _orientation(
        info.shape, part, len(roles), convention)
    if orientation is None or (bias and info.shape[1:] != (part[0] * len(roles),)):
        return
    interleaved = convention.interleaved and len(roles) > 1
    meta = TensorMeta.of(part, info.dtype)
    for e in range(count):
        for k, role in enumerate(roles):
            name = f"{block.name}.{e}.{own[(role, param)]}.{param}"
            rows = _rows(k, len(roles), part[0], interleaved)
            block.refs[name] = TensorRef(meta, functools.partial(
                _unstack, block.refs[info.name], e, rows, orientation, bias))
            block.found.virtual[name] = ((info.name,), f"unstacked from {info.name} "
                                                       f"(expert {e}, {ROLES[role][0]})")
            block.infos[name] = TensorInfo(name, meta.shape, meta.dtype, "linear")


#: How the Hub names each expert's projections, by layout name (``tg.save(experts=...)``).
HUB_NAMES: dict[str, dict[str, str]] = {
    "per-expert": {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"},
    "mixtral": {"gate": "w1", "up": "w3", "down": "w2"},
}
#: Renames a Hub layout makes to the other keys (Mixtral's ``block_sparse_moe``).
HUB_RENAMES: dict[str, tuple[Rule, ...]] = {"mixtral": MIXTRAL_TO_MLP.exports}


def _told_by_bias(shape: tuple[int, ...], bias: TensorInfo | None) -> Orientation | None:
    """The orientation of a stacked weight that its bias's width tells, if it does."""
    if bias is None or len(shape) != 3 or (shape[1] == bias.shape[1]) == (shape[2] ==
                                                                          bias.shape[1]):
        return None
    return "out_in" if shape[1] == bias.shape[1] else "in_out"


def per_expert(refs: Mapping[str, TensorRef], layout: str) -> dict[str, TensorRef]:
    """Every stacked experts parameter as per-expert tensors, named as the Hub names them.

    This is what ``save_pretrained`` writes for transformers 5's fused MoE models, and what
    older transformers (and other loaders) read: ``experts.3.gate_proj.weight`` (or Mixtral's
    ``block_sparse_moe.experts.3.w1.weight``). Each expert is a lazy slice of the stacked
    tensor; nothing is copied until it is written.

    Args:
        refs: Key to lazy tensor (a model's, or a checkpoint's).
        layout: ``"per-expert"`` or ``"mixtral"`` (:data:`HUB_NAMES`).

    Returns:
        The same tensors, stacked ones replaced by their experts', in order.

    Raises:
        TorchgraftError: If the layout is unknown or a stacked tensor does not split evenly.
    """
    if layout not in HUB_NAMES:
        raise TorchgraftError(f"experts={layout!r}: use one of {', '.join(HUB_NAMES)}")
    names, renames = HUB_NAMES[layout], HUB_RENAMES.get(layout, ())
    side = Side({n: TensorInfo(n, r.meta.shape, r.meta.dtype) for n, r in refs.items()})
    blocks = _stacked(side)
    stacked = {info.name: (block, key) for block, parts in blocks.items()
               for key, info in parts.items()}
    out: dict[str, TensorRef] = {}
    for name, ref in refs.items():
        if name not in stacked:
            out[rename(name, renames)[0] or name] = ref
            continue
        block, (leaf, param) = stacked[name]
        roles, bias, shape = STACKED[leaf], param == "bias", ref.meta.shape
        told = _told_by_bias(shape, blocks[block].get((leaf, "bias")))
        convention = _convention({leaf + _suffix(p) for leaf, p in blocks[block]}, told)
        orientation: Orientation = "out_in" if bias else told or convention.orientation
        width = shape[1] if bias or orientation == "out_in" else shape[2]
        if width % len(roles):
            raise TorchgraftError(f"Cannot unstack '{name}' {shape}: its {width} rows do not "
                                  f"split into {' and '.join(roles)}")
        rows = width // len(roles)
        part = (rows,) if bias else (rows, shape[2] if orientation == "out_in" else shape[1])
        meta = TensorMeta.of(part, ref.meta.dtype)
        interleaved = convention.interleaved and len(roles) > 1
        for e in range(shape[0]):
            for k, role in enumerate(roles):
                key = rename(f"{block}.{e}.{names[role]}.{param}", renames)[0] or name
                out[key] = TensorRef(meta, functools.partial(
                    _unstack, ref, e, _rows(k, len(roles), rows, interleaved), orientation,
                    bias))
    return out
