"""How each loaded key is known, and the verdict a graft earns from it.

Every target key a plan fills carries its :class:`Evidence`; the report's :class:`Verdict`
follows from the evidence of all keys, what is missing, and whether outputs were compared:

- ``ok``: every key is filled and known by name or structure, or outputs were compared equal.
- ``unverified``: every key is filled, but some were guesses among interchangeable candidates
  (each listed in ``report.guesses`` with its alternatives and how to settle it), or the graft
  rests on an assumption the checkpoint cannot confirm (``report.assumptions``: a bare state
  dict from another code base does not say its attention head count).
- ``incomplete``: keys are missing.
- ``diverged``: outputs were compared and differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..text import few, quoted

__all__ = ["COMPARE", "EXIT_CODES", "NAME_STEPS", "ROTARY_ALTERNATIVE", "SETTLE", "SIBLINGS",
           "Assumption", "Caution", "Evidence", "Guess", "MatchStep", "TextEnum", "Verdict",
           "rotary_alternatives"]


class TextEnum(str, Enum):
    """An enum whose members are their text: equal to it, and printed and dumped as it."""

    def __str__(self) -> str:
        return str(self.value)


class MatchStep(TextEnum):
    """Which matching step paired a target key with a source key."""

    EXACT = "exact"
    RULE = "rule"
    LAYOUT = "layout"
    WRAPPER = "wrapper"
    PREFIX = "prefix"
    STRUCTURE = "structure"


#: Steps that pair by name: their keys are known by ``name``.
NAME_STEPS = frozenset({MatchStep.EXACT, MatchStep.RULE, MatchStep.LAYOUT, MatchStep.WRAPPER,
                        MatchStep.PREFIX})


class Evidence(TextEnum):
    """How a loaded key is known to be the right one.

    Attributes:
        NAME: By its name: exact, without wrappers, through a rule or a known layout.
        STRUCTURE: The only candidate of its role and shape in an aligned unit, or ordered
            among numbered siblings by their numbers.
        GUESS: One of several interchangeable candidates (same shape, no name to tell them
            apart), or a layout that shapes alone cannot decide.
        VERIFIED: Outputs were compared equal after the graft.
    """

    NAME = "name"
    STRUCTURE = "structure"
    GUESS = "guess"
    VERIFIED = "verified"


class Verdict(TextEnum):
    """The verdict of a graft, best first."""

    OK = "ok"
    UNVERIFIED = "unverified"
    INCOMPLETE = "incomplete"
    DIVERGED = "diverged"


#: The CLI's exit code for each verdict (2 is bad input).
EXIT_CODES = {Verdict.OK: 0, Verdict.INCOMPLETE: 1, Verdict.UNVERIFIED: 3, Verdict.DIVERGED: 4}

#: How to compare outputs, in the library's words with the command line's beside them (the
#: command line shows its own alone: :func:`torchgraft.cli.words.cli_words`). Both work as
#: written: inputs are generated from the models where none are given.
COMPARE = ("compare outputs with the source's own model: source_model= (CLI: --verify "
           "--source-model MODULE:FACTORY), on inputs generated from the models or given as "
           "example_inputs= (CLI: --inputs FILE or --input-shape N,C,H,W)")

#: How a guess can be settled, the same for every guess.
SETTLE = f"{COMPARE}; or name each key's source with rules= (CLI: --rules FILE)"


class Caution(str):
    """A warning that outputs compared equal settle: the report drops it once they are.

    (The rotary order kept where one side's naming family is unknown: equal outputs show it
    was the right one.)
    """

    __slots__ = ()


@dataclass(frozen=True)
class Guess:
    """A key filled by a guess: what else could have filled it and why it could not be told.

    Attributes:
        alternatives: Source keys (or layouts) that fit it as well.
        why: Why they could not be told apart.
        settle: How to settle it.
    """

    alternatives: tuple[str, ...]
    why: str
    settle: str = SETTLE

    def describe(self) -> str:
        """One line for the report: why, and the alternatives."""
        shown = few(self.alternatives, show=quoted)
        return f"{self.why}" + (f"; alternatives {shown}" if shown else "")

#: What the assumption of guessed siblings is called (each such key is a guess too).
SIBLINGS = "same-shape siblings"

#: How a guess names the other rotary order of a key's rows: where outputs diverge, that order
#: is tried (:mod:`~torchgraft.graft.check.settle`).
ROTARY_ALTERNATIVE = "(rotary rows permuted)"


def rotary_alternatives(source: str) -> tuple[str, str]:
    """A rotary guess's alternatives: the source's rows as stored, or in the other order."""
    return f"{source} (rows as stored)", f"{source} {ROTARY_ALTERNATIVE}"


@dataclass(frozen=True)
class Assumption:
    """A fact the graft relies on that the checkpoint cannot confirm.

    A bare state dict holds names and shapes only. Grafted across code bases, it relies on
    facts of the model it came from: the attention's head count (another head count has the
    same shapes), which of two same-shape siblings is which where only the names' conventions
    told them apart. Each makes the verdict ``unverified`` until outputs are compared.

    Attributes:
        what: What was assumed (``"attention head count"``).
        assumed: The value taken, and where from (``"the model's: 4 heads, 2 kv heads"``).
        why: Why the checkpoint cannot confirm it.
        settle: How to settle it.
    """

    what: str
    assumed: str
    why: str
    settle: str = SETTLE

    def describe(self) -> str:
        """One line for the report: what was assumed, and why."""
        return f"{self.what}: {self.assumed}; {self.why}"
