"""Structural matching: align modules by order and shapes, when names share nothing.

Both sides' unmatched tensors are grouped by module, in order of use (a file's stored order
stands for its order of definition; a file stored sorted has its order recovered from its names,
see :class:`~torchgraft.graft.tensors.Side`). Bookkeeping buffers (``num_batches_tracked``) never
count towards a module's size, so Paddle's 4-tensor BatchNorm pairs with PyTorch's 5-tensor one.
Two modules correspond when each pair of their tensors (by leaf name where both sides use the
same ones, else in order) fits: same shape, or the layout's transposed shape; same module kind
where both kinds are known.

Before aligning, the source's groups take the order the target's shapes give its parts
(children that pair one to one by shape, lists numbered the other way turned:
:mod:`~torchgraft.graft.plan.hierarchy`, :mod:`~torchgraft.graft.plan.numbering`); the steps
below run on that order, and pairs are judged on the side's own. Modules that hold each
other's one to one scope what the steps leave, and a context that places a module in a block
(:data:`~torchgraft.graft.layouts.conventions.PLACES`) is set aside for what is left last.

Alignment is partial, never all or nothing, and never a guess:

0. Numbered blocks (units) first: when both sides have as many and each block's modules can
   all fill the other's, the k-th block pairs with the k-th and steps 1 and 2 run inside each
   pair (a parallel-residual block runs its MLP before its attention on one side only).
1. The longest common subsequence (LCS) of corresponding modules. Only pairs that every
   optimal alignment shares are taken; a local conflict voids only its own stretch.
2. Within each stretch left between those anchors, then among all that is left: a module that
   fits exactly one module of the other side, which fits only it, pairs (order aside).
3. A module next to a paired one, under the same parent on both sides, pairs with its
   counterpart's neighbour when they fit and nothing else under those parents does (a
   BatchNorm follows its convolution).

A source whose order was recovered from sorted names knows the order of numbered blocks
(``layer.2`` before ``layer.10``) and of numbered siblings (``conv1`` before ``conv2``), but
not of other siblings (``attention.output`` sorts before ``attention.self``). For it, step 1
pairs modules of one shape class in order (the k-th of the model's with the k-th of the
checkpoint's) when both sides have as many and no block holds two of them that only their
names order; neighbours are not used. A class is split first by the contexts both sides name
(``encoder``, ``decoder``, ``cross``...: :data:`~torchgraft.graft.layouts.conventions.CONTEXTS`), so
an encoder's blocks pair with the encoder's however letters order the sides.

Whatever is left and could have fitted several modules is reported as ambiguous, by name.

Each pair then gets its evidence (:mod:`~torchgraft.graft.evidence`). A module's unit is its
nearest numbered ancestor (a block, :func:`~torchgraft.graft.layouts.conventions.unit_of`). A
pair is ``structure`` when the source module is the only one of its unit that fits the target
module and the other way round; when the roles of their names
(:mod:`~torchgraft.graft.layouts.conventions`) single it out among the candidates (a block's
``q_proj`` is its ``query``); or when the candidates on each side differ only by numbers
(``bn1``, ``bn2``) and the pairs follow those numbers in the model's order. A norm goes with
the convolution it normalises (the only one of its width under its parent,
``expansion.expand_conv``; else, in a real order, the one right before it, ``_expand_conv``
before ``_bn0``): two norms whose convolutions are paired pair too, and norms that follow their
convolutions are ordered like numbered ones (``_bn0``, ``_bn1`` against ``expand_bn``,
``depthwise_norm``). Any other pair among same-shape candidates is a ``guess``, with the other
candidates as its alternatives. Before that, same-shape pairs of a unit are re-paired by role,
then by convolution, then by number.

Roles and numbers in names, and a norm right after its convolution in stored order, are
conventions of code bases, not facts of a file: for a source that is not a module
(``trust_conventions=False``), a pair that only they single out among same-shape siblings is a
``guess`` too (listed in ``by_convention``), unless both sides give its modules the same name.
A norm's convolution found under its parent (the only one of its width) still decides.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ...text import few, quoted
from ..evidence import Evidence, Guess
from ..layouts.conventions import PLACES, joined_role, leaf_role, numbered, role_parts, unit_of
from ..tensors import TensorInfo, natural_key, owner
from .hierarchy import aligned_subtrees, sibling_order
from .numbering import Turn, containers, turned, turned_order

__all__ = ["Alignment", "align"]

Fits = Callable[[TensorInfo, TensorInfo], bool]
Bookkeeping = Callable[[str], bool]


@dataclass
class Alignment:
    """The result of structural matching.

    Attributes:
        pairs: Target key to source key.
        ambiguous: Target key to why structure could not decide it (several modules fit).
        evidence: Target key to its evidence: ``structure`` or ``guess``.
        guesses: Target key to its alternatives, for guesses.
        by_convention: Guessed target keys that only the conventions of names (numbers, role
            tables) would have told apart.
    """

    pairs: dict[str, str]
    ambiguous: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    guesses: dict[str, Guess] = field(default_factory=dict)
    by_convention: set[str] = field(default_factory=set)


@dataclass
class _Group:
    """One module's unmatched tensors, bookkeeping buffers apart."""

    path: str
    tensors: list[TensorInfo]
    bookkeeping: list[TensorInfo]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    def signature(self) -> Hashable:
        return tuple((_leaf(t), t.shape, t.kind) for t in self.tensors)


def _leaf(info: TensorInfo) -> str:
    return info.name.rpartition(".")[2]


#: The leaves torch's modules (and its parametrizations) keep their tensors under; any other
#: leaf is a bare parameter of its module (``q_bias``, ``relative_position_bias_table``,
#: ``cls_token``), which may stand on its own where another code base has a module.
MODULE_LEAVES = frozenset({
    "weight", "bias", "running_mean", "running_var", "num_batches_tracked", "weight_g",
    "weight_v", "original0", "original1", "in_proj_weight", "in_proj_bias", "scale"})


def _groups(order: list[str], infos: dict[str, TensorInfo], bookkeeping: Bookkeeping, *,
            bare_apart: bool = False) -> list[_Group]:
    """Tensors by module; with ``bare_apart``, each bare parameter a group of its own."""
    groups: dict[str, _Group] = {}
    for name in order:
        info = infos[name]
        apart = bare_apart and name.rpartition(".")[2] not in MODULE_LEAVES
        path = name if apart else info.module
        group = groups.setdefault(path, _Group(path, [], []))
        (group.bookkeeping if bookkeeping(name) else group.tensors).append(info)
    return [g for g in groups.values() if g.tensors]


def _paired(targets: list[TensorInfo],
            sources: list[TensorInfo]) -> list[tuple[TensorInfo, TensorInfo]] | None:
    """Pair two modules' tensors; ``None`` if their counts differ.

    Tensors pair by leaf name (weight, bias...) when both modules use the same names, else in
    order, except that same-shape tensors whose leaves all have a role on both sides
    (:func:`~torchgraft.graft.layouts.conventions.leaf_role`: ``gamma`` and ``weight`` scale)
    pair by role.
    """
    if len(targets) != len(sources):
        return None
    by_leaf = {_leaf(s): s for s in sources}
    if {_leaf(t) for t in targets} == set(by_leaf):
        return [(t, by_leaf[_leaf(t)]) for t in targets]
    pairs = list(zip(targets, sources, strict=True))
    for members in _same_shape(targets):
        roles_t = [leaf_role(_leaf(targets[k])) for k in members]
        by_role = {leaf_role(_leaf(sources[k])): sources[k] for k in members}
        if None not in by_role and len(by_role) == len(members) and set(roles_t) == set(by_role):
            for k, role in zip(members, roles_t, strict=True):
                pairs[k] = (targets[k], by_role[role])
    return pairs


