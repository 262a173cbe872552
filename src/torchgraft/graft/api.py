"""``tg.graft``: put any checkpoint into any model, adapt what differs, report every key.

A graft runs as a pipeline of stages, each a sub-package whose imports run one way: the source
is opened (:mod:`~torchgraft.graft.sides`), the graft planned on metadata alone
(:mod:`~torchgraft.graft.plan`, with the layouts between the two sides from
:mod:`~torchgraft.graft.layouts`), the model filled (:mod:`~torchgraft.graft.fill`), the report
made (:mod:`~torchgraft.graft.report`), and outputs compared where there is something to
compare with (:mod:`~torchgraft.graft.check`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import torch
from torch import nn

from ..checkpoint import Checkpoint, OpenOptions
from ..errors import TorchgraftError
from ..gcpause import paused_gc
from ..logs import warn
from ..renames import Rule
from .check.reference import Want, expect_reference, reference_for
from .check.settle import verify_graft
from .check.source_model import SourceModelLike, source_code, transformers_renames
from .fill.dtensor import sharded_targets
from .fill.initialise import computed_alike
from .fill.new_parts import check_new, declare_new
from .fill.quantized import graft_quantized
from .fill.target import Filled, Filling, fill_model
from .layouts.norms import NormOffsets, norm_offsets
from .layouts.rules import RulesSpec, read_rules
from .plan.adapt import Init, LabelMap, Rows, reversible
from .plan.build import Planned, PlanOptions, plan_graft
from .plan.passes import computed_assumption
from .plan.steps import Match, Plan, is_bookkeeping
from .report.adapter_scope import scope_to_adapter
from .report.report import GraftError, GraftReport
from .sides.adapters import adapter_keys, refuse_plain_target
from .sides.describe import describe_sides
from .sides.inputs import Inputs
from .sides.model import module_side, ordered_by, quantized_modules, unwrap
from .sides.source import GraftSource, SourceLike, open_source
from .sides.walk import ModelTensors, Walked, walk_model
from .tensors import Side

__all__ = ["Verify", "graft"]

logger = logging.getLogger("torchgraft")


Verify = bool | Literal["auto"]

#: Why a tensor still on the meta device after a graft is missing.
_STILL_ON_META = ("still on the meta device: nothing in the checkpoint fills it, and the "
                  "model's code was not asked to compute it (a sharded tensor); build the model "
                  "with real tensors for what the checkpoint lacks")


@paused_gc()
def graft(source: SourceLike, model: nn.Module, *, rules: RulesSpec = None,
          match: Match = "auto", adapt: bool = True, init: Init = "keep", strict: bool = False,
          example_inputs: Any = None, source_inputs: Any = None, verify: Verify = "auto",
          label_map: LabelMap | None = None, device: str | torch.device | None = None,
          unsafe: bool = False, weights_key: str | None = None, component: str | None = None,
          progress: Callable[[int, int], None] | None = None,
          follow_links: bool = False,
          source_model: SourceModelLike | None = None,
          new: str | Iterable[str] = ()) -> GraftReport:
    """Fill ``model`` from ``source`` in place, whatever stands between them.

    Matching goes by exact names, then names without wrapper prefixes (``module.``,
    ``_orig_mod.``, ``model.``, or a common prefix such as ``backbone.``) on either side, after
    the user's ``rules`` and the layouts between the two sides (PaddlePaddle, GPT-2
    ``Conv1D``, transformers' and Meta's Llama); then, for what is left, by structure: order,
    shapes and module kinds. Shapes that differ in a convolution's input channels are adapted;
    a head whose rows differ is re-initialised (rows kept where ``label_map`` says), an
    embedding keeps the rows both have.

    A model built on the meta device gets real storage for every tensor the graft fills (on
    ``device``), read straight into it: no random initialisation, no second copy. What no
    checkpoint holds (non-persistent buffers such as rotary frequencies) is then computed by
    the model's own code (transformers' ``_init_weights``, a module's ``reset_parameters``,
    or the module rebuilt from its attributes) and listed in ``report.initialised``, never as
    loaded.

    Every key written is read back through the model's own ``state_dict()``: a model whose
    state dict hands out copies (state-dict hooks) is filled through its own
    ``load_state_dict``, and a write that still does not show is reported missing, with the
    reason. ``report.loaded`` lists only what is confirmed.

    A graft that is not ok emits one :class:`~torchgraft.errors.TorchgraftWarning`
    (:func:`warnings.warn`, shown once per line of your code by default): the verdict, what
    needs a look and how to settle it. ``print(report)`` shows a summary,
    ``report.details()`` every key.

    A sharded model (DTensor parameters: FSDP2, tensor parallel) is grafted on every rank:
    each rank fills its own shards in place, reading only their bytes where the format
    allows, and every rank returns the same report (:mod:`torchgraft.graft.fill.dtensor`). Its
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
            split, rotary rows, transpose...; :mod:`~torchgraft.graft.layouts.op_rules`), which run
            before the renames.
        match: ``"auto"``, ``"name"`` (no structural matching) or ``"structure"`` (only).
        adapt: Adapt rows and input channels; ``False`` copies exact shapes only.
        init: New rows and re-initialised heads: ``"keep"`` the model's own values,
            ``"normal"`` (std 0.02, zero biases) or ``"zeros"``.
        strict: Raise :class:`GraftError` if any key is missing, unused or re-initialised
            (bookkeeping buffers such as ``num_batches_tracked`` aside), or outputs diverge.
        example_inputs: The model's inputs (a tuple, a lone tensor, or a mapping of keyword
            arguments): orders its tensors by use for structural matching, and feeds
            ``verify``. An :class:`~torchgraft.graft.sides.inputs.Inputs` (by role: token ids,
            pixel values...; as the CLI's ``--inputs`` reads) only feeds ``verify``, bound to
            each model's ``forward`` by argument name. Without any, where outputs are to be
            compared with ``source_model=`` (or ``verify=True``), inputs are generated from
            a config, else from the models' first modules: token ids in range of the first
            ``nn.Embedding``, images of the first ``nn.Conv2d``'s channels in the first size
            of 224, 64, 32 both models take, audio of the first ``nn.Conv1d``'s channels.
        source_inputs: The source's inputs, where they differ from ``example_inputs``.
        verify: Compare outputs with the source's: with the source module (given inputs),
            with ``source_model=``, or with the model a checkpoint folder's ``config.json``
            describes (a transformers class, built with transformers; inputs generated from the
            config when none are given), filled from the same checkpoint. Inputs are bound to
            each model's ``forward`` by argument name. What corresponds is compared: the
            floating outputs that match once leading dimensions are flattened (never integer
            outputs or losses), else the activations of the modules the plan pairs, the last
            one first. Where they diverge, every hypothesis the plan's guesses give for the
            first diverging module is tried (same-shape siblings swapped, rotary orders, a
            fused tensor's rows in blocks or head by head) and the one that makes it agree is
            kept; ``report.tried`` lists each. Agreement makes every key ``verified``; a
            difference beyond 1e-4 of the source's scale makes the verdict diverged, naming
            the first module where activations diverge. A model that fails on the inputs, or
            nothing that corresponds, is a warning: verification never turns a filled graft
            into an error. ``"auto"`` compares when there is something to compare with, the
            graft is a plain copy (no rows or channels adapted) and the weights are at most
            2 GiB; ``True`` always compares (an error before anything is filled when there is
            nothing to compare with, or the model is sharded); ``False`` never does.
        label_map: For row adaptations: ``{target_row: source_row}`` or a sequence of source
            rows (``None`` for a new row).
        device: Where tensors of a meta-device model get their storage; by default where the
            model's other tensors are, else the CPU.
        unsafe: For checkpoint paths: see :class:`~torchgraft.checkpoint.OpenOptions` (runs
            code from the file).
        weights_key: For checkpoint paths: see :class:`~torchgraft.checkpoint.OpenOptions`.
        component: For a folder of several models: see
            :class:`~torchgraft.checkpoint.OpenOptions` (by default every part, its keys
            prefixed with the part's name).
        progress: Called with (tensors done, total) as tensors are filled.
        follow_links: For checkpoint paths: see :class:`~torchgraft.checkpoint.OpenOptions`.
        source_model: A module of the source's code base, or a callable that builds one (on
            the meta device is fine): filled from ``source`` and compared with (``verify``).
            The module given is left as it is: a copy of it is filled (its tensors on meta,
            then given storage by the fill). A module given as ``source`` is only read: run
            in its own mode, its buffers (running statistics) put back, or in eval mode to
            compare, its mode restored.
        new: Parts of the model that are new on purpose (a new head, a new neck): glob
            patterns over the model's keys (``"head.*"``; a module's name stands for every
            key under it). What they name and the checkpoint does not fill keeps the values
            the model's code gave it (or gets ``init=``'s) and is listed in ``report.new``,
            not missing. A key they name that the checkpoint fills is filled from it, with a
            warning; a pattern that names no key of the model is an error.

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
    walked = walk_model(target)  # one walk of a large model, shared below
    declared = check_new(new, walked.tensors.state)
    opening = OpenOptions(unsafe, weights_key, component, follow_links)
    if quantized_modules(target, walked.tensors.state):
        report = _into_quantized(open_source(source, opening), target)
        _name_sides(report, source, target)
        declare_new(report, target, declared, "keep")
        return _finished(report, strict=strict)
    sharded = sharded_targets(target, walked.tensors.state)
    if sharded and verify is True:
        raise TorchgraftError("verify=True runs the model beside its source in one process; "
                              "a sharded model (DTensor parameters) is not compared that way: "
                              "compare its outputs after the graft, or pass verify='auto'")
    with open_source(source, opening, example_inputs=source_inputs) as opened:
        shapes = {key: info.shape for key, info in opened.side.tensors.items()}
        want = Want(verify, example_inputs, source_inputs, roles, source_model,
                    sum(math.prod(info.shape) * info.dtype.itemsize
                        for info in opened.side.tensors.values()), source_shapes=shapes)
        expect_reference(source, opened.module, want)  # before the model is touched
        code = source_code(source, opened.module, source_model, shapes=shapes)
        if code is not None and opened.module is None:
            ordered_by(opened.side, code)
        into = _Into(_with_own_renames(rules, target, walked, opened),
                     PlanOptions(match, adapt, init, label_map),
                     norm_offsets(code) if code is not None else {}, device, progress)
        planned, report = _graft_into(opened, source, target, walked, into,
                                      inputs=example_inputs, sharded=sharded,
                                      assign=opened.private)
        if swapped:
            report.warnings.insert(0, swapped)
        _name_sides(report, source, target)
        declare_new(report, target, declared, init)
        if not sharded and (verify is True or (verify == "auto"
                                               and _plain_copy(planned.plan, report))):
            _check(report, planned, (source, opened, target),
                   replace(want, by_name=_by_name(planned.plan, report)))
    return _finished(report, strict=strict)


