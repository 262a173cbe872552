"""A PEFT adapter's report: about the adapter's tensors, never the base model's.

Grafted into a model with adapter layers (:mod:`~torchgraft.graft.sides.adapters`), the report
is scoped to the adapter: ok when every adapter tensor of the model is loaded; the base weights
are "not part of an adapter", not missing.
"""

from __future__ import annotations

from ..plan.adapt import InputChannels, Rows
from .report import GraftReport

__all__ = ["NOT_IN_ADAPTER", "scope_to_adapter"]

NOT_IN_ADAPTER = ("not part of an adapter: a base model weight, which an adapter never holds "
                  "(load the base model's own checkpoint for it)")
#: Adaptations of a tensor's shape: an adapter's tensor must fit exactly.
_RESHAPED = (Rows, InputChannels)


def scope_to_adapter(report: GraftReport, scope: set[str]) -> None:
    """Scope a report to the adapter: base weights are not missing, they are not its part.

    An adapter tensor that did not fit exactly (other rows, re-initialised) is missing: an
    adapter with another rank or other modules is another adapter.

    Args:
        report: The graft's report, changed in place.
        scope: The target keys that belong to adapter layers.
    """
    unfit = {k: v for k, v in report.reinitialised.items() if k in scope}
    steps = report.plan.steps if report.plan is not None else []
    unfit.update({step.target: step.describe() for step in steps
                  if step.target in scope and any(isinstance(op, _RESHAPED) for op in step.ops)})
    for key in unfit:
        report.reinitialised.pop(key, None)
        report.adapted.pop(key, None)
    report.add_missing({key: f"the adapter's tensor does not fit the model's adapter layer "
                             f"({why}): the adapter config (rank, target modules) differs"
                        for key, why in unfit.items()})
    base = [k for k in report.missing if k not in scope]  # the base model's: tens of thousands
    report.missing = [k for k in report.missing if k in scope]
    report.not_in_adapter += base
    report.reasons.update(dict.fromkeys(base, NOT_IN_ADAPTER))
