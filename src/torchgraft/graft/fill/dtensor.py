"""Grafting into sharded models: parameters that are DTensors (FSDP2, tensor parallel).

Every rank plans on metadata alone, as for any model (a DTensor's shape is the whole
tensor's), so the plan is the same on every rank; the ranks check that it is before reading.
Each rank then fills only its local shard, in place, keeping the DTensor parameters and their
placements (``Shard``, FSDP2's ``_StridedShard``, ``Replicate``, on meshes of any dimension):

* a plain copy, a transpose or a fused/split tensor reads only the block of the source that
  the shard needs (:meth:`~torchgraft.meta.TensorRef.read_box`: byte ranges of the file);
* any other adaptation (rows, channels, rotary permutation) reads the whole source tensor,
  adapts it, and keeps the shard's block: one tensor at a time.

A model built on the meta device gets, for each DTensor it fills, a new DTensor of the same
mesh and placements whose local shard has real storage (as ``load_state_dict(assign=True)``
does; FSDP2 picks the new parameters up on its first forward). New values (re-initialised
heads, new rows) are drawn with a generator seeded by the key, so replicas agree.

A failure on one rank is reported on every rank: all raise, none hangs in a collective.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ...errors import TorchgraftError, UnsupportedModelError
from ...io.reads import READERS
from ...meta import TensorRef
from ..layouts import ops
from ..plan.adapt import Init, Op, Rows, Step, applied, fresh_values
from ..plan.steps import Plan, PlanStep
from ..sides.walk import ModelTensors

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["agree_on_ranks", "fill_sharded", "materialise_sharded", "sharded_targets"]

logger = logging.getLogger("torchgraft")

Block = tuple[tuple[int, ...], tuple[int, ...]]


def _transposed(block: Block) -> Block:
    start, size = block
    return start[::-1], size[::-1]


def _same(block: Block) -> Block:
    return block


def _source_block(op: Op) -> Callable[[Block], Block] | None:
    """For operations that commute with taking a block: the source block a target block needs.

    A transpose reads the transposed block; a virtual source's identity step the same block.
    """
    if isinstance(op, Step):
        if op.identity:
            return _same
        if isinstance(op.op, ops.Transpose) and {op.op.dim0, op.op.dim1} == {0, 1}:
            return _transposed
    return None


_PLAIN = (torch.Tensor, nn.Parameter)


def sharded_targets(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, DTensor]:
    """The model's DTensor tensors; refuse what no graft can fill.

    Args:
        model: The unwrapped target.
        state: Its state-dict tensors.

    Returns:
        Key to DTensor, in state order; empty for a model without DTensors.

    Raises:
        UnsupportedModelError: If a tensor is another tensor subclass, or a DTensor is placed
            in a way that has no block of the whole tensor per rank (``Partial``).
    """
    subclassed = {k: t for k, t in state.items()  # the type first: detach() costs a tensor
                  if type(t) not in _PLAIN and type(t.detach()) is not torch.Tensor}
    if not subclassed:
        return {}
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    name = type(model).__name__
    found: dict[str, DTensor] = {}
    for key, tensor in subclassed.items():
        if not isinstance(tensor, DTensor):
            raise UnsupportedModelError(
                f"Cannot graft into {name}: '{key}' is a {type(tensor.detach()).__name__}, a "
                "tensor subclass torchgraft cannot fill (it fills plain tensors and DTensors). "
                "Graft into the model before converting its parameters.")
        for placement in tensor.placements:
            if not isinstance(placement, (Shard, _StridedShard, Replicate)):
                kind = type(placement).__name__
                raise UnsupportedModelError(
                    f"Cannot graft into {name}: '{key}' is a DTensor placed {kind} on its "
                    "mesh, which holds no block of the whole tensor that a rank could fill. "
                    "Use Shard or Replicate placements for parameters.")
        if type(tensor._local_tensor) is not torch.Tensor:
            raise UnsupportedModelError(
                f"Cannot graft into {name}: the local shard of '{key}' is a "
                f"{type(tensor._local_tensor).__name__}, a tensor subclass torchgraft cannot "
                "fill.")
        found[key] = tensor
    return found


def _block(tensor: DTensor) -> Block:
    """This rank's block of the whole tensor: (first index, size) in each dimension."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    size, start = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                        tensor.placements)
    return tuple(start), tuple(size)


