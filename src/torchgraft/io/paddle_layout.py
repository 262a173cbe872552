"""How PaddlePaddle names and stores what PyTorch calls the same thing.

Paddle's BatchNorm keeps its statistics as ``_mean`` and ``_variance`` (PyTorch:
``running_mean``, ``running_var``), has no ``num_batches_tracked``, and stores a Linear's
weight ``[in, out]`` (PyTorch: ``[out, in]``). The Paddle reader and writer use these facts,
and so does grafting a ``.pdparams`` into a PyTorch model (its ``paddle`` layout).
"""

from __future__ import annotations

from ..renames import Rule

__all__ = ["EXPORTS", "RENAMES", "TRANSPOSED_WHY", "stored_transposed"]

#: Paddle's names to PyTorch's.
RENAMES = (Rule(r"\._mean$", ".running_mean"), Rule(r"\._variance$", ".running_var"))
#: PyTorch's names to Paddle's (``None`` drops what Paddle lacks).
EXPORTS = (Rule(r"\.running_mean$", "._mean"), Rule(r"\.running_var$", "._variance"),
           Rule(r"(^|\.)num_batches_tracked$", None))
#: Why a Linear's weight is transposed between the two.
TRANSPOSED_WHY = "Paddle stores Linear weights as [in, out]"


def stored_transposed(kind: str | None, name: str, ndim: int) -> bool:
    """Whether Paddle stores a PyTorch tensor transposed: a Linear layer's 2-D weight.

    Args:
        kind: The kind of the module holding it in PyTorch (``"linear"``...).
        name: Its key.
        ndim: Its number of dimensions.

    Returns:
        True for a Linear's 2-D ``weight``.
    """
    return kind == "linear" and name.rpartition(".")[2] == "weight" and ndim == 2
