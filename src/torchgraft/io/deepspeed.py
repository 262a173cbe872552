"""DeepSpeed checkpoint folders: ZeRO stage 1, 2 and 3 partitions merged into full fp32 weights.

``engine.save_checkpoint(dir, tag)`` writes ``dir/latest`` (the newest tag) and ``dir/<tag>/``
holding ``mp_rank_00_model_states.pt`` (stages 1 and 2; stage 3 writes one
``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per rank) and one
``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per data-parallel rank. The model states
hold the module as trained (fp16/bf16, or empty under stage 3) and the parameter shapes; the
fp32 master weights are split across the ranks' optimizer files:

* stages 1 and 2: each rank holds one slice of every parameter group's flat, padded vector;
  the parameters lie in that vector in order (``param_shapes``), with alignment padding;
* stage 3: every parameter is split on its own into ``ceil(numel / ranks)`` elements per rank.

This is what deepspeed's ``zero_to_fp32`` reconstructs; it is done here without deepspeed, each
weight read lazily from the memory-mapped partitions, so one weight at a time is in memory.
Opening gives ``{"state_dict": fp32 weights, "module": the module as saved, ...}``: the
module is a second weight set (``weights_key="module"``). Buffers come from the module, cast
to fp32 as ``zero_to_fp32`` does; frozen parameters from their saved fragments; shared
parameters are aliases. A tag folder, or its parent with ``latest``, opens; a lone
``mp_rank_00_model_states.pt`` is a torch file (its ``module``).

What the files claim is checked against each other and against the bytes before anything is
read (:func:`_claims_checked`): the number of ranks, the partitions' dtype (fp32, as
DeepSpeed keeps master weights), the paddings, and every parameter's shape against the
elements its partitions or fragments hold.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..bounds import MAX_RANKS, check_shape
from ..errors import CorruptCheckpointError, TorchgraftError, UnsupportedCheckpointError, shown
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import PickledObject
from .base import Contents, Format, ReadOptions
from .contain import contained, read_contained
from .registry import open_contents

__all__ = ["FORMAT"]

_MODEL = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(?:\w+_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
#: A ``latest`` file names a tag: a short folder name.
_TAG = re.compile(r"^[\w.\-]{1,200}$")
_MAX_LATEST = 256


def _tag_folder(path: Path, *, follow_links: bool = False) -> Path | None:
    """The folder holding the rank files: ``path`` itself, or the tag ``latest`` names.

    ``latest`` and the tag folder must lie inside ``path`` (a link out is refused).
    """
    if any(_MODEL.match(p.name) for p in path.iterdir() if p.is_file()):
        return path
    if not (path / "latest").is_file():
        return None
    latest = read_contained(path, "latest", named_by=path, what="'latest' file",
                            limit=_MAX_LATEST, follow_links=follow_links)
    tag = latest.decode("utf-8", "replace").strip()
    if _TAG.match(tag) and tag not in (".", "..") and (path / tag).is_dir():
        return contained(path, tag, named_by=path / "latest", what="tag folder",
                         follow_links=follow_links)
    return None


def _claims(path: Path) -> bool:
    try:
        return _tag_folder(path, follow_links=True) is not None
    except (OSError, TorchgraftError):
        return False


def _ranked(folder: Path, pattern: re.Pattern[str], follow_links: bool) -> list[Path]:
    found: dict[int, Path] = {}
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match is None:
            continue
        path = contained(folder, path.name, named_by=folder, what="rank file",
                         follow_links=follow_links)
        if int(match[2]) != 0:
            raise UnsupportedCheckpointError(
                "a tensor-parallel DeepSpeed checkpoint (mp_rank_01...): merge it with "
                "deepspeed's own tools", path=folder)
        rank = int(match[1] or 0)
        if rank in found or rank >= MAX_RANKS:
            raise CorruptCheckpointError(f"rank {rank} appears twice or is out of range",
                                         path=folder)
        found[rank] = path
    if sorted(found) != list(range(len(found))):
        raise CorruptCheckpointError(f"rank files are missing: found ranks {sorted(found)}",
                                     path=folder)
    return [found[r] for r in sorted(found)]


def _zero_stage(value: Any) -> int:
    """The stage: an int, or deepspeed's ``ZeroStageEnum(2)`` recorded, not run."""
    if isinstance(value, PickledObject) and value.called and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, bool) or not isinstance(value, int) or value not in (1, 2, 3):
        raise CorruptCheckpointError(f"unknown ZeRO stage {shown(value, 40)}")
    return value


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, PickledObject) and value.called and len(value.args) == 1:
        value = value.args[0]  # torch.Size as pickled by an old torch
    return check_shape(value, what=f"parameter '{name}'")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(state: dict[str, Any], key: str) -> dict[Any, Any]:
    """A record that must be a mapping when present (``frozen_param_fragments``...)."""
    value = state.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CorruptCheckpointError(f"the model states' {key} is {type(value).__name__}, not "
                                     "a mapping")
    return value