def _same_shape(tensors: list[TensorInfo]) -> list[list[int]]:
    """The positions of a module's tensors that share a shape with another of its tensors."""
    classes: dict[tuple[tuple[int, ...], str | None], list[int]] = {}
    for k, info in enumerate(tensors):
        classes.setdefault((tuple(info.shape), info.kind), []).append(k)
    return [members for members in classes.values() if len(members) > 1]


def _told_apart(targets: list[TensorInfo], sources: list[TensorInfo], *,
                ordered: bool) -> dict[str, tuple[str, ...]]:
    """Target tensors of a module pair that only one signal told from a same-shape sibling.

    Same-shape tensors of one module under other leaf names (``gamma`` and ``beta`` against
    ``weight`` and ``bias``) are told apart by two signals at most: the order both sides
    define them in (where the source's order is real, not recovered from sorted names) and the
    roles of their leaves. Both, agreeing: evidence. One, or the two against each other: a
    guess.

    Returns:
        Target key to the other source keys it could have been filled from.
    """
    paired = _paired(targets, sources) or []
    if {_leaf(t) for t in targets} == {_leaf(s) for s in sources}:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for members in _same_shape(targets):
        for k in members:
            target, source = paired[k]
            by_order = ordered and source is sources[k]
            role = leaf_role(_leaf(target))
            by_role = role is not None and role == leaf_role(_leaf(source))
            if not (by_order and by_role):
                found[target.name] = tuple(paired[m][1].name for m in members if m != k)
    return found