def _finished(report: GraftReport, *, strict: bool) -> GraftReport:
    """The report, once the graft is done: raised if strict and not clean, else loud if not ok.

    A graft that is not ok emits one :class:`~torchgraft.errors.TorchgraftWarning` (as
    ``load_state_dict`` raises and ``from_pretrained`` prints what it initialised): a script
    that never prints the report still shows it. The command line, which prints the report,
    ignores it.
    """
    if strict and not report.clean:
        raise GraftError(report)
    if report.ok:
        logger.debug("%s", report.headline())
    else:
        warn(report.notice())
    return report


def _name_sides(report: GraftReport, source: Any, target: nn.Module) -> None:
    """Name the checkpoint and the model in the report (its page's title, its advice)."""
    if isinstance(source, (str, os.PathLike)):
        report.source_name = os.fspath(source)
    elif isinstance(source, Checkpoint):
        report.source_name = str(source.path)
    elif isinstance(source, nn.Module):
        report.source_name = f"a {type(source).__name__} module"
    else:
        report.source_name = "a state dict"
    report.model_name = type(target).__name__


@dataclass(frozen=True)
class _Into:
    """What grafting into one model takes beyond the source: the user's choices.

    Attributes:
        rules: The user's rules.
        choices: Match, adapt, init and label map.
        source_norms: The source's norms (scale key to offset).
        device: Where a meta model's tensors get their storage.
        progress: Called with (tensors done, total).
    """

    rules: RulesSpec
    choices: PlanOptions
    source_norms: dict[str, float | None]
    device: str | torch.device | None = None
    progress: Callable[[int, int], None] | None = None