def _local(key: str, tensor: DTensor) -> tuple[tuple[int, ...], torch.Tensor]:
    """This rank's first index and its local shard (the parameter's own storage)."""
    start, size = _block(tensor)
    local = tensor._local_tensor
    if tuple(local.shape) != size:
        raise UnsupportedModelError(f"'{key}': the local shard is {tuple(local.shape)} but its "
                                    f"placements {tensor.placements} give {size}")
    return start, local


def _local_device(tensor: DTensor, device: torch.device | None) -> torch.device:
    if device is not None:
        return device
    kind = tensor.device_mesh.device_type
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def materialise_sharded(model: nn.Module, sharded: dict[str, DTensor], keys: Iterable[str],
                        device: torch.device | None) -> None:
    """Give the meta DTensors among ``keys`` local shards with real (uninitialised) storage.

    Each becomes a new DTensor (a Parameter where it was one) on the same mesh with the same
    placements, installed in every module holding it, and in ``sharded``.

    Args:
        model: The unwrapped target.
        sharded: Key to DTensor (updated).
        keys: The keys the graft fills.
        device: Where the shards go; by default the mesh's device.
    """
    from torch.distributed.tensor import DTensor

    owners = ModelTensors(model.named_modules()).holders
    for key in keys:
        old = sharded.get(key)
        if old is None or not old.is_meta:
            continue
        _, size = _block(old)
        local = torch.empty(size, dtype=old.dtype, device=_local_device(old, device))
        with torch.no_grad():
            new = DTensor.from_local(local, old.device_mesh, old.placements, run_check=False,
                                     shape=old.shape, stride=old.stride())
        if isinstance(old, nn.Parameter):  # a DTensor marked as a parameter, still a DTensor
            new = cast("DTensor", nn.Parameter(new, requires_grad=old.requires_grad))
        for store, name in owners.get(id(old), ()):
            store[name] = new
        for other, value in sharded.items():
            if value is old:
                sharded[other] = new


@contextlib.contextmanager
def _seeded(key: str) -> Iterator[None]:
    """Random draws that are the same on every rank (replicas agree), seeded by the key."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(key.encode()))
        yield


def _whole(tensor: DTensor, needs_values: bool) -> torch.Tensor:
    """The target's value where an adaptation keeps some of it (a collective), else zeros."""
    if needs_values and not tensor.is_meta:
        return tensor.full_tensor().cpu()
    return torch.zeros(tensor.shape, dtype=tensor.dtype)


def _keeps(ops: tuple[Op, ...], init: Init) -> bool:
    return init == "keep" and any(isinstance(op, Rows) for op in ops)


