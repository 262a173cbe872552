"""Loading any checkpoint into a distributed (DTensor) state dict, each rank reading its part.

:class:`CheckpointReader` is a ``torch.distributed.checkpoint`` storage reader over any file
torchgraft opens. Every rank opens the file's metadata only; ``dcp.load`` then asks each rank
for the slices its shards hold, which are cut from the memory-mapped file, so a rank's reads
touch only its own part of the data.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from .checkpoint import open as open_checkpoint
from .errors import TorchgraftError

__all__ = ["CheckpointReader"]


class CheckpointReader(StorageReader):
    """A DCP storage reader for any checkpoint torchgraft opens.

    Example::

        state = {"model": sharded_model.state_dict()}       # DTensors on every rank
        dcp.load(state["model"], storage_reader=CheckpointReader("model.safetensors"))

    Args:
        path: A checkpoint file or directory in any format torchgraft reads.
        unsafe: Let the file's pickle call code outside the allow-list.
    """

    def __init__(self, path: str | os.PathLike[str], *, unsafe: bool = False) -> None:
        super().__init__()
        self.checkpoint = open_checkpoint(path, unsafe=unsafe)
        self.refs = self.checkpoint.tensor_refs()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Nothing to reset: the checkpoint was opened when the reader was made."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Describe every weight as one chunk covering the whole tensor."""
        entries: dict[str, Any] = {}
        storage: dict[MetadataIndex, str] = {}
        for name, ref in self.refs.items():
            shape = torch.Size(ref.meta.shape)
            origin = torch.Size([0] * len(shape))
            entries[name] = TensorStorageMetadata(
                TensorProperties(dtype=ref.meta.dtype), shape,
                [ChunkStorageMetadata(offsets=origin, sizes=shape)])
            storage[MetadataIndex(name, origin)] = name
        return Metadata(state_dict_metadata=entries, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Nothing to set up."""

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Use the planner's plan as it is."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Use the planners' plans as they are."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Copy the requested slice of each tensor into this rank's shard.

        Raises:
            TorchgraftError: If the plan asks for a non-tensor item.
        """
        for request in plan.items:
            if request.type == LoadItemType.BYTE_IO:
                raise TorchgraftError(f"'{request.storage_index.fqn}' is not a tensor: "
                                      "CheckpointReader loads weights only",
                                      path=self.checkpoint.path)
            source = self.refs[request.storage_index.fqn].read()
            for dim, (start, length) in enumerate(zip(request.storage_offsets, request.lengths,
                                                      strict=True)):
                source = source.narrow(dim, start, length)
            target = planner.resolve_tensor(request).detach()
            target.copy_(source)
            planner.commit_tensor(request, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Not chosen automatically: pass the reader to ``dcp.load`` explicitly."""
        return False