def _graft_into(opened: GraftSource, source: Any, target: nn.Module, walked: Walked,
                into: _Into, *, inputs: Any = None, sharded: dict[str, Any] | None = None,
                assign: bool) -> tuple[Planned, GraftReport]:
    """Plan a graft of an opened source into ``target``, fill it, and report.

    Args:
        opened: The source.
        source: The source as given (a path's folder may hold a config.json).
        target: The unwrapped model, filled in place.
        walked: Its modules and tensors.
        into: The user's choices.
        inputs: Example inputs that order the model's tensors by use.
        sharded: Its DTensor tensors.
        assign: Whether a meta model may hold the source's tensors as they are.

    Returns:
        The plan (with the source side it pairs) and the report.
    """
    modules, tensors = walked
    side = module_side(target, _meta_inputs(inputs) if tensors.on_meta else inputs,
                       tensors=tensors.state, modules=modules)
    if tensors.on_meta and inputs is not None:  # the forward may have made tensors on meta
        walked = walk_model(target)
        modules, tensors = walked
    choices, warnings = _init_for(tensors.on_meta, into.choices)
    scope = _adapter_scope(opened, target, side.tensors)
    planned = plan_graft(opened, side, rules=into.rules, scoped=scope is not None,
                         options=replace(choices, norms=NormOffsets(
                             into.source_norms, norm_offsets(target, modules=modules)),
                             described=describe_sides(source, opened, target,
                                                      modules=modules)))
    if _new_rows(planned.plan):  # said only where some row takes init='s values
        planned.plan.warnings[:0] = warnings
    filled = fill_model(planned.plan, planned.refs, target,
                        Filling(tensors, into.device, into.progress, sharded, assign))
    report = _report(planned.plan, side, planned.source, scope)
    _record_fill(report, filled, tensors)
    _keep_computed(report, planned.plan, target, tensors)
    return planned, report


