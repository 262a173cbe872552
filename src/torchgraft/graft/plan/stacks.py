"""Experts stacked along a leading dimension on one side, kept apart on the other, by shapes.

A mixture-of-experts layer may hold one 3-D tensor per projection for all its experts
(``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``), where another code base
numbers each expert's modules (``experts.3.fc_1``, ``experts.3.fc_2``, ``experts.3.proj``)
under names no table of :mod:`~torchgraft.graft.layouts.experts` lists. What structure leaves,
shapes pair: a stacked tensor of ``E`` experts, in the scope its layer is aligned with, is the
experts' modules of one or two names stacked (their rows concatenated, in the order their roles
say, else a guess), stored ``[E, out, in]`` as ``nn.Linear`` keeps each, or ``[E, in, out]``
(transposed: where the shapes cannot tell, a guess). The one such set, never a choice among
several; both ways.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from ..evidence import Guess
from ..layouts import ops
from ..layouts.conventions import role_parts
from ..layouts.glu import PARTS_REORDERED
from ..layouts.op_rules import Derivation
from ..tensors import TensorInfo
from .infer import Made, Scopes
from .state import PassState

__all__ = ["stacks"]

#: An expert's module: ``<container>.<index>.<name>`` (the name may nest: ``w1``, ``mlp.fc1``).
_EXPERT = re.compile(r"^(?P<container>.+)\.(?P<index>\d+)\.(?P<name>[^.]+(?:\.[^.]+)*?)$")
#: Orders of experts' projections that roles state, rows first to last.
_ORDERS = (("gate", "up"),)


@dataclass(frozen=True)
class _Family:
    """One projection of every expert of a layer: ``experts.{e}.fc_1.weight`` for e < E.

    Attributes:
        container: The experts' container (``transformer.h.0.mlp.experts``).
        name: The projection's module name under each expert (``fc_1``).
        leaf: The tensor's leaf (``weight``).
        keys: Each expert's key, by index.
        shape: Each expert's tensor's shape (all alike).
    """

    container: str
    name: str
    leaf: str
    keys: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def role(self) -> str | None:
        return role_parts(self.name)[1]


def _families(keys: list[str], names: dict[str, str],
              infos: dict[str, TensorInfo]) -> list[_Family]:
    """Every projection kept apart for a run of experts ``0 .. E-1`` of one shape."""
    grouped: dict[tuple[str, str, str], dict[int, str]] = {}
    for key in keys:
        module, _, leaf = names.get(key, key).rpartition(".")
        found = _EXPERT.match(module)
        if found is not None:
            family = (found["container"], found["name"], leaf)
            grouped.setdefault(family, {})[int(found["index"])] = key
    families = []
    for (container, name, leaf), by_index in grouped.items():
        shapes = {infos[k].shape for k in by_index.values()}
        if sorted(by_index) == list(range(len(by_index))) and len(by_index) > 1 and \
                len(shapes) == 1:
            families.append(_Family(container, name, leaf,
                                    tuple(by_index[e] for e in range(len(by_index))),
                                    shapes.pop()))
    return families


@dataclass(frozen=True)
class _Fit:
    """How a stacked tensor holds some families: their order, and whether transposed."""

    parts: tuple[_Family, ...]
    transposed: bool
    guess: Guess | None


def _fits(stacked: tuple[int, ...], parts: tuple[_Family, ...]) -> list[bool]:
    """Whether the stacked shape holds these parts concatenated by rows: as is, transposed."""
    count, rows = len(parts[0].keys), sum(p.shape[0] for p in parts)
    if len(stacked) != 3 or stacked[0] != count or any(
            len(p.shape) != 2 or p.shape[1] != parts[0].shape[1] for p in parts):
        return []
    columns = parts[0].shape[1]
    return [t for t, ok in ((False, stacked[1:] == (rows, columns)),
                            (True, stacked[1:] == (columns, rows))) if ok]


def _ordered(parts: tuple[_Family, ...]) -> tuple[tuple[_Family, ...], bool]:
    """The parts in the order their roles state (gate before up); whether they state one."""
    roles = [p.role for p in parts]
    for order in _ORDERS:
        if sorted(r or "" for r in roles) == sorted(order):
            return tuple(sorted(parts, key=lambda p: order.index(p.role or ""))), True
    return parts, len(parts) == 1


def _fit(stacked: TensorInfo, families: list[_Family]) -> _Fit | None:
    """The one set of families (one or two) a stacked tensor holds, in its order."""
    found = [(parts, transposed) for k in (1, 2)
             for parts in itertools.combinations(families, k)
             if len({p.container for p in parts}) == 1
             for transposed in _fits(stacked.shape, parts)]
    sets = {frozenset(p.name for p in parts) for parts, _ in found}
    if len(sets) != 1:
        return None
    parts, known = _ordered(found[0][0])
    doubts = []
    alternatives = []
    if not known:
        doubts.append("the experts' projections' names do not say their order in the stacked "
                      "rows: read in the order they are stored")
        alternatives.append(PARTS_REORDERED)
    if len({t for _, t in found}) > 1:
        doubts.append("the stacked tensor's shape reads as [E, out, in] and [E, in, out] "
                      "alike: read [E, out, in], as nn.Linear keeps each expert")
        alternatives.append("(transposed)")
    transposed = found[0][1] if len({t for _, t in found}) == 1 else False
    guess = Guess(tuple(alternatives), "; ".join(doubts)) if doubts else None
    return _Fit(parts, transposed, guess)


def stacks(state: PassState) -> None:
    """Pair stacked experts' tensors with the experts' own, by shapes, in aligned scopes."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    scopes = Scopes(state.pairs, state.renamed)
    made = Made(state)
    # the checkpoint stacks what the model keeps apart
    names = {k: state.renamed[k] for k in left_s if len(state.src.tensors[k].shape) == 3}
    for key, fit in _fitted(names, state.src.tensors, _families(left_t, {}, state.dst.tensors),
                            scopes, target=False):
        _unstack(made, key, names[key], fit)
    # and the other way round
    stacked = {k: k for k in left_t if len(state.dst.tensors[k].shape) == 3}
    families = _families(left_s, state.renamed, state.src.tensors)
    for key, fit in _fitted(stacked, state.dst.tensors, families, scopes, target=True):
        _stack(made, key, fit)
    made.finish()


