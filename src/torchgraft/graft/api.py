"""``tg.graft``: put any checkpoint into any model, adapt what differs, report every key."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn

from ..checkpoint import Checkpoint
from ..errors import TorchgraftError
from ..gcpause import paused_gc
from .adapt import Init, LabelMap
from .adapters import adapter_keys, refuse_plain_target, scope_to_adapter
from .dtensor import fill_sharded, materialise_sharded, sharded_targets
from .execute import execute_plan
from .heads import describe_sides
from .inputs import Inputs
from .materialise import META_DEFAULTS, ModelTensors, materialise
from .norms import NormOffsets, norm_offsets
from .plan import Match, Plan
from .planned import plan_graft
from .quantized_target import graft_quantized
from .reference import Want, reference_for
from .report import GraftError, GraftReport
from .rules import Rule, RulesSpec
from .settle import verify_graft
from .sides import Side, module_side, quantized_modules, state_tensors, unwrap
from .source import GraftSource, SourceLike, open_source
from .source_model import SourceModelLike
from .walk import walk_model

__all__ = ["Verify", "graft"]

logger = logging.getLogger("torchgraft")


Verify = bool | Literal["auto"]


@paused_gc()
def graft(source: SourceLike, model: nn.Module, *, rules: RulesSpec = None,
          match: Match = "auto", adapt: bool = True, init: Init = "keep", strict: bool = False,
          example_inputs: Any = None, source_inputs: Any = None, verify: Verify = "auto",
          label_map: LabelMap | None = None, device: str | torch.device | None = None,
          unsafe: bool = False, weights_key: str | None = None, component: str | None = None,
          progress: Callable[[int, int], None] | None = None,
          follow_links: bool = False,
          source_model: SourceModelLike | None = None) -> GraftReport:
    """Fill ``model`` from ``source`` in place, whatever stands between them.

    Matching goes by exact names, then names without wrapper prefixes (``module.``,
    ``_orig_mod.``, ``model.``, or a common prefix such as ``backbone.``) on either side, after
    the user's ``rules`` and the layouts between the two sides (PaddlePaddle, GPT-2
    ``Conv1D``, transformers' and Meta's Llama); then, for what is left, by structure: order,
    shapes and module kinds. Shapes that differ in a convolution's input channels are adapted;
    a head whose rows differ is re-initialised (rows kept where ``label_map`` says), an
    embedding keeps the rows both have.

    A model built on the meta device gets real storage for every tensor the graft fills (on
    ``device``), read straight into it: no random initialisation, no second copy.

    A sharded model (DTensor parameters: FSDP2, tensor parallel) is grafted on every rank:
    each rank fills its own shards in place, reading only their bytes where the format
    allows, and every rank returns the same report (:mod:`torchgraft.graft.dtensor`). Its
    outputs are not compared (``verify``): that would run the model beside its source in
    one process.

    Args:
        source: A checkpoint path (any format :func:`torchgraft.open` reads), a state dict, an
            ``nn.Module``, or a :func:`torchgraft.open` result.
        model: The target, possibly wrapped in DataParallel, DistributedDataParallel or
            torch.compile, possibly built on the meta device; filled in place.
        rules: ``(regex, replacement)`` pairs applied to source keys first (``None`` drops the
            key), a mapping of them, or a JSON/YAML file of either; the list may also hold
            operations (``{"op": "concatenate", "from": [...], "to": ...}``: concatenate,
            split, rotary rows, transpose...; :mod:`~torchgraft.graft.op_rules`), which run
            before the renames.
        match: ``"auto"``, ``"name"`` (no structural matching) or ``"structure"`` (only).
        adapt: Adapt rows and input channels; ``False`` copies exact shapes only.
        init: New rows and re-initialised heads: ``"keep"`` the model's own values,
            ``"normal"`` (std 0.02, zero biases) or ``"zeros"``.
        strict: Raise :class:`GraftError` if any key is missing, unused or re-initialised
            (bookkeeping buffers such as ``num_batches_tracked`` aside), or outputs diverge.
        example_inputs: The model's inputs (a tuple, a lone tensor, or a mapping of keyword
            arguments): orders its tensors by use for structural matching, and feeds
            ``verify``. An :class:`~torchgraft.graft.inputs.Inputs` (by role: token ids,
            pixel values...; as the CLI's ``--inputs`` reads) only feeds ``verify``, bound to
            each model's ``forward`` by argument name.
        source_inputs: The source's inputs, where they differ from ``example_inputs``.
        verify: Compare outputs with the source's: with the source module (given inputs),
            with ``source_model=``, or with the model a checkpoint folder's ``config.json``
            describes (a transformers class, built with transformers; inputs generated from the
            config when none are given), filled from the same checkpoint. Where outputs
            diverge, the guesses of the first diverging module are tried (same-shape siblings
            swapped) and the one that makes it agree is kept. Outputs that agree make every
            key ``verified``; a difference beyond 1e-4 of the output's scale makes the verdict
            diverged, naming the first module where activations diverge. ``"auto"`` compares
            when there is something to compare with, the graft is a plain copy (no rows or
            channels adapted) and the weights are at most 2 GiB; ``True`` always compares (an
            error when there is nothing to compare with, or the model is sharded); ``False``
            never does.
        label_map: For row adaptations: ``{target_row: source_row}`` or a sequence of source
            rows (``None`` for a new row).
        device: Where tensors of a meta-device model get their storage; by default where the
            model's other tensors are, else the CPU.
        unsafe: For checkpoint paths: let pickles call code outside the allow-list.
        weights_key: For checkpoint paths: where the weights are in a training checkpoint.
        component: For a folder of several models (a diffusers pipeline, a sentence-
            transformers model): graft from this part alone (``"unet"``); by default from all
            parts, their keys prefixed with the part's name.
        progress: Called with (tensors done, total) as tensors are filled.
        follow_links: For checkpoint paths: follow links out of the checkpoint's folder (links
            inside a recognised model store, such as the Hub cache, are followed anyway).
        source_model: A module of the source's code base, or a callable that builds one (on
            the meta device is fine): filled from ``source`` and compared with (``verify``).

    Returns:
        The report: loaded, mapping, adapted, reinitialised, tied, missing, unused, reasons,
        warnings, ok.

    Raises:
        GraftError: With ``strict=True``, if the report is not clean.
        TorchgraftError: If the source cannot be read or an option is invalid.
    """
    _check_options(match, init, verify)
    source, model, swapped = _in_order(source, model)
    roles = example_inputs if isinstance(example_inputs, Inputs) else None
    if roles is not None:  # bound to each model's forward when outputs are compared
        example_inputs = source_inputs = None
    source_inputs = example_inputs if source_inputs is None else source_inputs
    target = unwrap(model)
    modules, tensors = walk_model(target)  # one walk of a large model, shared below
    state = tensors.state
    opening: dict[str, Any] = {"unsafe": unsafe, "weights_key": weights_key, "component": component,
               "follow_links": follow_links}
    if quantized_modules(target, state):
        return _into_quantized(open_source(source, **opening), target, strict=strict)
    on_meta = tensors.on_meta
    init, warnings = _init_for(on_meta, init, [swapped] if swapped else [])
    sharded = sharded_targets(target, state)
    if sharded and verify is True:
        raise TorchgraftError("verify=True runs the model beside its source in one process; "
                              "a sharded model (DTensor parameters) is not compared that way: "
                              "compare its outputs after the graft, or pass verify='auto'")
    target_side = module_side(target, _meta_inputs(example_inputs) if on_meta else example_inputs,
                              tensors=state, modules=modules)
    if on_meta and example_inputs is not None:  # the forward may have made tensors on meta
        modules, tensors = walk_model(target)
        state = tensors.state
    opened = open_source(source, example_inputs=source_inputs, **opening)
    try:
        scope = _adapter_scope(opened, target, target_side.tensors)
        planned = plan_graft(opened, target_side, rules=rules, scoped=scope is not None,
                             match=match, adapt=adapt, init=init, label_map=label_map,
                             norms=NormOffsets(_source_norms(opened.module, source_model),
                                               norm_offsets(target, modules=modules)),
                             described=describe_sides(source, opened, target, modules=modules))
        plan = planned.plan
        plan.warnings[:0] = warnings
        _fill(plan, opened, target, state, sharded,
              _Filling(on_meta, device, progress, tensors))
    finally:
        opened.close()
    report = _report(plan, target_side, planned.source, scope)
    report.add_missing(dict.fromkeys(
        tensors.still_on_meta() if on_meta else (),
        "still on the meta device: nothing in the checkpoint fills it; build the model with "
        "real tensors for what the checkpoint lacks (non-persistent buffers are computed by "
        "its code)"))
    if not sharded and (verify is True or (verify == "auto" and _plain_copy(report))):
        want = Want(verify, example_inputs, source_inputs, roles, source_model,
                    sum(math.prod(info.shape) * info.dtype.itemsize
                        for info in planned.source.tensors.values()))
        _verify(report, plan, (source, opened.module, target), want, opening)
    if logger.isEnabledFor(logging.DEBUG):  # the report's text lists every key
        logger.debug("%s", str(report).splitlines()[0])
    if strict and not report.clean:
        raise GraftError(report)
    return report


def _check_options(match: Any, init: Any, verify: Any) -> None:
    """Refuse option values that are not among the allowed ones."""
    if match not in get_args(Match):
        raise TorchgraftError(f"match={match!r}: use 'auto', 'name' or 'structure'")
    if init not in get_args(Init):
        raise TorchgraftError(f"init={init!r}: use 'keep', 'normal' or 'zeros'")
    if verify not in (True, False, "auto"):
        raise TorchgraftError(f"verify={verify!r}: use 'auto', True or False")


def _init_for(on_meta: bool, init: Init, warnings: list[str]) -> tuple[Init, list[str]]:
    """A meta model has no values to keep: new rows use ``"normal"``, with a warning."""
    if on_meta and init == "keep":
        warnings.append("the model is on the meta device, so it has no values of its own to "
                        "keep: new rows and re-initialised heads use init='normal'")
        return "normal", warnings
    return init, warnings


@dataclass(frozen=True)
class _Filling:
    """How the target is filled: on the meta device or not, where, with what progress.

    ``tensors`` are the target's tensors, walked once and shared.
    """

    on_meta: bool
    device: str | torch.device | None
    progress: Callable[[int, int], None] | None
    tensors: ModelTensors


def _fill(plan: Plan, opened: GraftSource, target: nn.Module, state: dict[str, torch.Tensor],
          sharded: dict[str, Any], filling: _Filling) -> None:
    """Give a meta model storage, fill sharded tensors, then run the plan."""
    assigned: set[str] = set()
    if filling.on_meta:
        assigned = _materialise(plan, opened, target, state, sharded, filling)
    if sharded:
        fill_sharded(plan, opened.refs, sharded)
        state = state_tensors(target)  # materialise updated ``state``; DTensors anew
    execute_plan(plan, opened.refs, state, progress=filling.progress,
                 assigned=assigned | set(sharded))


def _materialise(plan: Plan, opened: GraftSource, target: nn.Module,
                 state: dict[str, torch.Tensor], sharded: dict[str, Any],
                 filling: _Filling) -> set[str]:
    """Storage for a meta model's filled tensors, read straight into it where stored as is.

    They go where ``device=`` says, else where the model's real tensors are, else the CPU.
    """
    device = filling.device
    where = (torch.device(device) if device is not None
             else filling.tensors.device or torch.device("cpu"))
    zeroed = [s.target for s in plan.steps if s.ops] + list(plan.reinitialised) + [
        k for k in plan.missing if any(p.search(k) for p in META_DEFAULTS)]
    as_stored = {s.target: opened.refs[s.source].read for s in plan.steps
                 if not s.ops and not s.cast} if where.type == "cpu" else {}
    filled = [s.target for s in plan.steps]
    assigned = materialise(target, [k for k in filled if k not in sharded], where,
                           zeroed=[k for k in zeroed if k not in sharded],
                           values=as_stored, state=state, tensors=filling.tensors)
    if sharded:
        materialise_sharded(target, sharded, [*filled, *zeroed],
                            where if device is not None else None)
    return assigned


def _report(plan: Plan, target: Side, source: Side, scope: set[str] | None) -> GraftReport:
    """The report of an executed plan, with every key's shape."""
    report = GraftReport.from_plan(plan, targets=target.tensors, sources=source.tensors)
    report.infos = (target.tensors, source.tensors)  # their shapes are found when asked
    if scope is not None:
        scope_to_adapter(report, scope)
    return report


