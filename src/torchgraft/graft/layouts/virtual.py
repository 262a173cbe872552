"""Virtual source tensors: made from stored ones by one operation, read only when asked."""

from __future__ import annotations

from dataclasses import dataclass

from ..evidence import Guess
from .ops import TensorOp

__all__ = ["Virtual"]


@dataclass(frozen=True)
class Virtual:
    """A source tensor made from others.

    Attributes:
        name: Its key, e.g. ``attention.{query,key,value}.weight``.
        parts: The source keys it is made from.
        why: For the report, e.g. ``fused from query, key, value``.
        doubt: Why its layout is a guess (the head count came from the model alone), if so.
        op: The operation that makes it from its parts (:mod:`~torchgraft.graft.layouts.ops`).
        index: Which of the operation's outputs it is.
        alternatives: What else it could be, when its layout is a guess.
    """

    name: str
    parts: tuple[str, ...]
    why: str
    doubt: str | None = None
    op: TensorOp | None = None
    index: int = 0
    alternatives: tuple[str, ...] = ()

    def guess(self) -> Guess | None:
        """The guess a key it fills is, when its layout is one."""
        if self.doubt is None:
            return None
        return Guess(self.alternatives or (f"{self.name} read with another head count",),
                     self.doubt)