def _flat(parts: Sequence[TensorRef], start: int, count: int) -> torch.Tensor:
    """Elements ``[start, start + count)`` of the concatenation of ``parts``, read lazily."""
    pieces = []
    offset = 0
    for part in parts:
        size = part.meta.numel
        lo, hi = max(start, offset), min(start + count, offset + size)
        if lo < hi:
            pieces.append(part.read().reshape(-1)[lo - offset:hi - offset])
        offset += size
    return torch.cat(pieces) if len(pieces) != 1 else pieces[0].clone()


def _ref(shape: tuple[int, ...], device: str, read: Callable[[], torch.Tensor],
         key: object) -> TensorRef:
    """An fp32 weight; ``read`` gives its elements in fp32 (checked or cast before)."""
    return TensorRef(TensorMeta.of(shape, torch.float32, device), lambda: read().view(shape),
                     alias_key=("deepspeed", key))


def _merge_zero12(shapes: list[dict[str, tuple[int, ...]]], groups: list[list[TensorRef]],
                  paddings: list[list[int]], device: str) -> dict[str, TensorRef]:
    """Stages 1 and 2: each group's vector is the ranks' slices end to end."""
    ranks = len(groups)
    out: dict[str, TensorRef] = {}
    for index, params in enumerate(shapes):
        parts = [groups[r][index] for r in range(ranks)]
        available = sum(p.meta.numel for p in parts)
        pads = paddings[index] if index < len(paddings) else []
        offset = 0
        for k, (name, shape) in enumerate(params.items()):
            numel = math.prod(shape)

            def read(parts: list[TensorRef] = parts, start: int = offset,
                     count: int = numel) -> torch.Tensor:
                return _flat(parts, start, count)

            out[name] = _ref(shape, device, read, (index, offset))
            offset += numel + (pads[k] if k < len(pads) else 0)
        aligned = 2 * ranks * math.ceil(offset / (2 * ranks))
        if offset > available or aligned != 2 * ranks * math.ceil(available / (2 * ranks)):
            raise CorruptCheckpointError(
                f"parameter group {index} needs {offset} elements, its {ranks} partitions "
                f"hold {available}: a rank file is missing or from another run")
    return out


def _merge_zero3(shapes: list[dict[str, tuple[int, ...]]], groups: list[list[TensorRef]],
                 device: str) -> dict[str, TensorRef]:
    """Stage 3: every parameter is split on its own, ``ceil(numel / ranks)`` per rank."""
    ranks = len(groups)
    available = sum(p.meta.numel for p in groups[0])
    out: dict[str, TensorRef] = {}
    offset = 0
    for name, shape in ((n, s) for params in shapes for n, s in params.items()):
        numel = math.prod(shape)
        share = math.ceil(numel / ranks)

        def read(start: int = offset, share: int = share, numel: int = numel) -> torch.Tensor:
            return torch.cat([_flat(groups[r], start, share) for r in range(ranks)])[:numel]

        out[name] = _ref(shape, device, read, offset)
        offset += share
    if offset != available or any(sum(p.meta.numel for p in g) != available for g in groups):
        raise CorruptCheckpointError(
            f"the parameters need {offset} elements per rank, the partitions hold "
            f"{available}: a rank file is missing or from another run")
    return out


