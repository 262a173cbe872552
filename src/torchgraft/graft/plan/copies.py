"""One tensor kept once by one side and once per block by the other: copies of one value.

A model may keep a value its configuration computes (rotary frequencies, ``inv_freq``) once,
where another code base keeps a copy in every block. What is left unpaired after names,
structure and inference pairs so, by its leaf name and its shape: several of the model's
tensors of one leaf and shape, in as many blocks, are all filled from the checkpoint's one
tensor of that leaf and shape (the value its model used in every block); the model's one
tensor is filled from the first of the checkpoint's copies, a guess whose alternatives are the
others (nothing but their values, which a plan does not read, says they are equal).
"""

from __future__ import annotations

from ..evidence import Guess, MatchStep
from ..layouts.conventions import unit_of
from ..tensors import natural_key
from .state import PassState
from .steps import is_bookkeeping

__all__ = ["copies"]


def _by_leaf_and_shape(keys: list[str], shapes: dict[str, tuple[int, ...]],
                       names: dict[str, str] | None = None) -> dict[tuple[str, tuple[int, ...]],
                                                                     list[str]]:
    grouped: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for key in keys:
        name = names[key] if names is not None else key
        if not is_bookkeeping(name):
            grouped.setdefault((name.rpartition(".")[2], shapes[key]), []).append(key)
    return grouped


def _one_per_block(keys: list[str], names: dict[str, str] | None = None) -> bool:
    """Whether keys lie in as many different blocks (numbered units) as there are keys."""
    units = [unit_of((names or {}).get(k, k)) for k in keys]
    return len(keys) > 1 and all(units) and len(set(units)) == len(keys)


def copies(state: PassState) -> None:
    """Fill a value kept once on one side and once per block on the other."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    filled = {state.dst.ties.get(t, t) for t in state.pairs}
    targets = _by_leaf_and_shape([t for t in left_t if state.dst.ties.get(t, t) not in filled],
                                 {k: i.shape for k, i in state.dst.tensors.items()})
    sources = _by_leaf_and_shape(left_s, {k: i.shape for k, i in state.src.tensors.items()},
                                 state.renamed)
    for key, wanted in targets.items():
        found = sources.get(key, [])
        if len(found) == 1 and _one_per_block(wanted):
            for target in wanted:  # the one value the checkpoint's model used in every block
                state.pairs[target] = found[0]
                state.how[target] = MatchStep.STRUCTURE
            state.paired.add(found[0])
        elif len(wanted) == 1 and _one_per_block(found, state.renamed):
            ordered = sorted(found, key=lambda k: natural_key(state.renamed[k]))
            state.take({wanted[0]: ordered[0]}, MatchStep.STRUCTURE)
            state.plan.guesses[wanted[0]] = Guess(
                tuple(state.renamed[k] for k in ordered[1:]),
                f"the model keeps '{wanted[0]}' once, the checkpoint a copy per block: the "
                "first copy was taken, as they hold one value if they are copies")
            for other in ordered[1:]:
                state.plan.unused[other] = (f"a copy of '{state.renamed[ordered[0]]}', which "
                                            f"fills '{wanted[0]}' (the model keeps it once)")
