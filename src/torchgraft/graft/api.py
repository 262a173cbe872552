"""``tg.graft``: put any checkpoint into any model, adapt what differs, report every key."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, get_args

from torch import nn

from ..errors import TorchgraftError
from .adapt import Init, LabelMap
from .execute import execute_plan
from .layouts import layouts_for
from .plan import Match, build_plan
from .report import GraftError, GraftReport
from .rules import RulesSpec, parse_rules
from .sides import module_side, unwrap
from .source import SourceLike, open_source
from .verify import max_abs_diff

__all__ = ["graft"]

logger = logging.getLogger("torchgraft")


def graft(source: SourceLike, model: nn.Module, *, rules: RulesSpec = None,
          match: Match = "auto", adapt: bool = True, init: Init = "keep", strict: bool = False,
          example_inputs: Any = None, verify: bool = False, label_map: LabelMap | None = None,
          unsafe: bool = False, weights_key: str | None = None,
          progress: Callable[[int, int], None] | None = None) -> GraftReport:
    """Fill ``model`` from ``source`` in place, whatever stands between them.

    Matching goes by exact names, then names without wrapper prefixes (``module.``,
    ``_orig_mod.``, ``model.``, or a common prefix such as ``backbone.``) on either side, after
    the user's ``rules`` and the source framework's layout (PaddlePaddle, GPT-2 ``Conv1D``);
    then, for what is left, by structure: order of use, shapes and module kinds. Shapes that
    differ in rows (a new classifier) or in a convolution's input channels are adapted.

    Args:
        source: A checkpoint path (any format :func:`torchgraft.open` reads), a state dict, an
            ``nn.Module``, or a :func:`torchgraft.open` result.
        model: The target, possibly wrapped in DataParallel, DistributedDataParallel or
            torch.compile; filled in place.
        rules: ``(regex, replacement)`` pairs applied to source keys first (``None`` drops the
            key), a mapping of them, or a JSON/YAML file of either.
        match: ``"auto"``, ``"name"`` (no structural matching) or ``"structure"`` (only).
        adapt: Adapt rows and input channels; ``False`` copies exact shapes only.
        init: New rows: ``"keep"`` the model's own values, ``"normal"`` (std 0.02, zero
            biases) or ``"zeros"``.
        strict: Raise :class:`GraftError` if any key is missing or unused (bookkeeping buffers
            such as ``num_batches_tracked`` aside).
        example_inputs: Positional inputs (a tuple, or a lone tensor): orders tensors by use
            for structural matching, and feeds ``verify``.
        verify: Run the source module and the model on ``example_inputs`` and report
            ``max_abs_diff``; needs a module source.
        label_map: For row adaptations: ``{target_row: source_row}`` or a sequence of source
            rows (``None`` for a new row).
        unsafe: For checkpoint paths: let pickles call code outside the allow-list.
        weights_key: For checkpoint paths: where the weights are in a training checkpoint.
        progress: Called with (tensors done, total) as tensors are filled.

    Returns:
        The report: loaded, mapping, adapted, missing, unused, reasons, ok.

    Raises:
        GraftError: With ``strict=True``, if anything is missing or unused.
        TorchgraftError: If the source cannot be read or an option is invalid.
    """
    if match not in get_args(Match):
        raise TorchgraftError(f"match={match!r}: use 'auto', 'name' or 'structure'")
    if init not in get_args(Init):
        raise TorchgraftError(f"init={init!r}: use 'keep', 'normal' or 'zeros'")
    if verify and (not isinstance(source, nn.Module) or example_inputs is None):
        raise TorchgraftError("verify=True needs a source nn.Module and example_inputs")
    target = unwrap(model)
    target_side = module_side(target, example_inputs)
    opened = open_source(source, example_inputs=example_inputs, unsafe=unsafe,
                         weights_key=weights_key)
    try:
        try:
            plan = build_plan(opened.side, target_side, rules=parse_rules(rules),
                              layouts=layouts_for(opened.side), match=match, adapt=adapt,
                              init=init, label_map=label_map)
        except ValueError as exc:
            raise TorchgraftError(str(exc)) from None
        execute_plan(plan, opened.refs, target.state_dict(keep_vars=True), progress=progress)
    finally:
        opened.close()
    report = GraftReport.from_plan(plan)
    if verify and opened.module is not None:
        report.max_abs_diff = max_abs_diff(opened.module, target, example_inputs)
    logger.debug("%s", str(report).splitlines()[0])
    if strict and not report.clean:
        raise GraftError(report)
    return report