def _lcs_tables(match: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prefix and suffix LCS lengths of a match matrix, one numpy pass per row.

    ``fwd[i, j]`` is the LCS of the first ``i`` targets and first ``j`` sources; ``bwd[i, j]``
    that of targets from ``i`` and sources from ``j``.
    """
    n, m = match.shape
    fwd = np.zeros((n + 1, m + 1), dtype=np.int32)
    for i in range(n):
        step = np.maximum(fwd[i, 1:], fwd[i, :-1] + match[i])
        fwd[i + 1, 1:] = np.maximum.accumulate(step)
    bwd = np.zeros((n + 1, m + 1), dtype=np.int32)
    for i in range(n - 1, -1, -1):
        step = np.maximum(bwd[i + 1, :-1], bwd[i + 1, 1:] + match[i])
        bwd[i, :-1] = np.maximum.accumulate(step[::-1])[::-1]
    return fwd, bwd


_DIGITS = re.compile(r"\d+")


def _block_and_stem(path: str) -> tuple[str, str]:
    """A module path's numbered block (``layer.3``) and its stem below it, digits removed."""
    parts = path.split(".")
    last = max((k for k, p in enumerate(parts) if numbered(p)), default=-1)
    return ".".join(parts[: last + 1]), _DIGITS.sub("#", ".".join(parts[last + 1:]))


def _in_order(groups: list[_Group]) -> bool:
    """Whether sorted names order these groups: they differ only by numbers.

    In each block the groups have one stem, and the blocks themselves differ only by numbers
    (``layer1.0``, ``layer2.1``); ``encoder.blocks.0`` and ``decoder.blocks.0``, or a root
    ``bn1`` and ``layer1.0.bn1``, are ordered by letters only, which says nothing.
    """
    stems: dict[str, str] = {}
    for group in groups:
        block, stem = _block_and_stem(group.path)
        if stems.setdefault(block, stem) != stem:
            return False
    return len({_DIGITS.sub("#", block) for block in stems}) <= 1


def _alike(match: np.ndarray, rows: list[int], cols: list[int]) -> bool:
    """Whether two blocks are alike: most modules of the one with fewer have their own fit.

    A block may hold a module its partner lacks (a copy of a value the other side keeps once
    per model, an adapter), or hold apart what the other fuses (q, k, v; experts stacked):
    at least half the modules of the block with fewer must take their own module of the
    other's. Blocks are paired this way only where both sides have as many.
    """
    if not rows or not cols:
        return False
    if len(rows) > len(cols):
        return _alike(match.T, cols, rows)
    return 2 * _matched(match, rows, cols) >= len(rows)


def _whole(match: np.ndarray, rows: list[int], cols: list[int]) -> bool:
    """Whether two sets of modules fill each other one to one."""
    return len(rows) == len(cols) and _matched(match, rows, cols) == len(rows)


def _matched(match: np.ndarray, rows: list[int], cols: list[int]) -> int:
    """How many rows take a column of their own at most (a maximum bipartite matching)."""
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j in cols:
            if match[i, j] and j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return sum(place(i, set()) for i in rows)


def _outermost(unit: str) -> str:
    """A unit's outermost numbered ancestor (itself when none is numbered above it)."""
    parts = unit.split(".")
    first = next(k for k, part in enumerate(parts) if numbered(part))
    return ".".join(parts[: first + 1])


def _blocks(ua: _Units, ub: _Units) -> list[tuple[list[int], list[int]]]:
    """The k-th block of each context on one side with the k-th on the other, if as many.

    Blocks are the units (nearest numbered ancestors); where their counts differ, the
    outermost numbered modules (a layer whose experts are numbered inside it is one block);
    else, where one side's blocks take turns of kinds (an attention block, then an MLP block,
    in one container) and the other's are all of one kind, each turn is one block.
    """
    for outermost in (False, True):
        units_a, units_b = ua.blocks(outermost=outermost), ub.blocks(outermost=outermost)
        if units_a.keys() != units_b.keys():
            continue
        units_a = {key: _turns(blocks, units_b[key], (ua.cls, ub.cls))
                   for key, blocks in units_a.items()}
        units_b = {key: _turns(blocks, units_a[key], (ub.cls, ua.cls))
                   for key, blocks in units_b.items()}
        if all(len(units_a[key]) == len(units_b[key]) for key in units_a):
            return [pair for key in units_a
                    for pair in zip(units_a[key], units_b[key], strict=True)]
    return []


def _turns(blocks: list[list[int]], others: list[list[int]],
           classes: tuple[list[int], list[int]]) -> list[list[int]]:
    """Blocks taking turns of ``r`` kinds, ``r`` times as many as ``others``: one per turn.

    A kind is a block's modules' shape classes. The blocks stay as they are unless the other
    side's blocks are all of one kind and these repeat ``r`` different kinds in turn.
    """
    if not others or len(blocks) <= len(others) or len(blocks) % len(others):
        return blocks
    turn = len(blocks) // len(others)
    kinds = [tuple(classes[0][i] for i in block) for block in blocks]
    if len({tuple(classes[1][i] for i in block) for block in others}) > 1 or \
            len(set(kinds[:turn])) != turn or \
            any(kinds[k] != kinds[k % turn] for k in range(len(kinds))):
        return blocks
    return [[i for block in blocks[k:k + turn] for i in block]
            for k in range(0, len(blocks), turn)]


class _Aligner:
    """Pairs target groups with source groups (indices), step by step."""

    def __init__(self, a: list[_Group], b: list[_Group], fits: Fits, *,
                 source_ordered: bool) -> None:
        self.a, self.b = a, b
        self.fits = fits
        self.source_ordered = source_ordered
        sig_a = [g.signature() for g in a]
        sig_b = [g.signature() for g in b]
        ids_a = {s: k for k, s in enumerate(dict.fromkeys(sig_a))}
        ids_b = {s: k for k, s in enumerate(dict.fromkeys(sig_b))}
        rep_a = {ids_a[s]: g for s, g in zip(sig_a, a, strict=True)}
        rep_b = {ids_b[s]: g for s, g in zip(sig_b, b, strict=True)}
        table = np.zeros((len(ids_a), len(ids_b)), dtype=bool)
        for ka, ga in rep_a.items():
            for kb, gb in rep_b.items():
                pairs = _paired(ga.tensors, gb.tensors)
                table[ka, kb] = pairs is not None and all(fits(s, t) for t, s in pairs)
        self.table = table
        self.classes = ([ids_a[s] for s in sig_a], [ids_b[s] for s in sig_b])
        self.shapes = table[np.ix_(*self.classes)]
        self.match = self.shapes
        self.pairs: dict[int, int] = {}

    def _take(self, i: int, j: int) -> None:
        self.pairs[i] = j

    def keep_sides(self, contexts: tuple[list[tuple[str, ...]], list[tuple[str, ...]]], *,
                   set_aside: frozenset[str] = frozenset()) -> None:
        """Only modules of the same sides fit (an encoder's never a decoder's), where named.

        Args:
            contexts: Each module's contexts on each side, those both sides name only.
            set_aside: Contexts not kept apart (:data:`PLACES`, for what is left).
        """
        kept = [[tuple(c for c in cs if c not in set_aside) for cs in side] for side in contexts]
        if not any(kept[0]) and not any(kept[1]):
            self.match = self.shapes
            return
        ids: dict[tuple[str, ...], int] = {}
        side_a, side_b = (np.array([ids.setdefault(cs, len(ids)) for cs in side], dtype=np.int64)
                          for side in kept)
        self.match = self.shapes & (side_a[:, None] == side_b[None, :])

    def _free(self) -> tuple[list[int], list[int]]:
        used = set(self.pairs.values())
        return ([i for i in range(len(self.a)) if i not in self.pairs],
                [j for j in range(len(self.b)) if j not in used])

    def _unique(self, rows: list[int], cols: list[int]) -> list[tuple[int, int]]:
        """Pairs that fit each other and nothing else among ``rows`` x ``cols``."""
        if not rows or not cols:
            return []
        sub = self.match[np.ix_(rows, cols)]
        alone = (sub.sum(axis=1) == 1)[:, None] & (sub.sum(axis=0) == 1)[None, :] & sub
        return [(rows[r], cols[c]) for r, c in zip(*np.nonzero(alone), strict=True)]

    def _by_class(self, sides: tuple[list[tuple[str, ...]], list[tuple[str, ...]]]) -> None:
        """For a sorted source: pair each shape class in order, where its order is known.

        A class is split by the contexts that name where a module sits (``encoder``,
        ``decoder``, ``cross``...; :data:`~torchgraft.graft.layouts.conventions.CONTEXTS`, those
        both sides name): an encoder's blocks pair with the encoder's, whatever letters order them.
        """
        side_a, side_b = sides
        classes_a: dict[tuple[tuple[bool, ...], tuple[str, ...]], list[int]] = {}
        for i in range(len(self.a)):
            classes_a.setdefault((tuple(self.match[i]), side_a[i]), []).append(i)
        for (fits_row, side), rows in classes_a.items():
            cols = [j for j, fit in enumerate(fits_row) if fit and side_b[j] == side]
            if not cols or len(cols) != len(rows):
                continue
            if any([i for i in np.nonzero(self.match[:, j])[0] if side_a[i] == side] != rows
                   for j in cols):
                continue  # a source module of the class fits other target modules too
            if _in_order([self.b[j] for j in cols]):
                for i, j in zip(rows, cols, strict=True):
                    self._take(i, j)

    def solve(self, rows: list[int], cols: list[int]) -> None:
        """Align a stretch: certain LCS pairs, then unique fits, then the stretches between."""
        if not rows or not cols:
            return
        match = self.match[np.ix_(rows, cols)]
        if not match.any():
            return
        fwd, bwd = _lcs_tables(match)
        best = int(fwd[-1, -1])
        usable = match & (fwd[:-1, :-1] + 1 + bwd[1:, 1:] == best)
        ii, jj = np.nonzero(usable)
        ranks = fwd[ii, jj]
        counts = np.bincount(ranks, minlength=best)
        certain = [(rows[i], cols[j]) for i, j, r in zip(ii, jj, ranks, strict=True)
                   if counts[r] == 1]
        if not certain:
            self._solve_unique(rows, cols)
            return
        for i, j in certain:
            self._take(i, j)
        bounds = [(-1, -1), *sorted(certain), (len(self.a), len(self.b))]
        for (i0, j0), (i1, j1) in itertools.pairwise(bounds):
            self.solve([r for r in rows if i0 < r < i1], [c for c in cols if j0 < c < j1])

    def _solve_unique(self, rows: list[int], cols: list[int]) -> None:
        """No certain LCS pair: take the unique fits, then solve what they leave."""
        unique = self._unique(rows, cols)
        for i, j in unique:
            self._take(i, j)
        if unique:
            taken = {i for i, _ in unique}, {j for _, j in unique}
            self.solve([r for r in rows if r not in taken[0]],
                       [c for c in cols if c not in taken[1]])

    def _neighbours(self) -> bool:
        """Pair the unpaired neighbours of paired modules, under the same parents.

        Only where nothing else is left to choose: no other unpaired module under the source
        parent fits the target neighbour, and none under the target parent fits the source one.
        """
        used = set(self.pairs.values())
        found = False
        for i, j in list(self.pairs.items()):
            for step in (1, -1):
                ni, nj = i + step, j + step
                if not (0 <= ni < len(self.a) and 0 <= nj < len(self.b)):
                    continue
                if ni in self.pairs or nj in used or not self.match[ni, nj]:
                    continue
                parent_a, parent_b = self.a[i].parent, self.b[j].parent
                if self.a[ni].parent != parent_a or self.b[nj].parent != parent_b:
                    continue
                rivals_b = [k for k, g in enumerate(self.b) if g.parent == parent_b
                            and k not in used and self.match[ni, k]]
                rivals_a = [k for k, g in enumerate(self.a) if g.parent == parent_a
                            and k not in self.pairs and self.match[k, nj]]
                if rivals_b != [nj] or rivals_a != [ni]:
                    continue
                self._take(ni, nj)
                used.add(nj)
                found = True
        return found

    def _by_units(self, ua: _Units, ub: _Units) -> tuple[list[int], list[int]]:
        """Pair numbered blocks in order, then align each pair's modules within it.

        Only when both sides have as many blocks in each context (an encoder's, a decoder's)
        and each block's modules can all fill the other's (a deeper or otherwise shaped
        checkpoint aligns module by module). Inside a block, the order of use may differ (a
        parallel residual runs its MLP first): aligning block by block keeps a module from
        pairing with another block's.

        Returns:
            The target and source modules outside those blocks.
        """
        blocks = self._alike_blocks(ua, ub)
        if not blocks:
            return list(range(len(self.a))), list(range(len(self.b)))
        for rows, cols in blocks:
            self.solve(rows, cols)
            self._solve_unique([i for i in rows if i not in self.pairs],
                               [j for j in cols if j not in set(self.pairs.values())])
        inside_a = {i for rows, _ in blocks for i in rows}
        inside_b = {j for _, cols in blocks for j in cols}
        return ([i for i in range(len(self.a)) if i not in inside_a],
                [j for j in range(len(self.b)) if j not in inside_b])

    def _alike_blocks(self, ua: _Units, ub: _Units) -> list[tuple[list[int], list[int]]]:
        """The blocks paired in order (:func:`_blocks`), where every pair is alike."""
        blocks = _blocks(ua, ub)
        if len(blocks) < 2 or not all(_alike(self.match, rows, cols) for rows, cols in blocks):
            return []
        return blocks

    def run(self, ua: _Units, ub: _Units) -> None:
        """All steps, until nothing more pairs.

        A source of sorted names pairs shape classes in order where names order them, then
        what is left inside each pair of blocks (by roles, the only fit, else in order) where
        its blocks of each context are numbered in one container (their numbers order them;
        two containers' letters would not).
        """
        if self.source_ordered:
            self.solve(*self._by_units(ua, ub))
        else:
            self._by_class((ua.context, ub.context))
            blocks = self._alike_blocks(ua, ub)
            containers: dict[tuple[str, ...], set[str]] = {}
            for _, cols in blocks:
                for j in cols:
                    containers.setdefault(ub.context[j], set()).add(
                        _DIGITS.sub("#", _outermost(ub.unit[j])))
            for rows, cols in blocks if all(len(c) == 1 for c in containers.values()) else []:
                taken = set(self.pairs.values())
                _pair_in_scope(self, [i for i in rows if i not in self.pairs],
                               [j for j in cols if j not in taken], ua, ub)
        self.take_unique()

    def take_unique(self) -> None:
        """Pair what fits only each other among all that is left, until nothing more pairs.

        For a real order, the neighbours of pairs too (:meth:`_neighbours`).
        """
        while True:
            unique = self._unique(*self._free())
            for i, j in unique:
                self._take(i, j)
            found = self._neighbours() if self.source_ordered else False
            if not found and not unique:
                return


def _out_channels(group: _Group) -> int | None:
    """A convolution's output channels (its weight has 3 dimensions or more), else None."""
    weight = next((t for t in group.tensors if _leaf(t) == "weight"), None)
    if weight is None or len(weight.shape) < 3 or weight.kind not in ("conv", None):
        return None
    return weight.shape[0]


def _norm_size(group: _Group) -> int | None:
    """A norm's width (every tensor of it 1-D), else None."""
    weight = next((t for t in group.tensors if _leaf(t) == "weight"), None)
    if weight is None or weight.kind not in ("norm", None) or any(
            len(t.shape) != 1 for t in group.tensors):
        return None
    return weight.shape[0]


def _anchors(groups: list[_Group], *, ordered: bool) -> tuple[list[int | None], set[int]]:
    """The convolution each norm normalises (a group index), where names or order tell.

    Under the norm's parent, the only convolution whose output channels are the norm's width
    (``expansion.expand_conv`` for ``expansion.expand_bn``); else, where the side's order is
    real, the one right before it (``_expand_conv`` before ``_bn0``): those norms are returned
    apart, as known by order (a convention of code bases, not a fact of a file). A norm that
    a real order puts right after another convolution of its width than its parent's has
    none: the two signals disagree.
    """
    convs: dict[str, list[int]] = {}
    for k, group in enumerate(groups):
        if _out_channels(group) is not None:
            convs.setdefault(group.parent, []).append(k)
    found: list[int | None] = []
    by_order: set[int] = set()
    for k, group in enumerate(groups):
        size = _norm_size(group)
        fitting = [c for c in convs.get(group.parent, ()) if _out_channels(groups[c]) == size]
        before = k - 1 if ordered and k and size is not None and \
            _out_channels(groups[k - 1]) == size else None
        if len(fitting) == 1 and before not in (None, fitting[0]):
            found.append(None)  # its parent names one convolution, a real order another
            continue
        found.append(fitting[0] if len(fitting) == 1 else
                     k - 1 if ordered and k - 1 in fitting else None)
        if len(fitting) != 1 and found[-1] is not None:
            by_order.add(k)
    return found, by_order


#: Roles a module's kind says where its name says none: an ``nn.Embedding`` embeds.
_KIND_ROLES = {"embedding": "embed"}


def _with_kind_role(parts: tuple[tuple[str, ...], str | None],
                    group: _Group) -> tuple[tuple[str, ...], str | None]:
    """A module's contexts and role; its kind's role where its name says none."""
    contexts, own = parts
    if own is None:
        kinds = {t.kind for t in group.tensors} & _KIND_ROLES.keys()
        kind = kinds.pop() if len(kinds) == 1 else None
        own = _KIND_ROLES[kind] if kind is not None else None
    return contexts, own


class _Units:
    """One side's groups: units (aligned), blocks (judged), roles, classes, norms' convolutions."""

    def __init__(self, groups: list[_Group], classes: list[int], *, ordered: bool,
                 numbers: Mapping[str, tuple[str, int]] | None = None) -> None:
        children: dict[str, set[str]] = {}
        for g in groups:
            children.setdefault(g.parent, set()).add(g.path.rpartition(".")[2])
        self.paths = [g.path for g in groups]
        self.unit = [unit_of(g.path) for g in groups]
        self.block = [_block_of(g.path) for g in groups]
        self.parts = [_with_kind_role(role_parts(g.path, frozenset(children[g.parent])), g)
                      for g in groups]
        self.role = [joined_role(*p) for p in self.parts]
        self.context = [contexts for contexts, _ in self.parts]
        self.kept: set[str] = set()
        self.cls = classes
        self.ordered = ordered
        self.anchor, self.anchored_by_order = _anchors(groups, ordered=ordered)
        numbers = numbers or {}
        self.numbers = [next((numbers[t.name] for t in g.tensors if t.name in numbers), None)
                        for g in groups]

    def filed(self, x: int, x2: int) -> bool:
        """Whether the file numbers two modules as siblings (Keras' ``dense``, ``dense_1``)."""
        a, b = self.numbers[x], self.numbers[x2]
        return a is not None and b is not None and a[0] == b[0] and a[1] != b[1]

    def blocks(self, *, outermost: bool = False) -> dict[tuple[str, ...], list[list[int]]]:
        """Numbered blocks (units) by the contexts of their path: each block's groups.

        Blocks are in order of first use, the root apart; the contexts kept are those both
        sides name (an encoder's blocks, a vision tower's). With ``outermost``, a block is a
        module's outermost numbered ancestor instead of its nearest.
        """
        found: dict[str, list[int]] = {}
        for k, unit in enumerate(self.unit):
            if unit:
                found.setdefault(_outermost(unit) if outermost else unit, []).append(k)
        sides: dict[tuple[str, ...], list[list[int]]] = {}
        for unit, members in found.items():
            key = tuple(c for c in role_parts(unit)[0] if c in self.kept)
            sides.setdefault(key, []).append(members)
        return sides

    def contexts(self) -> set[str]:
        """Every context this side's paths name."""
        return {c for contexts, _ in self.parts for c in contexts}

    def keep_contexts(self, kept: set[str]) -> None:
        """Roles with only the contexts both sides name (one side's ``encoder.`` says nothing)."""
        self.kept = kept
        self.context = [tuple(c for c in contexts if c in kept) for contexts, _ in self.parts]
        self.role = [joined_role(context, own)
                     for context, (_, own) in zip(self.context, self.parts, strict=True)]


def _block_of(path: str) -> str:
    """A module's block, where siblings are judged: its nearest ancestor numbered by a number.

    ``layer1.0``; timm's ``s1.b2.conv3.bn`` and ``s1.b2.downsample.bn`` share the root, so
    that names and stored order are weighed between them, as between any siblings.
    """
    parts = path.split(".")[:-1]
    last = max((k for k, part in enumerate(parts) if part.isdigit()), default=-1)
    return ".".join(parts[: last + 1])


def _prefix(paths: list[str]) -> str:
    """The common dotted prefix of paths (``a.b.c``, ``a.b.d`` -> ``a.b``)."""
    common: list[str] = []
    for column in zip(*(p.split(".") for p in paths), strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return ".".join(common)


def _common(paths: list[str]) -> str:
    """The deepest module that holds every path (a lone path: its parent)."""
    prefix = _prefix(paths)
    shortest = min(p.count(".") for p in paths)
    return ".".join(prefix.split(".")[:shortest]) if prefix else ""


def _stem(path: str, scope: str) -> str:
    return _DIGITS.sub("#", path[len(scope):])


@dataclass
class _Scope:
    """Pairs whose modules share one side's unit, seen from both sides.

    ``own`` is that side, ``other`` the other; stems are paths below the unit (own) and below
    the deepest module holding the partners (other), digits as ``#``.
    """

    own: _Units
    other: _Units
    pairs: list[tuple[int, int]]  # (own group, other group)
    partner: dict[int, int]  # every own group paired, to its partner
    stems: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unit = self.own.block[self.pairs[0][0]]
        scope = _common([self.other.paths[k] for _, k in self.pairs])
        for i, k in self.pairs:
            self.stems[(i, k)] = (_stem(self.own.paths[i], unit),
                                  _stem(self.other.paths[k], scope))


def _scopes(pairs: dict[int, int], ua: _Units, ub: _Units, *,
            sides: tuple[bool, ...] = (True, False)) -> list[_Scope]:
    """Every unit of the target side (True) and of the source side (False), with its pairs."""
    found = []
    back = {j: i for i, j in pairs.items()}
    for target_side in sides:
        units: dict[str, list[tuple[int, int]]] = {}
        for i, j in pairs.items():
            if target_side:
                units.setdefault(ua.block[i], []).append((i, j))
            else:
                units.setdefault(ub.block[j], []).append((j, i))
        own, other = (ua, ub) if target_side else (ub, ua)
        partner = pairs if target_side else back
        found += [_Scope(own, other, items, partner) for items in units.values()]
    return found


def _repair(pairs: dict[int, int], ua: _Units, ub: _Units) -> None:
    """Re-pair same-shape pairs of a unit by their roles, then by their numbers.

    Scopes of one side hold disjoint pairs, so each side's are found afresh after the other's
    were repaired.
    """
    for repair in (_repair_roles, _repair_anchors, _repair_numbers):
        for target_side in (True, False):
            for scope in _scopes(pairs, ua, ub, sides=(target_side,)):
                repair(pairs, scope, target_side=target_side)


def _set(pairs: dict[int, int], own: int, other: int, *, target_side: bool) -> None:
    if target_side:
        pairs[own] = other
    else:
        pairs[other] = own


def _repair_roles(pairs: dict[int, int], scope: _Scope, *, target_side: bool) -> None:
    """Swap two pairs of a unit when that gives one of them the only partner of its role."""
    own, other = scope.own, scope.other
    current = dict(scope.pairs)
    by_role: dict[tuple[str, int], list[int]] = {}
    for _, k in scope.pairs:
        if other.role[k] is not None:
            by_role.setdefault((other.role[k] or "", other.cls[k]), []).append(k)
    partner_of = {k: i for i, k in current.items()}
    for i in list(current):
        k = current[i]  # as the swaps before it left it
        wanted = by_role.get((own.role[i] or "", other.cls[k]), [])
        if own.role[i] is None or other.role[k] == own.role[i] or len(wanted) != 1:
            continue
        i2 = partner_of[wanted[0]]
        if own.cls[i2] != own.cls[i] or own.role[i2] == other.role[wanted[0]]:
            continue
        current[i], current[i2] = wanted[0], k
        partner_of[wanted[0]], partner_of[k] = i, i2
    for i, k in current.items():
        _set(pairs, i, k, target_side=target_side)


def _repair_anchors(pairs: dict[int, int], scope: _Scope, *, target_side: bool) -> None:
    """Swap two same-shape norms of a unit when that pairs each with its convolution's partner."""
    own, other = scope.own, scope.other
    current = dict(scope.pairs)
    partner_of = {k: i for i, k in current.items()}
    for i in list(current):
        k = current[i]  # as the swaps before it left it
        conv = own.anchor[i]
        if conv is None or conv not in scope.partner or _anchored(scope, i, k):
            continue
        wanted = [k2 for k2 in partner_of if other.anchor[k2] == scope.partner[conv]
                  and other.cls[k2] == other.cls[k]]
        i2 = partner_of[wanted[0]] if len(wanted) == 1 else None
        if i2 is None or own.cls[i2] != own.cls[i] or _anchored(scope, i2, wanted[0]):
            continue
        current[i], current[i2] = wanted[0], k
        partner_of[wanted[0]], partner_of[k] = i, i2
    for i, k in current.items():
        _set(pairs, i, k, target_side=target_side)


def _repair_numbers(pairs: dict[int, int], scope: _Scope, *, target_side: bool) -> None:
    """Within a unit, pairs of numbered siblings follow their numbers on both sides."""
    groups: dict[tuple[str, str, int, int], list[tuple[int, int]]] = {}
    for i, k in scope.pairs:
        stems = scope.stems[(i, k)]
        if "#" in stems[0] and "#" in stems[1]:
            groups.setdefault((*stems, scope.own.cls[i], scope.other.cls[k]), []).append((i, k))
    for items in groups.values():
        owns = sorted((i for i, _ in items), key=lambda i: natural_key(scope.own.paths[i]))
        others = sorted((k for _, k in items), key=lambda k: natural_key(scope.other.paths[k]))
        for i, k in zip(owns, others, strict=True):
            _set(pairs, i, k, target_side=target_side)


#: Why a swap is ruled out by the models' own structure (a norm's convolution, the only one of
#: its width under its parent, paired); else by conventions of code bases, said as the signals
#: that told the pairs apart (:data:`ROLES`, :data:`NUMBERS`, :data:`AFTER_CONVOLUTION`).
STRUCTURE = "structure"
#: The conventions of code bases a guess's reason names: only those that told its pair apart.
ROLES, NUMBERS = "the roles in their names", "the numbers in their names"
AFTER_CONVOLUTION = "a norm right after its convolution in stored order"


#: A part of a fused tensor split by torchgraft (``mlp.gate_up_proj[1]``).
_PART = re.compile(r"\[\d+\]$")


def _ruled_out(scope: _Scope, p: tuple[int, int], q: tuple[int, int]) -> str | None:
    """Why swapping the partners of ``p`` and ``q`` is forbidden, if it is.

    The models' structure rules a swap out (a norm's convolution, the only one of its width
    under its parent, paired; a fused tensor's part, whose name states its place). Else the
    signals that single ``p`` out are counted by family: the names (roles, or numbers that
    both sides' siblings differ by) and the order both sides really store their modules in (a
    file's, a model's; a norm right after its convolution). Two families that agree, none
    against, are evidence: :data:`STRUCTURE`. One alone, or one against another, is a
    convention of code bases, said as the signals that told the pairs apart.

    Returns:
        :data:`STRUCTURE`, or the conventions that singled ``p`` out (``"the numbers in their
        names"``), else ``None`` (nothing tells them apart).
    """
    found = _by_roles_and_convolutions(scope, p, q)
    if found == STRUCTURE:
        return STRUCTURE
    numbers = _by_numbers(scope, p, q)
    names = found == _NAMES or numbers == [NUMBERS]
    order = found == _ORDER or len(numbers) > 1
    signals = [ROLES] if found == _NAMES else [AFTER_CONVOLUTION] if found == _ORDER else []
    said = " and ".join(dict.fromkeys(signals + numbers))
    stored = _stored_order(scope, p, q)
    if stored is False and (names or order):  # the names say one thing, the order another
        return f"{said}, against the order both sides store them in"
    if stored and names:
        return STRUCTURE
    return said if names or order else None


def _by_numbers(scope: _Scope, p: tuple[int, int], q: tuple[int, int]) -> list[str]:
    """What numbers in names say for ``p`` against ``q``: the signals that agree, or none.

    Numbers on both sides (siblings that differ only by them, in the same order):
    :data:`NUMBERS`, a family of names. A file that numbers its modules itself (Keras keys
    the layers of one class in a list ``dense``, ``dense_1``... in the model's order, whatever
    their own names: :attr:`~torchgraft.graft.tensors.Side.numbers`) numbers them as names do.
    Numbers on one side and, on the other, norms that each follow their convolution in a real
    order: both signals, a family of order. Order alone, or numbers against the convolutions,
    says nothing.
    """
    own, other = scope.own, scope.other
    (i, k), (i2, k2) = p, q
    (own_p, other_p), (own_q, other_q) = scope.stems[p], scope.stems[q]
    named = own_p == own_q and "#" in own_p, other_p == other_q and "#" in other_p
    filed = own.filed(i, i2), other.filed(k, k2)
    numbered = named[0] or filed[0], named[1] or filed[1]
    against = _anchored(scope, i, k) is False or _anchored(scope, i2, k2) is False
    if not any(numbered) or against:
        return []
    before = _before(own, named[0], i, i2, filed=filed[0])
    after = _before(other, named[1], k, k2, filed=filed[1])
    if before is None or before != after:
        return []
    return [NUMBERS] if all(numbered) else [NUMBERS, AFTER_CONVOLUTION]


#: Which family of signals :func:`_by_roles_and_convolutions` found (both: names).
_NAMES, _ORDER = "names", "order"


def _by_roles_and_convolutions(scope: _Scope, p: tuple[int, int],
                               q: tuple[int, int]) -> str | None:
    """What roles and norms' convolutions say against swapping ``p`` and ``q``.

    Returns:
        :data:`STRUCTURE` (a convolution found under its parent, a fused tensor's part);
        :data:`_NAMES` (roles agree with ``p`` only); :data:`_ORDER` (a norm right after its
        convolution, in stored order); else ``None``.
    """
    own, other = scope.own, scope.other
    (_, k), (_, k2) = p, q
    found = None
    for (x, y), y2 in ((p, k2), (q, k)):
        if _anchored(scope, x, y) and _anchored(scope, x, y2) is False:
            if not ({x} & own.anchored_by_order or {y, y2} & other.anchored_by_order):
                return STRUCTURE
            found = found or _ORDER
        if own.role[x] is not None and own.role[x] == other.role[y] != other.role[y2]:
            if _PART.search(own.paths[x]) or _PART.search(other.paths[y]):
                return STRUCTURE  # a fused tensor's part: its name states the order
            found = _NAMES
    return found


def _stored_order(scope: _Scope, p: tuple[int, int], q: tuple[int, int]) -> bool | None:
    """Whether both sides store the two pairs' modules in the same order (``None``: unknown).

    Only where both orders are real: a model's, or a file that keeps its order of definition
    (a ``.pt``, a ``.pdparams``), never one recovered from sorted names.
    """
    if not (scope.own.ordered and scope.other.ordered):
        return None
    (i, k), (i2, k2) = p, q
    return (i < i2) == (k < k2)


def _anchored(scope: _Scope, x: int, y: int) -> bool | None:
    """Whether norms ``x`` (own) and ``y`` (other) normalise paired convolutions; None: unknown."""
    conv, other_conv = scope.own.anchor[x], scope.other.anchor[y]
    if conv is None or other_conv is None or conv not in scope.partner:
        return None
    return scope.partner[conv] == other_conv


def _before(units: _Units, numbered: bool, x: int, x2: int, *,
            filed: bool = False) -> bool | None:
    """Whether ``x`` comes before ``x2`` on its side, where that is known.

    Numbers in their names order siblings that differ only by them (``bn1``, ``bn2``,
    ``_bn0``), and so do the numbers a file gives them itself (``filed``: Keras' ``dense``,
    ``dense_1``); a real order of definition or use orders norms that each follow their
    convolution (against numbered ones on the other side only). Else ``None``.
    """
    if numbered:
        return natural_key(units.paths[x]) < natural_key(units.paths[x2])
    if filed:
        a, b = units.numbers[x], units.numbers[x2]
        return a is not None and b is not None and a[1] < b[1]
    if units.ordered and units.anchor[x] is not None and units.anchor[x2] is not None:
        return x < x2
    return None


def _named_alike(scope: _Scope, p: tuple[int, int], q: tuple[int, int]) -> bool:
    """Whether pair ``p``'s modules have one name on both sides, and ``q``'s partner another."""
    (i, k), (_, k2) = p, q
    name = scope.own.paths[i].rpartition(".")[2]
    return not name.isdigit() and name == scope.other.paths[k].rpartition(".")[2] != \
        scope.other.paths[k2].rpartition(".")[2]


class _Judge:
    """Which pairs are guesses: another pair of the same unit could swap with them.

    Two pairs can swap when their modules share a unit on one side and each fits the other's
    partner. Roles rule a swap out (a pair's roles agree, the swap's would not), and so do
    numbers (both sides differ only by numbers, ``bn1``/``bn2`` and ``layer.0``/``layer.1``,
    and the pairs follow them). An unpaired source module of the unit that fits is an
    alternative too.
    """

    def __init__(self, aligner: _Aligner, ua: _Units, ub: _Units, *,
                 trust_conventions: bool = True) -> None:
        self.aligner, self.ua, self.ub = aligner, ua, ub
        self.trust_conventions = trust_conventions
        self.by_convention: dict[int, str] = {}  # group to the conventions that told it apart
        self.free: dict[str, list[int]] = {}
        for j in aligner._free()[1]:
            self.free.setdefault(ub.block[j], []).append(j)

    def _fits(self, i: int, j: int) -> bool:
        return bool(self.aligner.table[self.ua.cls[i], self.ub.cls[j]])

    def _role_rules_out(self, i: int, j: int, k: int) -> bool:
        """Whether roles rule out ``k`` for ``i``: ``i`` and ``j`` agree, ``k`` does not."""
        role = self.ua.role[i]
        return role is not None and role == self.ub.role[j] != self.ub.role[k]

    def _swaps(self, scope: _Scope) -> dict[int, list[int]]:
        """Target group to the source groups it could swap with, within one scope."""
        found: dict[int, list[int]] = {}
        buckets: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, k in scope.pairs:
            buckets.setdefault((scope.own.cls[i], scope.other.cls[k]), []).append((i, k))
        for p in scope.pairs:
            for q in (q for items in buckets.values() for q in items):
                if q == p:
                    continue
                i, j = p if scope.own is self.ua else p[::-1]
                i2, j2 = q if scope.own is self.ua else q[::-1]
                if not (self._fits(i, j2) and self._fits(i2, j)) or _named_alike(scope, p, q):
                    continue
                why = _ruled_out(scope, p, q)
                if why is None:
                    found.setdefault(i, []).append(j2)
                elif why != STRUCTURE and not self.trust_conventions:
                    found.setdefault(i, []).append(j2)
                    self.by_convention.setdefault(i, why)
        return found

    def guesses(self) -> dict[int, list[int]]:
        """Target group to the other source groups it could have been paired with."""
        found: dict[int, list[int]] = {}
        for scope in _scopes(self.aligner.pairs, self.ua, self.ub):
            for i, others in self._swaps(scope).items():
                found.setdefault(i, []).extend(j for j in others if j not in found[i])
        for i, j in self.aligner.pairs.items():
            free = [k for k in self.free.get(self.ub.block[j], ())
                    if self._fits(i, k) and not self._role_rules_out(i, j, k)]
            if free:
                found.setdefault(i, []).extend(free)
        self._outvoted(found)
        return found

    def _outvoted(self, found: dict[int, list[int]]) -> None:
        """Pairs whose source block is not where the rest of their block went: guesses.

        A target block's modules mostly pair into one source block; one paired into another
        block is a guess, with the same-shape modules of the block the others went to as its
        alternatives, and the target modules those fill have its partner as theirs (a swap
        between two blocks is one guess seen from both of its pairs).
        """
        pairs = self.aligner.pairs
        votes: dict[str, Counter[str]] = {}
        for i, j in pairs.items():
            votes.setdefault(self.ua.block[i], Counter())[self.ub.block[j]] += 1
        holder = {j: i for i, j in pairs.items()}
        members: dict[str, list[int]] = {}
        for k, block in enumerate(self.ub.block):
            members.setdefault(block, []).append(k)
        for i, j in pairs.items():
            unit_votes = votes[self.ua.block[i]]
            most = max(unit_votes.values())
            if unit_votes[self.ub.block[j]] >= most:
                continue
            mine = found.get(i, [])
            for block in (b for b, n in unit_votes.items() if n == most):
                for k in members.get(block, ()):
                    if k != j and k not in mine and self._fits(i, k):
                        mine = found.setdefault(i, mine)  # a pair with nothing to swap stays
                        mine.append(k)
                        other = holder.get(k)
                        if other is not None and self._fits(other, j) and \
                                j not in found.setdefault(other, []):
                            found[other].append(j)


def _fill_by_units(aligner: _Aligner, ua: _Units, ub: _Units,
                   before: Mapping[str, str]) -> None:
    """Pair what is left inside units already aligned: by role, else same-shape in order.

    A target unit is aligned with the deepest source module holding the partners of its
    pairs, this alignment's and those made ``before`` it (target key to source name; several
    small target units may share one; the roots hold each other); a unit with no pairs of its
    own, with its nearest numbered ancestor's (a norm numbered inside its layer). Inside it,
    a free target module takes the only free source module of its role that fits, or the only
    one that fits at all where it is the only one that fits it (a stem's norm and a head's,
    outside the blocks); then, where as many free modules are left on each side and each fits
    every other, they pair in order (guesses, which the judge reports as such).
    """
    partners: dict[str, set[str]] = {}
    unit_pairs = [(ua.unit[i], ub.unit[j]) for i, j in aligner.pairs.items()]
    unit_pairs += [(unit_of(owner(t)), unit_of(owner(s))) for t, s in before.items()]
    for unit, other in unit_pairs:
        for outer in _outward(unit):
            partners.setdefault(outer, set()).add(other)
    scope_of = {unit: _prefix(list(units)) for unit, units in partners.items()}
    scope_of.setdefault("", "")
    free_a, free_b = aligner._free()
    rows_of: dict[str, list[int]] = {}
    for i in free_a:
        known = [u for u in _outward(ua.unit[i]) if u in scope_of]
        if known:
            rows_of.setdefault(scope_of[known[0]], []).append(i)
    cols_of: dict[str, list[int]] = {}
    for j in free_b:
        for scope in _ancestors(ub.paths[j]) if ub.unit[j] else ("",):
            if scope in rows_of:
                cols_of.setdefault(scope, []).append(j)
    for scope, rows in rows_of.items():
        _pair_in_scope(aligner, rows, cols_of.get(scope, []), ua, ub)


def _outward(unit: str) -> list[str]:
    """A unit, then its numbered ancestors, nearest first (``a.0.b.1``, ``a.0``)."""
    parts = unit.split(".")
    return [unit, *(".".join(parts[:k + 1]) for k in range(len(parts) - 2, -1, -1)
                    if numbered(parts[k]))] if unit else [""]


def _pair_in_scope(aligner: _Aligner, rows: list[int], cols: list[int], ua: _Units,
                   ub: _Units) -> None:
    """Pair free modules of one aligned scope: by role, by the only fit, else in order.

    In order: each set of modules that fit the same ones (a shape class), where as many are
    left on each side and they fit only each other (guesses, which the judge reports).
    """
    left = _by_role(aligner, rows, cols, ua, ub)
    taken = set(aligner.pairs.values())
    rows = [i for i in rows if i not in aligner.pairs]
    cols = [j for j in left if j not in taken]
    for i, j in aligner._unique(rows, cols):  # the only fit of each other in the scope
        aligner.pairs[i] = j
    _in_order_by_class(aligner, [i for i in rows if i not in aligner.pairs],
                       [j for j in cols if j not in set(aligner.pairs.values())])


def _in_order_by_class(aligner: _Aligner, rows: list[int], cols: list[int]) -> None:
    """Pair each set of rows fitting the same columns, as many, with them in order."""
    classes: dict[tuple[int, ...], list[int]] = {}
    for i in rows:
        classes.setdefault(tuple(j for j in cols if aligner.match[i, j]), []).append(i)
    for fitting, members in classes.items():
        if fitting and len(fitting) == len(members) and not any(
                aligner.match[i, j] for i in rows if i not in members for j in fitting):
            for i, j in zip(members, fitting, strict=True):
                aligner.pairs[i] = j


def _ancestors(path: str) -> list[str]:
    """Every module above a path, the root excluded: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = path.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _by_role(aligner: _Aligner, rows: list[int], cols: list[int], ua: _Units,
             ub: _Units) -> list[int]:
    """Pair rows with the only column of their role that fits; return the columns left."""
    by_role: dict[str, list[int]] = {}
    for j in cols:
        by_role.setdefault(ub.role[j] or "", []).append(j)
    wanted = Counter(ua.role[i] for i in rows)
    for i in rows:
        role = ua.role[i]
        found = [j for j in by_role.get(role or "", ()) if aligner.match[i, j]]
        if role is not None and wanted[role] == 1 and len(found) == 1:
            aligner.pairs[i] = found[0]
    taken = set(aligner.pairs.values())
    return [j for j in cols if j not in taken]


def _guess(a: _Group, b: list[_Group], others: list[int], leaf: str, *,
           convention: str | None = None) -> Guess:
    why = (f"{len(others) + 1} modules of the checkpoint's block fit '{a.path}' and only two "
           f"code bases' conventions ({convention}) tell which is which"
           if convention else
           f"{len(others) + 1} modules of the checkpoint's block fit '{a.path}' and neither "
           "their names nor their numbers tell which is which")
    return Guess(tuple(_key_of(b[k], leaf) for k in others), why)


def _key_of(group: _Group, leaf: str) -> str:
    """The key of a group's tensor of ``leaf`` (a bare parameter's group: its one tensor)."""
    return next((t.name for t in group.tensors if _leaf(t) == leaf), group.tensors[0].name)


def align(targets: list[str], sources: list[str], target_infos: dict[str, TensorInfo],
          source_infos: dict[str, TensorInfo], fits: Fits,
          bookkeeping: Bookkeeping = lambda name: False, *,
          source_ordered: bool = True, trust_conventions: bool = True,
          bare_apart: bool = False, before: Mapping[str, str] | None = None,
          source_numbers: Mapping[str, tuple[str, int]] | None = None) -> Alignment:
    """Align unmatched target and source tensors by structure.

    Args:
        targets: Unmatched target keys, in order of use.
        sources: Unmatched source keys, in order of use.
        target_infos: Target metadata.
        source_infos: Source metadata.
        fits: Whether a source tensor can fill a target tensor (shapes, layouts, kinds).
        bookkeeping: Whether a key is a bookkeeping buffer, left out of a module's size.
        source_ordered: False when the source's order was recovered from sorted names.
        trust_conventions: Whether roles and numbers of names settle a pair among same-shape
            siblings (a module source); else such pairs are guesses.
        bare_apart: Group each bare parameter (a leaf no torch module uses) on its own, as
            the module another code base may make of it (a second chance for what grouping
            by modules left).
        before: Pairs made before this alignment (target key to source name, as named in
            ``source_infos``): they align units too.
        source_numbers: Source key (as named in ``source_infos``) to the number its file
            gives its module (:attr:`~torchgraft.graft.tensors.Side.numbers`).

    Returns:
        The pairs that are certain, and why the others that could fit stayed unpaired.
    """
    a = _groups(targets, target_infos, bookkeeping, bare_apart=bare_apart)
    b = _groups(sources, source_infos, bookkeeping, bare_apart=bare_apart)
    if not a or not b:
        return Alignment({})
    judged, ua, ub = _prepared(a, b, fits, source_ordered=source_ordered,
                               numbers=source_numbers)
    moved, turns = _as_the_target(judged, ua, ub)
    # aligned in the order the target's shapes give the source's parts; judged in its own
    aligner, ta, tb = (judged, ua, ub) if moved == sorted(moved) else _prepared(
        a, [b[k] for k in moved], fits, source_ordered=source_ordered, numbers=source_numbers)
    subtrees = aligned_subtrees(ta.paths, tb.paths, partial(_whole, aligner.match))
    aligner.keep_sides((ta.context, tb.context))
    aligner.run(ta, tb)
    for rows, cols in subtrees:  # what is left inside modules that hold each other's
        taken = set(aligner.pairs.values())
        _pair_in_scope(aligner, [i for i in rows if i not in aligner.pairs],
                       [j for j in cols if j not in taken], ta, tb)
    _fill_by_units(aligner, ta, tb, before or {})
    aligner.keep_sides((ta.context, tb.context), set_aside=PLACES)
    aligner.take_unique()  # what is left, whatever the names say of its place in a block
    judged.pairs = {i: moved[j] for i, j in aligner.pairs.items()}
    loose = judged.match
    judged.keep_sides((ua.context, ub.context))
    _repair(judged.pairs, ua, ub)
    judge = _Judge(judged, ua, ub, trust_conventions=trust_conventions)
    guessed = judge.guesses()
    result = _paired_tensors(judged, guessed, judge.by_convention,
                             trust_conventions=trust_conventions,
                             turned=_turned_guesses(judged.pairs, loose, ub, turns, guessed,
                                                    targets=ua.paths))
    result.ambiguous = _ambiguous(judged)
    return result


def _as_the_target(aligner: _Aligner, ua: _Units, ub: _Units) -> tuple[list[int], list[Turn]]:
    """The source's groups in the order the target's shapes give its parts, and the turns.

    Children that pair one to one by shape take the target's order
    (:func:`~torchgraft.graft.plan.hierarchy.sibling_order`), then lists numbered the other
    way are turned (:func:`~torchgraft.graft.plan.numbering.turned`).
    """
    moved = sibling_order(ua.paths, ub.paths, partial(_whole, aligner.match))
    turns = turned(ua.paths, [ub.paths[k] for k in moved],
                   (aligner.classes[0], [aligner.classes[1][k] for k in moved]),
                   partial(_whole, aligner.match[:, moved]))
    if turns:
        moved = [moved[k] for k in turned_order([ub.paths[k] for k in moved], turns)]
    return moved, turns


def _prepared(a: list[_Group], b: list[_Group], fits: Fits, *, source_ordered: bool,
              numbers: Mapping[str, tuple[str, int]] | None) -> tuple[_Aligner, _Units, _Units]:
    """An aligner of two sides' groups and their units, fitting only within shared contexts.

    The contexts of a place in a block (:data:`PLACES`) are set aside until
    :meth:`_Aligner.keep_sides` keeps them.
    """
    aligner = _Aligner(a, b, fits, source_ordered=source_ordered)
    ua = _Units(a, aligner.classes[0], ordered=True)
    ub = _Units(b, aligner.classes[1], ordered=source_ordered, numbers=numbers)
    common = ua.contexts() & ub.contexts()
    ua.keep_contexts(common)
    ub.keep_contexts(common)
    aligner.keep_sides((ua.context, ub.context), set_aside=PLACES)
    return aligner, ua, ub


def _turned_guesses(pairs: dict[int, int], match: np.ndarray, ub: _Units, turns: list[Turn],
                    guessed: dict[int, list[int]], *,
                    targets: list[str]) -> dict[int, list[int]]:
    """Pairs of turned levels that only the order of the others made: their alternatives.

    A target level that several levels of the turned source container fit (all of one
    shape) took the one the turn gave it; the others are its alternatives, each by the same
    path below its level. Alternatives the judge found already are not repeated.
    """
    found: dict[int, list[int]] = {}
    levels_b, levels_a = containers(ub.paths), containers(targets)
    for turn in turns:
        source = levels_b[turn.source]
        level_of = {k: level for level in source for k in level.members}
        for t, rows in enumerate(levels_a[turn.target]):
            if t in turn.forced:
                continue
            others = [level for level in source if _whole(match, rows.members, level.members)]
            for i in rows.members:
                j = pairs.get(i)
                if j is None or j not in level_of:
                    continue
                stem = _stem(ub.paths[j], level_of[j].path)
                found[i] = [k for level in others if level is not level_of[j]
                            for k in level.members
                            if _stem(ub.paths[k], level.path) == stem
                            and k not in guessed.get(i, ())]
                if not found[i]:
                    del found[i]
    return found


def _paired_tensors(aligner: _Aligner, guessed: dict[int, list[int]],
                    by_convention: dict[int, str], *, trust_conventions: bool,
                    turned: dict[int, list[int]]) -> Alignment:
    """The tensor pairs of the module pairs, each with its evidence.

    A pair of modules known by structure makes its tensors known too, except same-shape
    tensors of the module under other leaf names that only one signal told apart, for a source
    that is not a module (:func:`_told_apart`): guesses, each other's alternatives; and pairs
    of levels numbered the other way that only the other levels' order made (``turned``).
    """
    a, b = aligner.a, aligner.b
    result = Alignment({})
    for i, j in aligner.pairs.items():
        found = [(t.name, s.name) for t, s in _paired(a[i].tensors, b[j].tensors) or ()]
        extra = {_leaf(s): s for s in b[j].bookkeeping}
        found += [(t.name, extra[_leaf(t)].name) for t in a[i].bookkeeping if _leaf(t) in extra]
        siblings = {} if trust_conventions else _told_apart(
            a[i].tensors, b[j].tensors, ordered=aligner.source_ordered)
        for target, source in found:
            result.pairs[target] = source
            result.evidence[target] = Evidence.GUESS \
                if i in guessed or i in turned or target in siblings else Evidence.STRUCTURE
            leaf = source.rpartition(".")[2]
            if i in guessed:
                result.guesses[target] = _guess(a[i], b, [*guessed[i], *turned.get(i, ())],
                                                leaf, convention=by_convention.get(i))
                if i in by_convention:
                    result.by_convention.add(target)
            elif i in turned:
                result.guesses[target] = Guess(tuple(_key_of(b[k], leaf) for k in turned[i]),
                                               _TURNED_LEVELS)
            elif target in siblings:
                result.guesses[target] = Guess(siblings[target], _SIBLING_TENSORS)
    return result


#: Why a level of a container numbered the other way is a guess.
_TURNED_LEVELS = ("the checkpoint numbers these levels the other way from the model (the "
                  "levels only one shape fits say so) and several of its levels have this "
                  "level's shape: they were paired in the order the others show, which no "
                  "shape confirms")


#: Why same-shape tensors of one module are a guess.
_SIBLING_TENSORS = ("same-shape tensors of one module under other names, told apart by one "
                    "signal at most (the order a file stores them in, or the roles of their "
                    "names)")


def _ambiguous(aligner: _Aligner) -> dict[str, str]:
    """Why each target tensor left unpaired stayed so, where several modules fit it."""
    free_a, free_b = aligner._free()
    if not free_a or not free_b:
        return {}
    free_match = aligner.match[np.ix_(free_a, free_b)]
    ambiguous: dict[str, str] = {}
    for row, i in enumerate(free_a):
        candidates = [aligner.b[free_b[k]].path for k in np.nonzero(free_match[row])[0]]
        if candidates:
            fitting = few(candidates, show=quoted)
            why = (f"structure is ambiguous: checkpoint modules {fitting} fit it, and "
                   "other modules of the model as well; add a rule that names its source")
            ambiguous.update(dict.fromkeys((t.name for t in aligner.a[i].tensors), why))
    return ambiguous