def _verify(report: GraftReport, plan: Plan, sides: tuple[Any, nn.Module | None, nn.Module],
            want: Want, opening: dict[str, Any]) -> None:
    """Compare outputs with the source's, where there is something to compare with."""
    source, source_module, target = sides

    def fill(module: nn.Module, renames: list[Rule]) -> GraftReport:
        return graft(source, module, rules=renames, verify=False, **opening)

    reference = reference_for(source, source_module, target, want, fill, report.warnings)
    if reference is None:
        return
    try:
        verify_graft(report, plan, target, reference)
    except TorchgraftError as exc:
        if want.verify is True or not reference.generated:
            raise
        report.warnings.append(f"outputs were not compared on inputs generated from "
                               f"{reference.origin}: {exc}")


def _adapter_scope(opened: GraftSource, target: nn.Module,
                   keys: Iterable[str]) -> set[str] | None:
    """A PEFT adapter's graft is about the model's adapter keys; a model without any refuses it.

    Returns:
        The target's adapter keys when the source is an adapter, else ``None``.
    """
    if opened.adapter is None:
        return None
    scope = adapter_keys(target, list(keys))
    if scope is None:
        raise refuse_plain_target(opened.adapter, str(opened.adapter.folder))
    return scope


def _in_order(source: Any, model: Any) -> tuple[Any, nn.Module, str]:
    """``(source, model)``, accepting ``graft(model, checkpoint)`` when that is unambiguous.

    ``safetensors.torch.load_model(model, file)`` takes the model first; when the model is
    given first and the checkpoint is not a module, the two can only be swapped.

    Returns:
        The source, the model, and a warning when they were swapped (``""`` otherwise).

    Raises:
        TorchgraftError: If ``model`` is not an ``nn.Module`` either way.
    """
    if isinstance(model, nn.Module):
        return source, model, ""
    if isinstance(source, nn.Module) and isinstance(model, (str, os.PathLike, Mapping,
                                                            Checkpoint)):
        warning = ("the arguments came as graft(model, checkpoint); the order is "
                   "tg.graft(checkpoint, model) (the model is filled in place either way)")
        logger.warning("%s", warning)
        return model, source, warning
    raise TorchgraftError(
        f"tg.graft(source, model): the model must be an nn.Module, got a "
        f"{type(model).__name__}; the checkpoint (a path, a state dict, a module or a "
        "tg.open() result) comes first, the model second")


