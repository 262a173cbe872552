"""Gated MLPs (GLU): which half of a fused gate/up projection is the gate, by code base.

A gated MLP computes ``down(act(gate(x)) * up(x))``. Code bases that fuse ``gate`` and ``up``
into one projection disagree on the order of its halves: transformers (Phi-3's and GLM's
``gate_up_proj``, the stacked experts' ``gate_up_proj``), Meta-style ``w13`` and xformers'
``w12`` put the gate first; AI2's OLMo (``ff_proj``, read as ``x, gate = x.chunk(2)``) puts it
second. Which names store which order is data (:data:`GLU_ORDERS`). A gated first projection
under a name that does not say its order (``fc1``, ``c_fc``, ``wi``...) is read gate first, as
most code bases store it, and every key it fills is a guess until outputs settle it.

Between two fused projections the halves are exchanged where the orders differ; a fused
projection whose name says its order paired with one whose name does not is a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..evidence import Guess
from ..tensors import Side

__all__ = ["GATE", "GLU_ORDERS", "PARTS_REORDERED", "UP", "GluOrder", "halves_between",
           "on_both"]

#: How a fused tensor's alternative with its parts the other way round is named in a guess.
PARTS_REORDERED = "(parts in the other order)"

#: Module names of the gate and up projections of a split gated MLP.
GATE = frozenset({"gate_proj", "gate", "w1"})
UP = frozenset({"up_proj", "up", "w3"})


@dataclass(frozen=True)
class GluOrder:
    """The order of the halves of fused gated projections, by their module names.

    Attributes:
        names: Module names of the fused projection.
        gate_first: Whether the gate's rows come first (``[gate; up]``).
        codebases: Who stores it so, for reports.
        known: Whether the names say the order; if not, it is a guess.
    """

    names: frozenset[str]
    gate_first: bool
    codebases: str
    known: bool = True

    @property
    def parts(self) -> tuple[frozenset[str], frozenset[str]]:
        """The names of the split projections, in the order of the fused rows."""
        return (GATE, UP) if self.gate_first else (UP, GATE)

    @property
    def doubt(self) -> str | None:
        """Why the order is a guess, if it is."""
        if self.known:
            return None
        return ("a gated projection's name does not say which half is the gate: read as "
                f"[gate; up] ({self.codebases}); the halves may be the other way round")


#: The known orders, and the names of gated projections that do not say theirs.
GLU_ORDERS = (
    GluOrder(frozenset({"gate_up_proj", "gate_up", "w13", "w12"}), True,
             "transformers' Phi-3, GLM and stacked experts; Meta-style w13; xformers' w12"),
    GluOrder(frozenset({"up_gate_proj", "up_gate", "ff_proj"}), False,
             "AI2 OLMo's ff_proj (x, gate = ff_proj(x).chunk(2))"),
    GluOrder(frozenset({"fc1", "c_fc", "wi", "fc_in", "linear_fc1", "dense_h_to_4h"}), True,
             "as Megatron's linear_fc1 and most code bases store it", known=False),
)


_BY_NAME = {name: order for order in GLU_ORDERS for name in order.names}


def halves_between(source: str, target: str) -> tuple[bool, Guess | None]:
    """Whether a fused gated tensor's halves are exchanged on the way, and the guess it is.

    Args:
        source: The source key (``...gate_up_proj.weight``).
        target: The target key (``...ff_proj.weight``).

    Returns:
        Whether the orders differ, and a guess when one name does not say its order (two that
        say none are read as one code base's: an ungated ``fc1`` into an ``fc1``).
    """
    stored, wanted = (_BY_NAME.get(key.rpartition(".")[0].rpartition(".")[2])
                      for key in (source, target))
    if stored is None or wanted is None or not (stored.known or wanted.known):
        return False, None
    exchange = stored.gate_first != wanted.gate_first
    if stored.known and wanted.known:
        return exchange, None
    return exchange, Guess((f"{source} {PARTS_REORDERED}",),
                           (stored if not stored.known else wanted).doubt or "")


def on_both(*sides: Side) -> bool:
    """Whether every side holds a fused gated projection's name (of any order)."""
    return all(any(info.module.rpartition(".")[2] in _BY_NAME for info in side.tensors.values())
               for side in sides)
