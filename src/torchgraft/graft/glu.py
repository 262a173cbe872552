"""Gated MLPs (GLU): which half of a fused gate/up projection is the gate, by code base.

A gated MLP computes ``down(act(gate(x)) * up(x))``. Code bases that fuse ``gate`` and ``up``
into one projection disagree on the order of its halves: transformers (Phi-3's and GLM's
``gate_up_proj``, the stacked experts' ``gate_up_proj``), Meta-style ``w13`` and xformers'
``w12`` put the gate first; AI2's OLMo (``ff_proj``, read as ``x, gate = x.chunk(2)``) puts it
second. Which names store which order is data (:data:`GLU_ORDERS`). A gated first projection
under a name that does not say its order (``fc1``, ``c_fc``, ``wi``...) is read gate first, as
most code bases store it, and every key it fills is a guess until outputs settle it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GATE", "GLU_ORDERS", "UP", "GluOrder"]

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