def _cut(tensor: torch.Tensor, start: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
    for dim, (first, length) in enumerate(zip(start, size, strict=True)):
        tensor = tensor.narrow(dim, first, length)
    return tensor


def _sliceable(step: PlanStep) -> bool:
    return all(_source_block(op) is not None for op in step.ops)


def _fill(step: PlanStep, ref: TensorRef, start: tuple[int, ...], local: torch.Tensor,
          whole: torch.Tensor | None) -> None:
    size = tuple(local.shape)
    if not step.ops:
        ref.read_box(start, local)
    elif whole is None:  # slice-aware: only the source block this shard needs
        block: Block = (start, size)
        for op in reversed(step.ops):
            block = cast(Callable[[Block], Block], _source_block(op))(block)
        part = torch.empty(block[1], dtype=ref.meta.dtype)
        ref.read_box(block[0], part)
        for op in step.ops:
            part = applied(op, part, part)
        local.copy_(part)
    else:
        tensor = _read_whole(ref)
        with _seeded(step.target):
            for op in step.ops:
                tensor = applied(op, tensor, whole)
        local.copy_(_cut(tensor, start, size))


def _read_whole(ref: TensorRef) -> torch.Tensor:
    """The whole source tensor in memory of its own, read rather than mapped.

    Freed once adapted: a rank's memory never keeps the pages of every tensor it adapted (a
    mapping keeps them resident until the file is closed).
    """
    tensor = torch.empty(ref.meta.shape, dtype=ref.meta.dtype)
    ref.read_into(tensor)
    return tensor


def _read_plain(step: PlanStep, ref: TensorRef, tensor: DTensor) -> None:
    with torch.no_grad():  # grad mode is per thread
        start, local = _local(step.target, tensor)
        ref.read_box(start, local)


def _digest(plan: Plan) -> str:
    text = repr(([(s.target, s.source, s.describe()) for s in plan.steps],
                 sorted(plan.missing), sorted(plan.unused), sorted(plan.reinitialised)))
    return hashlib.sha256(text.encode()).hexdigest()


def _gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def fill_sharded(plan: Plan, refs: dict[str, TensorRef], sharded: dict[str, DTensor]) -> None:
    """Fill each rank's shard of the DTensor targets of ``plan``, in place.

    Collective: every rank of the default process group calls it, with the same plan.

    Args:
        plan: The plan (the same on every rank).
        refs: Source key to lazy tensor.
        sharded: Target key to DTensor (with real local storage).

    Raises:
        TorchgraftError: On every rank, if the ranks' plans differ or any rank failed to fill
            its shards (the failing rank raises its own error, the others name it).
    """
    _same_plans(plan)
    failure: BaseException | None = None
    plain = [s for s in plan.steps if s.target in sharded and not s.ops]
    with torch.no_grad(), ThreadPoolExecutor(READERS) as pool:
        # plain copies read in a few threads (reads release the GIL), the rest in order
        reads = [pool.submit(_read_plain, s, refs[s.source], sharded[s.target]) for s in plain]
        failure = _fill_adapted(plan, refs, sharded)
        if plan.init != "keep" and failure is None:
            _reinitialise(plan, sharded)
        for read in reads:
            if failure is None and read.exception() is not None:
                failure = read.exception()
    _raise_on_every_rank(failure)


def _same_plans(plan: Plan) -> None:
    """Refuse plans that differ between ranks (collective)."""
    digests = _gather(_digest(plan))
    if len(set(digests)) > 1:
        raise TorchgraftError(
            "the ranks planned different grafts (the checkpoint or the model differs between "
            f"ranks: plan digests {sorted(set(d[:12] for d in digests))}); every rank must "
            "graft the same checkpoint into the same model")


def _fill_adapted(plan: Plan, refs: dict[str, TensorRef],
                  sharded: dict[str, DTensor]) -> BaseException | None:
    """Fill the shards of steps with operations, in order; the first failure, if any.

    Gathering a whole target is a collective: every rank does it, even after a failure.
    """
    failure: BaseException | None = None
    for step in plan.steps:
        tensor = sharded.get(step.target)
        if tensor is None or not step.ops:
            continue
        # the whole target, for adaptations that need it: a collective, before any raise
        whole = None if _sliceable(step) else _whole(tensor, _keeps(step.ops, plan.init))
        if failure is None:
            try:
                start, local = _local(step.target, tensor)
                _fill(step, refs[step.source], start, local, whole)
                logger.debug("filled the shard of %s at %s from %s", step.target, start,
                             step.source)
            except Exception as exc:  # re-raised once every rank knows
                failure = exc
    return failure


def _reinitialise(plan: Plan, sharded: dict[str, DTensor]) -> None:
    """Fresh values for the shards of re-initialised targets, the same whatever the mesh."""
    for key in plan.reinitialised:
        if key in sharded:
            start, local = _local(key, sharded[key])
            with _seeded(key):
                fresh = fresh_values(torch.zeros(sharded[key].shape, dtype=local.dtype),
                                     plan.init)
            local.copy_(_cut(fresh, start, tuple(local.shape)))


def agree_on_ranks(reasons: dict[str, str]) -> dict[str, str]:
    """Every rank's keys with a reason, on every rank (collective): the reports stay equal.

    Args:
        reasons: This rank's keys and why (writes not confirmed).

    Returns:
        The union over the ranks, a key's reason from the first rank that gave one.
    """
    merged: dict[str, str] = {}
    for rank, found in enumerate(_gather(reasons)):
        for key, why in found.items():
            merged.setdefault(key, f"{why} (on rank {rank})")
    return merged


def _raise_on_every_rank(failure: BaseException | None) -> None:
    """Raise on every rank when any failed: its own error, or one naming the failed rank."""
    import torch.distributed as dist

    failures = _gather(None if failure is None else str(failure))
    if failure is not None:
        raise failure
    failed = [(rank, text) for rank, text in enumerate(failures) if text is not None]
    if failed:
        rank, text = failed[0]
        raise TorchgraftError(f"rank {rank} of {dist.get_world_size()} could not fill its "
                              f"shards: {text}")
