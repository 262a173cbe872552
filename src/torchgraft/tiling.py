"""Whether chunks tile a tensor exactly: each element in one chunk, none left out.

A DCP checkpoint stores a tensor as chunks (an offset and a size in each dimension); a chunk
missing or two overlapping would leave elements of the tensor unwritten. Checking every pair
of chunks costs chunks squared (4 tensors of 4,096 chunks: 33 million pairs); here a box's
indicator is the signed sum of orthant steps at its corners, and the chunks tile the tensor
exactly when their corners, counted with signs, cancel the tensor's own: chunks x 2 **
(dimensions they split) steps. Torch-free: the quick ``inspect`` checks the same.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Sequence

__all__ = ["MAX_CORNERS", "tiles"]

#: Corners the check may count: chunks times 2 ** (dimensions they split).
MAX_CORNERS = 1 << 20

Chunk = tuple[Sequence[int], Sequence[int]]


def tiles(size: Sequence[int], chunks: Sequence[Chunk]) -> bool | None:
    """Whether chunks lying inside a tensor, as many elements as it has, cover each once.

    Args:
        size: The tensor's shape.
        chunks: Each chunk's offsets and sizes, inside the tensor (the caller checks that).

    Returns:
        Whether they tile it; ``None`` when checking would count more than
        :data:`MAX_CORNERS` corners.
    """
    if not math.prod(size):
        return True
    split = [d for d in range(len(size))
             if any(o[d] or n[d] != size[d] for o, n in chunks)]
    if len(chunks) << len(split) > MAX_CORNERS:
        return None
    signs: collections.Counter[tuple[int, ...]] = collections.Counter()
    boxes = [([(0, size[d]) for d in split], 1)]
    boxes += [([(o[d], o[d] + n[d]) for d in split], -1) for o, n in chunks if math.prod(n)]
    for edges, sign in boxes:
        for picks in itertools.product(*(((low, 1), (high, -1)) for low, high in edges)):
            signs[tuple(edge for edge, _ in picks)] += sign * math.prod(s for _, s in picks)
    return not any(signs.values())