def _frozen(states: list[dict[str, Any]], stage: int, device: str) -> dict[str, TensorRef]:
    """Frozen parameters, each from its saved fragments, checked against its shape.

    A fragment is the whole tensor (stages 1 and 2) or ``ceil(numel / ranks)`` elements per
    rank (stage 3), in a floating dtype.
    """
    shapes = _mapping(states[0], "frozen_param_shapes")
    ranks = len(states)
    out: dict[str, TensorRef] = {}
    for name, raw in shapes.items():
        shape = _shape(raw, str(name))
        numel = math.prod(shape)
        fragments = [_mapping(s, "frozen_param_fragments").get(name) for s in states]
        parts = [f for f in (fragments if stage == 3 else fragments[:1])
                 if isinstance(f, TensorRef)]
        share = math.ceil(numel / ranks) if stage == 3 else numel
        if len(parts) != (ranks if stage == 3 else 1):
            raise CorruptCheckpointError(f"frozen parameter '{name}' has no saved fragment")
        for part in parts:
            if part.meta.numel != share or not part.meta.dtype.is_floating_point:
                raise CorruptCheckpointError(
                    f"frozen parameter '{name}' of shape {shape} needs {share} floating-point "
                    f"elements per fragment; a fragment holds {part.meta.numel} of "
                    f"{part.meta.dtype}: the model states lie about its shape or are of "
                    "another run")

        def read(parts: list[TensorRef] = parts, numel: int = numel) -> torch.Tensor:
            return _flat(parts, 0, numel).float()

        out[str(name)] = _ref(shape, device, read, ("frozen", name))
    return out


def _buffers(state: dict[str, Any]) -> dict[str, TensorRef]:
    module = _mapping(state, "module")
    names = state.get("buffer_names") or []
    if not isinstance(names, list):
        raise CorruptCheckpointError("the model states' buffer_names is not a list")
    out = {}
    for name in names:
        ref = module.get(name) if isinstance(name, str) else None
        if isinstance(ref, TensorRef):
            if ref.meta.dtype.is_floating_point and ref.meta.dtype != torch.float32:
                ref = _ref(ref.meta.shape, ref.meta.device, functools.partial(_float, ref),
                           ("buffer", name))
            out[name] = ref
    return out


def _float(ref: TensorRef) -> torch.Tensor:
    return ref.read().float()


def _rank_count(value: Any, files: int) -> None:
    """``partition_count``: the ranks, one number or one per parameter group (stages 1, 2)."""
    counts = value if isinstance(value, list) else [value]
    if not counts or not all(_integer(c) for c in counts):
        raise CorruptCheckpointError(f"the optimizer's partition_count is {shown(value, 60)}, "
                                     "not a number of ranks")
    if max(counts) != files:
        raise CorruptCheckpointError(f"the optimizer says {max(counts)} ranks, the folder has "
                                     f"{files} rank files")


def _partitions(optims: list[dict[str, Any]], key: str) -> list[list[TensorRef]]:
    """Each rank's fp32 partitions, one per parameter group; fp32 is what they must hold."""
    checked: list[list[TensorRef]] = []
    for group in (o.get(key) for o in optims):
        if not isinstance(group, list) or not group or not all(
                isinstance(t, TensorRef) for t in group) or len(group) != len(
                    checked[0] if checked else group):
            raise CorruptCheckpointError(f"the optimizer files lack their fp32 partitions ({key})")
        checked.append(group)
    for rank, group in enumerate(checked):
        for index, part in enumerate(group):
            if part.meta.dtype != torch.float32:
                raise CorruptCheckpointError(
                    f"rank {rank}'s {key}[{index}] is stored as {part.meta.dtype}, where "
                    "DeepSpeed keeps its fp32 master weights: the file lies about their dtype")
    return checked