def _into_quantized(opened: GraftSource, target: nn.Module, *, strict: bool) -> GraftReport:
    """A quantized model takes the same quantized architecture's checkpoint, as stored."""
    try:
        report = graft_quantized(opened.refs, target)
    finally:
        opened.close()
    if strict and not report.clean:
        raise GraftError(report)
    return report


def _meta_inputs(inputs: Any) -> Any:
    """Example inputs moved to the meta device, to order a meta model's tensors by use."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to("meta")
    if isinstance(inputs, tuple):
        return tuple(_meta_inputs(x) for x in inputs)
    return inputs


def _source_norms(module: nn.Module | None,
                  source_model: SourceModelLike | None) -> dict[str, float | None]:
    """The source's norm classes: its module's, else a ``source_model=`` module's.

    A ``source_model=`` module is of the file's own code base, named as the file; a bare file
    says none.
    """
    found = module if module is not None else source_model
    return norm_offsets(unwrap(found)) if isinstance(found, nn.Module) else {}


#: What a key may have been through and still compute what the source computes: layouts only
#: (a cast rounds, or makes the model compute in another precision than its source).
_LAYOUTS_ONLY = re.compile(r"(transposed|rotary|fused|split|stacked|unstacked|by rule|reshaped|"
                           r"unit offset|halves exchanged)")


def _plain_copy(report: GraftReport) -> bool:
    """Whether the model should compute what the source computes: nothing adapted or missing.

    Every operation a key went through counts (``"transposed; cast float32->float16"`` is
    not a layout alone).
    """
    layout_only = all(_LAYOUTS_ONLY.match(part) for text in report.adapted.values()
                      for part in text.split("; "))
    return layout_only and report.complete and not report.reinitialised

