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
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptCheckpointError, UnsupportedCheckpointError
from ..meta import TensorMeta, TensorRef
from ..safe_pickle import PickledObject
from .base import Contents, Format, ReadOptions
from .contain import contained
from .registry import open_contents

__all__ = ["FORMAT"]

_MODEL = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(?:\w+_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
#: A ``latest`` file names a tag: a short folder name.
_TAG = re.compile(r"^[\w.\-]{1,200}$")
#: More ranks than this is not a checkpoint this reader merges.
MAX_RANKS = 4096


def _tag_folder(path: Path, *, follow_links: bool = False) -> Path | None:
    """The folder holding the rank files: ``path`` itself, or the tag ``latest`` names.

    ``latest`` and the tag folder must lie inside ``path`` (a link out is refused).
    """
    if any(_MODEL.match(p.name) for p in path.iterdir() if p.is_file()):
        return path
    latest = path / "latest"
    if latest.is_file():
        contained(path, latest.name, named_by=path, what="'latest' file",
                  follow_links=follow_links)
        if latest.stat().st_size > 256:
            return None
        tag = latest.read_text(errors="replace").strip()
        if _TAG.match(tag) and tag not in (".", "..") and (path / tag).is_dir():
            return contained(path, tag, named_by=latest, what="tag folder",
                             follow_links=follow_links)
    return None


def _claims(path: Path) -> bool:
    try:
        return _tag_folder(path, follow_links=True) is not None
    except OSError:
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
        raise CorruptCheckpointError(f"unknown ZeRO stage {value!r:.40}")
    return value


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, PickledObject) and value.called and len(value.args) == 1:
        value = value.args[0]  # torch.Size as pickled by an old torch
    if not isinstance(value, (tuple, list)) or len(value) > 64 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise CorruptCheckpointError(f"parameter '{name}' has a malformed shape")
    return tuple(value)


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
    # fp32, as promised: a partition saved as another dtype (int64, bool, bf16) is cast
    return TensorRef(TensorMeta.of(shape, torch.float32, device),
                     lambda: read().view(shape).to(torch.float32), alias_key=("deepspeed", key))


def _merge_zero12(shapes: list[dict[str, tuple[int, ...]]], groups: list[list[TensorRef]],
                  paddings: Any, device: str) -> dict[str, TensorRef]:
    """Stages 1 and 2: each group's vector is the ranks' slices end to end."""
    ranks = len(groups)
    out: dict[str, TensorRef] = {}
    for index, params in enumerate(shapes):
        parts = [groups[r][index] for r in range(ranks)]
        available = sum(p.meta.numel for p in parts)
        pads = paddings[index] if isinstance(paddings, list) and index < len(paddings) else None
        offset = 0
        for k, (name, shape) in enumerate(params.items()):
            numel = math.prod(shape)

            def read(parts: list[TensorRef] = parts, start: int = offset,
                     count: int = numel) -> torch.Tensor:
                return _flat(parts, start, count)

            out[name] = _ref(shape, device, read, (index, offset))
            offset += numel + (int(pads[k]) if isinstance(pads, list) and k < len(pads) else 0)
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
    shapes = states[0].get("frozen_param_shapes") or {}
    out: dict[str, TensorRef] = {}
    for name, raw in shapes.items():
        shape = _shape(raw, str(name))
        fragments = [(s.get("frozen_param_fragments") or {}).get(name) for s in states]
        if not all(isinstance(f, TensorRef) for f in fragments):
            raise CorruptCheckpointError(f"frozen parameter '{name}' has no saved fragment")
        parts = fragments if stage == 3 else fragments[:1]

        def read(parts: list[Any] = parts, numel: int = math.prod(shape)) -> torch.Tensor:
            return _flat(parts, 0, numel).float()

        out[str(name)] = _ref(shape, device, read, ("frozen", name))
    return out


def _buffers(state: dict[str, Any]) -> dict[str, TensorRef]:
    module = state.get("module") or {}
    out = {}
    for name in state.get("buffer_names") or []:
        ref = module.get(name)
        if isinstance(ref, TensorRef):
            if ref.meta.dtype.is_floating_point and ref.meta.dtype != torch.float32:
                ref = _ref(ref.meta.shape, ref.meta.device, functools.partial(_float, ref),
                           ("buffer", name))
            out[str(name)] = ref
    return out


def _float(ref: TensorRef) -> torch.Tensor:
    return ref.read().float()


def _merge(states: list[dict[str, Any]], optims: list[dict[str, Any]]) -> dict[str, TensorRef]:
    stage = _zero_stage(optims[0].get("zero_stage"))
    count = optims[0].get("partition_count")
    count = max(count) if isinstance(count, list) and count else count
    if count != len(optims):
        raise CorruptCheckpointError(f"the optimizer says {count} ranks, the folder has "
                                     f"{len(optims)} rank files")
    key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
    groups = [o.get(key) for o in optims]
    if not all(isinstance(g, list) and g and all(isinstance(t, TensorRef) for t in g)
               for g in groups) or len({len(g) for g in groups}) != 1:  # type: ignore[arg-type]
        raise CorruptCheckpointError(f"the optimizer files lack their fp32 partitions ({key})")
    raw_shapes = states[0].get("param_shapes")
    if not isinstance(raw_shapes, list) or not all(isinstance(d, dict) for d in raw_shapes):
        raise CorruptCheckpointError("the model states lack param_shapes")
    shapes = [{str(n): _shape(s, str(n)) for n, s in d.items()} for d in raw_shapes]
    device = groups[0][0].meta.device  # type: ignore[index]
    weights = _buffers(states[0])
    weights.update(_frozen(states, stage, device))
    if stage <= 2:
        if len(shapes) != len(groups[0]):  # type: ignore[arg-type]
            raise CorruptCheckpointError("parameter groups and partitions do not match")
        weights.update(_merge_zero12(shapes, groups,  # type: ignore[arg-type]
                                     optims[0].get("param_alignment_paddings"), device))
    else:
        weights.update(_merge_zero3(shapes, groups, device))  # type: ignore[arg-type]
    for name, owner in (states[0].get("shared_params") or {}).items():
        if owner in weights:
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