def _paddings(value: Any, groups: int) -> list[list[int]]:
    """``param_alignment_paddings``: per group, per parameter, elements of padding."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > groups or not all(
            isinstance(p, list) and all(_integer(n) and n >= 0 for n in p) for p in value):
        raise CorruptCheckpointError(f"param_alignment_paddings is {shown(value, 60)}, not "
                                     "lists of element counts, one per parameter group")
    return value


def _claims_checked(states: list[dict[str, Any]], optims: list[dict[str, Any]]
                    ) -> tuple[int, list[dict[str, tuple[int, ...]]], list[list[TensorRef]]]:
    """What the rank files claim, checked against each other.

    Returns:
        The stage, the parameters' shapes per group, each rank's fp32 partitions.
    """
    stage = _zero_stage(optims[0].get("zero_stage"))
    _rank_count(optims[0].get("partition_count"), len(optims))
    groups = _partitions(optims, "single_partition_of_fp32_groups" if stage <= 2
                         else "fp32_flat_groups")
    raw_shapes = states[0].get("param_shapes")
    if not isinstance(raw_shapes, list) or not all(isinstance(d, dict) for d in raw_shapes):
        raise CorruptCheckpointError("the model states lack param_shapes")
    shapes = [{str(n): _shape(s, str(n)) for n, s in d.items()} for d in raw_shapes]
    if stage <= 2 and len(shapes) != len(groups[0]):
        raise CorruptCheckpointError("parameter groups and partitions do not match")
    return stage, shapes, groups


def _merge(states: list[dict[str, Any]], optims: list[dict[str, Any]]) -> dict[str, TensorRef]:
    stage, shapes, groups = _claims_checked(states, optims)
    device = groups[0][0].meta.device
    weights = _buffers(states[0])
    weights.update(_frozen(states, stage, device))
    if stage <= 2:
        paddings = _paddings(optims[0].get("param_alignment_paddings"), len(shapes))
        weights.update(_merge_zero12(shapes, groups, paddings, device))
    else:
        weights.update(_merge_zero3(shapes, groups, device))
    for name, owner in _mapping(states[0], "shared_params").items():
        if isinstance(owner, str) and owner in weights:
            weights[str(name)] = weights[owner]
    return weights


def _open(path: Path, options: ReadOptions) -> Contents:
    folder = _tag_folder(path, follow_links=options.follow_links)
    if folder is None:
        raise CorruptCheckpointError("not a DeepSpeed checkpoint folder", path=path)
    opened: list[Contents] = []
    try:
        states = []
        for file in _ranked(folder, _MODEL, options.follow_links):
            opened.append(open_contents(file, options.part()))
            states.append(opened[-1].root)
        optims = []
        for file in _ranked(folder, _OPTIM, options.follow_links):
            opened.append(open_contents(file, options.part()))
            optims.append(opened[-1].root)
        if not states or not all(isinstance(s, dict) for s in [*states, *optims]):
            raise CorruptCheckpointError("the rank files are not DeepSpeed states", path=folder)
        inner = [o.get("optimizer_state_dict") for o in optims]
        root: dict[str, Any] = {}
        if optims:
            if not all(isinstance(o, dict) for o in inner):
                raise CorruptCheckpointError("an optimizer file lacks its state", path=folder)
            root["state_dict"] = _merge(states, inner)
            stage = _zero_stage(inner[0].get("zero_stage"))
        else:
            stage = 0
        root.update({k: v for k, v in states[0].items() if k not in (
            "optimizer", "frozen_param_fragments", "param_shapes")})
        root["deepspeed"] = {"tag": folder.name, "zero_stage": stage, "ranks": len(optims),
                             "files": sorted(p.path.name for p in opened)}
    except BaseException:
        for contents in opened:
            contents.close()
        raise
    return Contents("deepspeed", path, root, [c.close for c in opened])


FORMAT = Format(name="deepspeed", open=_open, claims_directory=_claims)