def _fitted(stacked: dict[str, str], infos: dict[str, TensorInfo], families: list[_Family],
            scopes: Scopes, *, target: bool) -> list[tuple[str, _Fit]]:
    """Each stacked tensor's fit, the families one takes no longer another's, until none fits.

    A layer's ``down_proj`` may read like its ``gate_up_proj``'s parts transposed until those
    are taken: the tensors are tried again while any fits.
    """
    found: list[tuple[str, _Fit]] = []
    left = dict(stacked)
    while left:  # a pass over what is left; another only where this one took something
        taken = []
        for key, name in left.items():
            fit = _in_scope(infos[key], name, families, scopes, target=target)
            if fit is not None:
                taken.append(key)
                found.append((key, fit))
                families = [f for f in families if f not in fit.parts]
        if not taken:
            break
        for key in taken:
            del left[key]
    return found


def _in_scope(stacked: TensorInfo, name: str, families: list[_Family], scopes: Scopes, *,
              target: bool) -> _Fit | None:
    """The fit of a stacked tensor among the families in its narrowest aligned scope."""
    for scope in scopes.partners(name.rpartition(".")[0], target=target):
        fit = _fit(stacked, [f for f in families
                             if not scope or f.container.startswith(scope + ".")])
        if fit is not None:
            return fit
    return None


def _unstack(made: Made, key: str, name: str, fit: _Fit) -> None:
    """A stacked source tensor cut into each expert's projections."""
    count = len(fit.parts[0].keys)
    experts = tuple(f"{name}[{e}]" for e in range(count))
    made.made(Derivation(experts, ops.Unstack(0), (key,), "experts stacked"))
    sizes = tuple(p.shape[0] for p in fit.parts)
    cut: list[ops.TensorOp] = [ops.Transpose(0, 1)] if fit.transposed else []
    cut.append(ops.Split(0, sizes=sizes) if len(sizes) > 1 else ops.Chain(()))
    for e, expert in enumerate(experts):
        outputs = tuple(f"{expert}[{k}]" for k in range(len(sizes)))
        made.made(Derivation(outputs, ops.Chain(tuple(cut)), (expert,), "experts stacked"))
        for k, part in enumerate(fit.parts):
            why = f"expert {e} of {name}" + (f", part {k}" if len(sizes) > 1 else "") + (
                ", transposed" if fit.transposed else "")
            made.pair(part.keys[e], outputs[k], why, fit.guess)


def _stack(made: Made, target: str, fit: _Fit) -> None:
    """Each expert's projections concatenated, then stacked into the model's one tensor."""
    count = len(fit.parts[0].keys)
    join: list[ops.TensorOp] = [ops.Concatenate(0)] if len(fit.parts) > 1 else []
    join += [ops.Transpose(0, 1)] if fit.transposed else []
    experts = []
    for e in range(count):
        inputs = tuple(part.keys[e] for part in fit.parts)
        expert = f"{fit.parts[0].container}.{e}.{{{','.join(p.name for p in fit.parts)}}}"
        made.made(Derivation((expert,), ops.Chain(tuple(join)), inputs, "experts apart"))
        experts.append(expert)
    name = f"{fit.parts[0].container}.[stacked].{target.rpartition('.')[2]}"
    made.made(Derivation((name,), ops.Stack(0), tuple(experts), "experts apart"))
    made.pair(target, name, f"stacked from {count} experts' "
              + ", ".join(p.name for p in fit.parts)
              + (", transposed" if fit.transposed else ""), fit.guess)
