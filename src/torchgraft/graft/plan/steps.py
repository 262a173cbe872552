"""What a plan is made of: its steps, the plan itself, and the keys that never fail a graft."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from ..evidence import Assumption, Evidence, Guess, MatchStep
from ..layouts.op_rules import Derivation
from ..tensors import TensorInfo
from .adapt import Init, Op

__all__ = ["BOOKKEEPING", "REINITIALISED", "Match", "Plan", "PlanStep", "SourceLayout",
           "is_bookkeeping"]

Match = Literal["auto", "name", "structure"]

# Buffers that count steps or hold constants: never a reason for a graft to fail.
BOOKKEEPING = (
    re.compile(r"(^|\.)num_batches_tracked$"),
    re.compile(r"(^|\.)position_ids$"),
    re.compile(r"(^|\.)attn\.(masked_)?bias$"),
)


#: How an unused source tensor whose target was re-initialised is described.
REINITIALISED = "was re-initialised instead: the shapes differ"


def is_bookkeeping(name: str) -> bool:
    """Whether a key is a bookkeeping buffer (``num_batches_tracked``...)."""
    return any(p.search(name) for p in BOOKKEEPING)


@dataclass(frozen=True)
class PlanStep:
    """One target tensor filled from one source tensor.

    Attributes:
        target: The target key.
        source: The source key.
        matched_by: The matching step: exact, rule, layout, wrapper, prefix or structure.
        ops: Adaptations applied in order; empty for a plain copy.
        cast: ``"float16->float32"`` when the dtypes differ, else ``""``.
        evidence: How the pairing is known: by name, by structure, or a guess.
    """

    target: str
    source: str
    matched_by: MatchStep
    ops: tuple[Op, ...] = ()
    cast: str = ""
    evidence: Evidence = Evidence.NAME

    def describe(self) -> str:
        """What was done to the tensor, for the report (empty for a plain copy)."""
        parts = [op.describe() for op in self.ops] + ([f"cast {self.cast}"] if self.cast else [])
        return "; ".join(parts)


@dataclass(frozen=True)
class SourceLayout:
    """The source as stored, and how the tensors a plan reads were made from it.

    Attributes:
        stored: The source's own keys, in stored order, with their shapes and dtypes.
        ties: Stored key to the first stored key holding the very same tensor.
        derivations: How each made tensor (a rule's, a fused or split projection's) was made,
            in the order they were.
    """

    stored: dict[str, TensorInfo]
    ties: dict[str, str] = field(default_factory=dict)
    derivations: tuple[Derivation, ...] = ()


@dataclass
class Plan:
    """Everything a graft will do, decided before any tensor byte is read.

    Attributes:
        steps: The tensors to fill, in the target's order.
        missing: Target keys left as they are, with the reason.
        unused: Source keys not used, with the reason.
        reinitialised: Target keys given fresh values (``init=``) instead of the checkpoint's,
            with the reason (a new classifier head).
        tied: Target key to the key it is tied to, filled through that key.
        warnings: What the plan could not be sure of.
        init: How re-initialised tensors are filled.
        guesses: Target keys filled by a guess, with their alternatives.
        surplus: Unused source keys of blocks the model lacks (a deeper checkpoint), with the
            reason: the model then computes something else than the checkpoint's.
        assumptions: Facts the graft relies on that the checkpoint cannot confirm (a bare
            state dict from another code base: the attention's head count, which same-shape
            sibling is which); each makes the verdict unverified until outputs are compared.
        apart: Source keys of tied targets that the checkpoint stores apart (unused), to the
            target key whose value they hold (the one the tie was filled through).
        layout: The source's stored layout, to run the plan backwards; ``None`` for a plan
            built without it (:func:`~torchgraft.graft.plan.build.plan_graft` sets it).
        inferred: Source tensors the planner made from stored ones (fused or split because
            their rows add up), in the order made; their lazy tensors are made with the plan.
        initialised: Target buffers the checkpoint lacks, kept as the model's own code computed
            them (rotary frequencies, position tables), with why: an assumption until outputs
            are compared.
        unmatched: Missing target keys that no checkpoint tensor could fill (none was a
            candidate): what the model's code computes alike under any seed is kept (fill).
    """

    steps: list[PlanStep] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    unused: dict[str, str] = field(default_factory=dict)
    reinitialised: dict[str, str] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    init: Init = "keep"
    guesses: dict[str, Guess] = field(default_factory=dict)
    surplus: dict[str, str] = field(default_factory=dict)
    assumptions: list[Assumption] = field(default_factory=list)
    apart: dict[str, str] = field(default_factory=dict)
    layout: SourceLayout | None = None
    inferred: list[Derivation] = field(default_factory=list)
    initialised: dict[str, str] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
