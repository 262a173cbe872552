"""The state planning's passes share, and what they ask of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...renames import Rule
from ..evidence import MatchStep
from ..layouts.layout import Layout
from ..sides.heads import Described
from ..tensors import Side, TensorInfo
from .steps import Match, Plan
from .transforms import Options

__all__ = ["PassState", "renamed_info"]


@dataclass
class PassState:
    """The state the passes share.

    Attributes:
        src: The source side.
        dst: The target side.
        plan: The plan being built.
        options: What the user allowed and what the target says.
        rules: The user's rules.
        match: Which matching steps run.
        ruled: Source keys made by the user's operation rules.
        renamed: Source key to its name after rules and layouts (dropped keys absent).
        how_renamed: Source key to the step its new name came from.
        pairs: Target key to source key.
        paired: The sources in ``pairs``, for lookups in constant time.
        how: Target key to the step that paired it.
        ambiguous: Target key to why structure could not decide it.
        described: What both sides state of their models (head counts, a module source).
        across: Source keys renamed by a layout between two code bases.
        by_convention: Target keys paired among same-shape siblings by conventions of code
            bases alone (numbers and roles in names, stored order): guesses for a file's
            source.
        inferred: Source tensors the passes made (fused or split by their rows), to how.
    """

    src: Side
    dst: Side
    plan: Plan
    options: Options
    rules: Sequence[Rule] = ()
    match: Match = "auto"
    ruled: frozenset[str] = frozenset()
    renamed: dict[str, str] = field(default_factory=dict)
    how_renamed: dict[str, MatchStep] = field(default_factory=dict)
    pairs: dict[str, str] = field(default_factory=dict)
    paired: set[str] = field(default_factory=set)
    how: dict[str, MatchStep] = field(default_factory=dict)
    ambiguous: dict[str, str] = field(default_factory=dict)
    described: Described = field(default_factory=Described)
    across: set[str] = field(default_factory=set)
    by_convention: set[str] = field(default_factory=set)
    inferred: dict[str, str] = field(default_factory=dict)

    @property
    def layouts(self) -> Sequence[Layout]:
        """The layouts between the two sides."""
        return self.options.layouts

    def take(self, found: dict[str, str], step: MatchStep | None) -> None:
        """Pair what is still free on both sides; ``step`` None: the step of the renames."""
        for target, source in found.items():
            if target not in self.pairs and source not in self.paired:
                self.pairs[target] = source
                self.paired.add(source)
                self.how[target] = step or self.how_renamed[source]

    @property
    def all_paired(self) -> bool:
        """Whether every target key is paired: a count (pairs are keyed by target keys).

        Then no pass has anything left to do, and a model of 100k tensors is not walked
        again for each of them.
        """
        return len(self.pairs) == len(self.dst.tensors)

    def left(self) -> tuple[list[str], list[str]]:
        """Target keys not paired yet, and the renamed source keys not paired yet.

        Neither is listed once :attr:`all_paired`.
        """
        if self.all_paired:
            return [], []
        return ([t for t in self.dst.tensors if t not in self.pairs],
                [s for s in self.renamed if s not in self.paired])


def renamed_info(info: TensorInfo, name: str) -> TensorInfo:
    """A source tensor's info under its renamed key (module paths follow renames)."""
    return TensorInfo(name, info.shape, info.dtype, info.kind) if name != info.name else info
