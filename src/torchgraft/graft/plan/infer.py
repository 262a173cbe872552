"""Inference within aligned scopes: what names left unpaired, rows that add up pair.

After names and structure, a module of one side may hold along its rows what two or three
modules of the other hold apart: a fused ``[q; k; v]`` or ``[gate; up]`` under a name no table
of :mod:`~torchgraft.graft.layouts.fusion` lists. Shapes say it: the parts share every other
dimension and their rows add up to the fused module's. The scope is where both sides' pairs
already put it: the source module under which the model module's siblings found their
partners (its parent's partner, else an ancestor's). Within it, the one set of unpaired
modules whose rows add up is fused (or the one fused module split), never a choice among
several.

The order of the parts is read from two families of signals, as same-shape siblings are
(:mod:`~torchgraft.graft.plan.structure`): their roles (q, k, v; gate, up) and the order both
sides really store them in. A fused tensor's layout is another matter: part by part
(``[Q; K; V]``, most code bases) or head by head (GPT-NeoX, lit-gpt's query groups) have the
same shape. A fused projection no table names is read part by part, and where its parts are an
attention's q, k and v that is a guess whose alternative comparing outputs can try.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ..evidence import Guess, MatchStep
from ..layouts import ops
from ..layouts.conventions import numbered, role_parts
from ..layouts.fusion import FUSIONS
from ..layouts.glu import GLU_ORDERS, PARTS_REORDERED
from ..layouts.op_rules import Derivation
from ..tensors import TensorInfo, owner
from .state import PassState, renamed_info
from .steps import is_bookkeeping

__all__ = ["HEAD_BY_HEAD", "MAX_CANDIDATES", "Made", "Scopes", "infer"]

#: Modules of one scope tried together at most (their subsets are searched).
MAX_CANDIDATES = 12
#: How many parts a fused module holds at most (q, k, v).
_MOST_PARTS = 3
#: How a guess names the head-by-head layout of a fused attention projection.
HEAD_BY_HEAD = "(stored head by head)"
#: Orders of parts that roles state, fused first to last.
_ROLE_ORDERS = (("q", "k", "v"), ("gate", "up"))
#: Fused module names whose layout a table states (part by part or head by head).
_KNOWN_FUSED = frozenset(name for fusion in FUSIONS for name in fusion.fused)
#: Fused gated-MLP names whose order of halves a table states.
_KNOWN_GLU = {name: order for order in GLU_ORDERS for name in order.names}


@dataclass(frozen=True, eq=False)
class _Module:
    """One unpaired module of a side: its tensors by leaf, where it stands in its side's order."""

    path: str
    tensors: dict[str, TensorInfo]
    keys: dict[str, str]  # leaf -> the side's key (a source's original key)
    position: int

    @property
    def rows(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def fits_rows(self) -> bool:
        """Every tensor 1-D or more, all with the same rows, of a linear (or unknown) kind."""
        shapes = [info.shape for info in self.tensors.values()]
        return (all(shapes) and len({s[0] for s in shapes}) == 1
                and all(info.kind in (None, "linear") for info in self.tensors.values()))

    def rest(self, leaves: Iterable[str] | None = None) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each leaf (of ``leaves``, if given) with its shape but rows.

        What parts must share with the fused module: its leaves; a part may hold more (a
        bias the fused module keeps elsewhere), left for other passes.
        """
        chosen = self.tensors if leaves is None else {
            leaf: self.tensors[leaf] for leaf in leaves if leaf in self.tensors}
        return tuple(sorted((leaf, info.shape[1:]) for leaf, info in chosen.items()))


def _modules(keys: Iterable[str], infos: dict[str, TensorInfo],
             names: dict[str, str] | None = None) -> list[_Module]:
    """Unpaired modules with every tensor of a row-stackable kind (bookkeeping aside)."""
    grouped: dict[str, tuple[dict[str, TensorInfo], dict[str, str], int]] = {}
    for position, key in enumerate(keys):
        name = names[key] if names is not None else key
        if is_bookkeeping(name):
            continue
        path, _, leaf = name.rpartition(".")
        tensors, original, _first = grouped.setdefault(path, ({}, {}, position))
        tensors[leaf] = infos[key] if names is None else renamed_info(infos[key], name)
        original[leaf] = key
    found = [_Module(path, tensors, original, first)
             for path, (tensors, original, first) in grouped.items()]
    return [m for m in found if m.fits_rows()]


def _ancestors(path: str) -> list[str]:
    """A module's ancestors, nearest first, the root last (``""``)."""
    found = []
    while path:
        path = path.rpartition(".")[0]
        found.append(path)
    return found


class Scopes:
    """Which module of one side stands for which of the other, by the pairs made so far.

    A module stands for the deepest module of the other side that holds the partners of
    every pair under it (its attention's output projection and relative-position table paired
    put it around the other side's attention, however deep either nests them).
    """

    def __init__(self, pairs: dict[str, str], names: dict[str, str]) -> None:
        under_t: dict[str, list[str]] = {}
        under_s: dict[str, list[str]] = {}
        for target, source in pairs.items():
            module_t, module_s = owner(target), owner(names.get(source, source))
            for a in _ancestors(module_t):
                under_t.setdefault(a, []).append(module_s)
            for b in _ancestors(module_s):
                under_s.setdefault(b, []).append(module_t)
        # the root stands for the root (the models grafted), paired tensors or none
        self.to_source = {"": ""} | {a: _lifted(a, _common(paths)) for a, paths in under_t.items()}
        self.to_target = {"": ""} | {b: _lifted(b, _common(paths)) for b, paths in under_s.items()}

    def partners(self, path: str, *, target: bool) -> list[str]:
        """The other side's modules for the ancestors of ``path`` that have one, nearest first."""
        mapping = self.to_source if target else self.to_target
        return list(dict.fromkeys(mapping[a] for a in _ancestors(path) if a in mapping))


def _numbered_prefix(path: str) -> str | None:
    """A path up to its last numbered part (``layers.0.mlp`` -> ``layers.0``), if it has one."""
    parts = path.split(".")
    last = max((k for k, part in enumerate(parts) if numbered(part)), default=-1)
    return ".".join(parts[: last + 1]) if last >= 0 else None


def _lifted(module: str, partner: str) -> str:
    """A block's partner: a block too.

    The pairs under a block may all sit in one part of it (its MLP's), while the block holds
    its attention as well.
    """
    if not module or not numbered(module.rpartition(".")[2]):
        return partner
    return _numbered_prefix(partner) or partner


def _common(paths: list[str]) -> str:
    """The deepest module holding every one of these modules (a lone one: its parent)."""
    parts = [p.split(".") for p in paths]
    common: list[str] = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    if len(common) == min(len(p) for p in parts):  # one module (or nested ones): its parent
        common = common[:-1]
    return ".".join(common)


def _under(scope: str, path: str) -> bool:
    return not scope or path.startswith(scope + ".")


def _parts_of(fused: _Module, candidates: list[_Module]) -> list[_Module] | None:
    """The one set of candidates whose rows add up to ``fused``'s, sharing the rest.

    None where a candidate fits ``fused`` whole (same shapes): that is a module of the same
    kind that structure could not tell from others, not a fusion.
    """
    rest = fused.rest()
    if any(m.rest(fused.tensors) == rest and m.rows == fused.rows for m in candidates):
        return None
    alike = [m for m in candidates if m.rest(fused.tensors) == rest and m.rows < fused.rows]
    if len(alike) > MAX_CANDIDATES:
        return None
    found = [list(parts) for k in range(2, _MOST_PARTS + 1)
             for parts in itertools.combinations(alike, k)
             if sum(m.rows for m in parts) == fused.rows]
    if len(found) > 1:  # names rank: the one set whose roles make a whole (q, k, v; gate, up)
        found = [parts for parts in found if _role_order(_roles(parts)) is not None]
    return found[0] if len(found) == 1 else None


def _role_order(roles: list[str | None]) -> tuple[str, ...] | None:
    """The order of parts these roles make a whole of (``q, k, v``), if they make one."""
    return next((order for order in _ROLE_ORDERS
                 if sorted(r or "" for r in roles) == sorted(order)), None)


@dataclass(frozen=True)
class _Order:
    """The parts in the order of the fused rows, and how sure that order (and layout) is.

    Attributes:
        parts: The parts, in the order of the fused rows.
        guess: What is guessed: the order (``reordered``), the fused layout, or both.
        reordered: Whether another order of the parts is an alternative.
    """

    parts: list[_Module]
    guess: Guess | None
    reordered: bool = False


def _roles(parts: list[_Module]) -> list[str | None]:
    """Each part's own role (its contexts aside: the scope holds them all)."""
    siblings = frozenset(p.path.rpartition(".")[2] for p in parts)
    return [role_parts(p.path, siblings)[1] for p in parts]


def _order(fused: _Module, parts: list[_Module], *, ordered: bool) -> _Order:
    """Order the parts by their roles and by the order they are stored in; say how sure.

    Two signals that agree (roles that state an order, and that order stored on the parts'
    side) are evidence; one alone is a guess whose alternatives are the other orders.
    """
    roles = _roles(parts)
    by_role = _role_order(roles)
    stored = sorted(parts, key=lambda m: m.position)
    if by_role is not None:
        chosen = sorted(parts, key=lambda m: by_role.index(roles[parts.index(m)] or ""))
        fused_name = fused.path.rpartition(".")[2]
        glu = _KNOWN_GLU.get(fused_name)
        if by_role == ("gate", "up") and glu is not None and not glu.gate_first:
            chosen.reverse()  # a name whose code base stores [up; gate]
        certain = ordered and chosen == stored
        doubt = None if certain else ("the parts' roles order them, and the order they are "
                                      "stored in does not say the same")
        if by_role == ("gate", "up") and (glu is None or not glu.known):
            doubt = glu.doubt if glu is not None else (
                "a gated projection's halves fused under a name that does not say their "
                "order: read gate first, as most code bases store them")
        layout = by_role == ("q", "k", "v") and fused_name not in _KNOWN_FUSED
        return _Order(chosen, _guess(chosen, doubt, layout=layout), doubt is not None)
    doubt = ("nothing names the parts' roles: they are fused in the order they are stored"
             if ordered else "nothing names the parts' roles, and the file is stored sorted")
    return _Order(stored, _guess(stored, doubt, layout=False), True)


def _guess(parts: list[_Module], doubt: str | None, *, layout: bool) -> Guess | None:
    """The guess an order (and a fused layout no table states) is, if it is one.

    Its alternatives name the other order (``PARTS_REORDERED`` for two halves) and the
    head-by-head layout (:data:`HEAD_BY_HEAD`): what comparing outputs tries.
    """
    why = [doubt] if doubt else []
    alternatives = []
    if doubt:
        alternatives.append(PARTS_REORDERED if len(parts) == 2 else
                            "(parts in another order: " + ", ".join(
                                p.path.rpartition(".")[2] for p in reversed(parts)) + ")")
    if layout:
        why.append("a fused attention projection under a name no table lists may be stored "
                   "part by part or head by head; read part by part")
        alternatives.append(HEAD_BY_HEAD)
    return Guess(tuple(alternatives), "; ".join(why)) if why else None


def _fused_name(parent: str, parts: list[_Module], leaf: str) -> str:
    label = ",".join(p.path.rpartition(".")[2] for p in parts)
    return f"{parent}.{{{label}}}.{leaf}" if parent else f"{{{label}}}.{leaf}"


def infer(state: PassState) -> None:
    """Pair unpaired modules whose rows add up, fused or split, within aligned scopes."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    filled = {state.dst.ties.get(t, t) for t in state.pairs}
    targets = _modules([t for t in left_t if state.dst.ties.get(t, t) not in filled],
                       state.dst.tensors)
    sources = _modules(left_s, state.src.tensors, state.renamed)
    if not targets or not sources:
        return
    scopes = Scopes(state.pairs, state.renamed)
    made = Made(state)
    # the model's module holds what the checkpoint's hold apart
    for fused, parts in _proposals(targets, sources, scopes, target=True).items():
        made.fuse(fused, _order(fused, parts, ordered=state.src.ordered))
    # and the other way round
    left = [m for m in sources if m.path not in made.used]
    free = [m for m in targets if m.path not in made.filled]
    for fused, parts in _proposals(left, free, scopes, target=False).items():
        made.split(fused, _order(fused, parts, ordered=True))
    made.finish()


def _proposals(fused: list[_Module], others: list[_Module], scopes: Scopes, *,
               target: bool) -> dict[_Module, list[_Module]]:
    """Each fused module's parts among the others in its scope; none that two would share."""
    found = {}
    for module in fused:
        for scope in scopes.partners(module.path, target=target):  # the narrowest that holds
            parts = _parts_of(module, [m for m in others if _under(scope, m.path)])
            if parts is not None:
                found[module] = parts
                break
    claimed = Counter(p.path for parts in found.values() for p in parts)
    return {module: parts for module, parts in found.items()
            if all(claimed[p.path] == 1 for p in parts)}


class Made:
    """What :func:`infer` made: derivations, virtual tensors and their pairs, then recorded."""

    def __init__(self, state: PassState) -> None:
        self.state = state
        self.used: set[str] = set()  # source modules made into others
        self.filled: set[str] = set()  # target modules paired here
        self.infos: dict[str, TensorInfo] = {}
        self.pairs: dict[str, str] = {}  # target key -> virtual source key

    def fuse(self, fused: _Module, order: _Order) -> None:
        """The parts' tensors concatenated into a virtual source tensor for each leaf."""
        self.used.update(p.path for p in order.parts)
        self.filled.add(fused.path)
        parent = order.parts[0].path.rpartition(".")[0]
        for leaf, target in fused.keys.items():
            inputs = tuple(p.keys[leaf] for p in order.parts)
            name = _fused_name(parent, order.parts, leaf)
            why = ("fused from " + ", ".join(p.path + "." + leaf for p in order.parts)
                   + " (their rows add up to the model's)")
            self.made(Derivation((name,), ops.Concatenate(0), inputs, "rows that add up"))
            self.pair(target, name, why, order.guess)

    def split(self, fused: _Module, order: _Order) -> None:
        """The fused tensor of each leaf cut into virtual source tensors, one per part."""
        self.used.add(fused.path)
        self.filled.update(p.path for p in order.parts)
        sizes = tuple(p.rows for p in order.parts)
        starts = [sum(sizes[:k]) for k in range(len(sizes) + 1)]
        for leaf, source in fused.keys.items():
            names = tuple(f"{fused.path}[{k}].{leaf}" for k in range(len(sizes)))
            whole = self.state.renamed[source]
            self.made(Derivation(names, ops.Split(0, sizes=sizes), (source,),
                                  "rows that add up"))
            for k, (name, part) in enumerate(zip(names, order.parts, strict=True)):
                why = (f"split from {whole} (rows {starts[k]}:{starts[k + 1]}, as the model's "
                       "modules hold them)")
                guess = order.guess and Guess(
                    (*(n for n in names if n != name and order.reordered),
                     *(a for a in order.guess.alternatives if a == HEAD_BY_HEAD)),
                    order.guess.why)
                self.pair(part.keys[leaf], name, why, guess)

    def made(self, made: Derivation) -> None:
        """Record a derivation: its outputs become virtual source tensors, its inputs retire."""
        state = self.state
        state.plan.inferred.append(made)
        inputs = [self.infos.get(k) or state.src.tensors[k] for k in made.inputs]
        first = inputs[0]
        shapes = made.op.shapes([info.shape for info in inputs])
        for name, shape in zip(made.outputs, shapes, strict=True):
            self.infos[name] = TensorInfo(name, shape, first.dtype, first.kind)
        for key in made.inputs:
            state.renamed.pop(key, None)
            self.infos.pop(key, None)  # made from made: only the last stands for the source

    def pair(self, target: str, name: str, why: str, guess: Guess | None) -> None:
        """Pair a target key with a virtual source tensor, with how it was made."""
        self.pairs[target] = name
        self.state.inferred[name] = why
        if guess is not None:
            self.state.plan.guesses[target] = guess

    def finish(self) -> None:
        """The source side with the virtual tensors, and their pairs taken."""
        state = self.state
        if not self.infos:
            return
        state.src = state.src.with_tensors({**state.src.tensors, **self.infos},
                                           [*state.src.order, *self.infos])
        state.renamed.update({name: name for name in self.infos})
        state.take(self.pairs, MatchStep.STRUCTURE)
