"""Structural matching: align modules by order of use and shapes, when names share nothing.

Both sides' unmatched tensors are grouped by module, in order of use (a file's stored order
stands for its order of definition; safetensors files store names sorted, so their order of
definition is lost). Two modules correspond when they hold the same number of tensors and
each pair (by leaf name where both sides use the same ones) fits (same shape, or the layout's
transposed shape; same module kind where both kinds are known). The longest common
subsequence of corresponding modules is the alignment, and it is taken only when it is the
only longest one: an ambiguous structure matches nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .sides import TensorInfo

__all__ = ["Alignment", "align"]

Fits = Callable[[TensorInfo, TensorInfo], bool]


@dataclass
class Alignment:
    """The result of structural matching.

    Attributes:
        pairs: Target key to source key.
        ambiguous: How many equally good alignments there were, when more than one.
    """

    pairs: dict[str, str]
    ambiguous: int = 0


def _groups(order: list[str], infos: dict[str, TensorInfo]) -> list[list[TensorInfo]]:
    groups: dict[str, list[TensorInfo]] = {}
    for name in order:
        groups.setdefault(infos[name].module, []).append(infos[name])
    return list(groups.values())


def _leaf(info: TensorInfo) -> str:
    return info.name.rpartition(".")[2]


def _paired(targets: list[TensorInfo],
            sources: list[TensorInfo]) -> list[tuple[TensorInfo, TensorInfo]] | None:
    """Pair two modules' tensors; ``None`` if their counts differ.

    Tensors pair by leaf name (weight, bias...) when both modules use the same names, else in
    order.
    """
    if len(targets) != len(sources):
        return None
    by_leaf = {_leaf(s): s for s in sources}
    if {_leaf(t) for t in targets} == set(by_leaf):
        return [(t, by_leaf[_leaf(t)]) for t in targets]
    return list(zip(targets, sources, strict=True))


def align(targets: list[str], sources: list[str], target_infos: dict[str, TensorInfo],
          source_infos: dict[str, TensorInfo], fits: Fits) -> Alignment:
    """Align unmatched target and source tensors by structure.

    Args:
        targets: Unmatched target keys, in order of use.
        sources: Unmatched source keys, in order of use.
        target_infos: Target metadata.
        source_infos: Source metadata.
        fits: Whether a source tensor can fill a target tensor (shapes, layouts, kinds).

    Returns:
        The alignment; empty when there is none or it is ambiguous.
    """
    a = _groups(targets, target_infos)
    b = _groups(sources, source_infos)
    n, m = len(a), len(b)
    if not n or not m:
        return Alignment({})

    def same(i: int, j: int) -> bool:
        pairs = _paired(a[i], b[j])
        return pairs is not None and all(fits(s, t) for t, s in pairs)

    match = [[same(i, j) for j in range(m)] for i in range(n)]
    length = [[0] * (m + 1) for _ in range(n + 1)]
    count = [[1] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best = max(length[i - 1][j], length[i][j - 1])
            if match[i - 1][j - 1]:
                best = max(best, length[i - 1][j - 1] + 1)
            length[i][j] = best
            total = 0
            if match[i - 1][j - 1] and length[i - 1][j - 1] + 1 == best:
                total += count[i - 1][j - 1]
            if length[i - 1][j] == best:
                total += count[i - 1][j]
            if length[i][j - 1] == best:
                total += count[i][j - 1]
            if length[i - 1][j - 1] == best:
                total -= count[i - 1][j - 1]
            count[i][j] = total
    if length[n][m] == 0:
        return Alignment({})
    if count[n][m] != 1:
        return Alignment({}, ambiguous=count[n][m])
    pairs: dict[str, str] = {}
    i, j = n, m
    while i and j:
        if match[i - 1][j - 1] and length[i][j] == length[i - 1][j - 1] + 1:
            for t, s in _paired(a[i - 1], b[j - 1]) or ():
                pairs[t.name] = s.name
            i, j = i - 1, j - 1
        elif length[i - 1][j] == length[i][j]:
            i -= 1
        else:
            j -= 1
    return Alignment(pairs)