def _keep_computed(report: GraftReport, plan: Plan, target: nn.Module,
                   tensors: ModelTensors) -> None:
    """Keep the model's values the checkpoint lacks where its code computes them alike.

    Keys no checkpoint tensor could fill, computed alike under any seed, keep the model's
    value (an assumption until outputs are compared), no longer missing.
    """
    missing = set(report.missing)
    kept = computed_alike(target, tensors, [k for k in plan.unmatched if k in missing])
    if not kept:
        return
    report.missing = [k for k in report.missing if k not in kept]
    for key, how in kept.items():
        report.reasons.pop(key, None)
        report.initialised[key] = f"{how}, alike under any seed"
    report.assumptions.append(computed_assumption(list(kept)))


def _record_fill(report: GraftReport, filled: Filled, tensors: ModelTensors) -> None:
    """What the fill found beyond the plan: writes not confirmed, what the model computed."""
    confirmed, initialised = filled.confirmed, filled.initialised
    report.add_missing(confirmed.unconfirmed)
    for path, keys in confirmed.through.items():
        report.warnings.append(
            f"{'the model' if not path else repr(path)} hands out copies through its "
            f"state_dict(): {len(keys)} keys were filled through its own load_state_dict and "
            "read back")
    if not tensors.on_meta:
        return
    report.initialised.update(initialised.how)
    for key, how in initialised.how.items():
        if key in report.reasons:  # a key the checkpoint lacks: still missing, but computed
            report.reasons[key] += f"; computed by the model's code ({how})"
    report.add_missing(initialised.failed)
    report.add_missing(dict.fromkeys(initialised.skipped, _STILL_ON_META))


def _check(report: GraftReport, planned: Planned, sides: tuple[Any, GraftSource, nn.Module],
           want: Want) -> None:
    """Compare outputs with the source's, where there is something to compare with.

    A reference model of the source's code base is filled from the same opened source, by
    name, into storage of its own (never the source's own tensors: settling changes the
    model in place, and must not change what it is compared with). Never raises: the model is
    filled, and what stops a comparison is a warning.
    """
    source, opened, target = sides

    def fill(module: nn.Module, renames: list[Rule]) -> GraftReport:
        inner = unwrap(module)
        into = _Into(renames, PlanOptions(), {})
        return _graft_into(opened, source, inner, walk_model(inner), into, assign=False)[1]

    reference = reference_for(source, opened.module, target, want, fill, report.warnings)
    if reference is not None:
        verify_graft(report, planned.plan, target, reference, refs=planned.refs)


def _plain_copy(plan: Plan, report: GraftReport) -> bool:
    """Whether the model should compute what the source computes, decided from the plan.

    Every key is filled, or what is missing may be in what the checkpoint holds and the plan
    did not use (comparing outputs pairs it by what it computes); nothing re-initialised; and
    every key went through reversible layout operations only, with no cast (a cast rounds, or
    makes the model compute in another precision than its source).
    """
    pairable = report.complete or any(not is_bookkeeping(k) for k in report.unused)
    return (pairable and not report.reinitialised and not report.new
            and all(not step.cast and all(reversible(op) is not None for op in step.ops)
                    for step in plan.steps))


def _by_name(plan: Plan, report: GraftReport) -> bool:
    """Whether every key was filled by its exact name, as stored, and nothing is in doubt."""
    return (report.ok and not report.reinitialised and not report.missing
            and all(step.matched_by == "exact" and not step.ops and not step.cast
                    for step in plan.steps))


def _check_options(match: Any, init: Any, verify: Any) -> None:
    """Refuse option values that are not among the allowed ones."""
    if match not in get_args(Match):
        raise TorchgraftError(f"match={match!r}: use 'auto', 'name' or 'structure'")
    if init not in get_args(Init):
        raise TorchgraftError(f"init={init!r}: use 'keep', 'normal' or 'zeros'")
    if verify not in (True, False, "auto"):
        raise TorchgraftError(f"verify={verify!r}: use 'auto', True or False")


def _init_for(on_meta: bool, choices: PlanOptions) -> tuple[PlanOptions, list[str]]:
    """A meta model has no values to keep: new rows use ``"normal"``, with a warning."""
    if on_meta and choices.init == "keep":
        return replace(choices, init="normal"), [
            "the model is on the meta device, so it has no values of its own to keep: new rows "
            "and re-initialised heads use init='normal'"]
    return choices, []


def _new_rows(plan: Plan) -> bool:
    """Whether the plan gives some row fresh values: a re-initialised head, an added row."""
    return bool(plan.reinitialised) or any(
        isinstance(op, Rows) and len(op.pairs()) < op.n_to for step in plan.steps
        for op in step.ops)


def _report(plan: Plan, target: Side, source: Side, scope: set[str] | None) -> GraftReport:
    """The report of an executed plan, with every key's shape."""
    report = GraftReport.from_plan(plan, targets=target.tensors, sources=source.tensors)
    report.infos = (target.tensors, source.tensors)  # their shapes are found when asked
    if scope is not None:
        scope_to_adapter(report, scope)
    return report


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
        warn(warning)
        return model, source, warning
    raise TorchgraftError(
        f"tg.graft(source, model): the model must be an nn.Module, got a "
        f"{type(model).__name__}; the checkpoint (a path, a state dict, a module or a "
        "tg.open() result) comes first, the model second")


def _into_quantized(opened: GraftSource, target: nn.Module) -> GraftReport:
    """A quantized model takes the same quantized architecture's checkpoint, as stored."""
    try:
        return graft_quantized(opened.refs, target)
    finally:
        opened.close()


def _with_own_renames(rules: RulesSpec, target: nn.Module, walked: Walked,
                      opened: GraftSource) -> RulesSpec:
    """The user's rules, then the renames a transformers model makes of older checkpoints' keys.

    ``from_pretrained`` renames what ``save_pretrained`` of an older version wrote (DINOv2's
    ``attention.attention.query`` is now ``attention.q_proj``); a graft into the same class
    does too, where the checkpoint lacks a key of the model by its name. Any other model: the
    user's rules as given.
    """
    if not type(target).__module__.startswith("transformers.") or \
            walked.tensors.state.keys() <= opened.refs.keys():
        return rules
    own = transformers_renames(target)
    if not own:
        return rules
    parsed = read_rules(rules)
    return [*parsed.ops, *parsed.renames, *own]


def _meta_inputs(inputs: Any) -> Any:
    """Example inputs moved to the meta device, to order a meta model's tensors by use."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to("meta")
    if isinstance(inputs, tuple):
        return tuple(_meta_inputs(x) for x in inputs)
    if isinstance(inputs, Mapping):
        return {key: _meta_inputs(value) for key, value in inputs.items()}
    return inputs
