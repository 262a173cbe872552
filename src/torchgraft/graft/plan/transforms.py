"""What a pair of tensors needs on the way, or why it cannot be filled.

Transposes, rotary rows, dequantisation, casts, and the shape adaptations users mean: a first
convolution's input channels, a head's or an embedding's rows. A width that differs inside the
network (a norm, a hidden size) is another configuration of the architecture: refused, never
adapted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import TorchgraftError
from ...meta import dtype_name
from ...quantized import is_quantized
from ..evidence import NAME_STEPS, Evidence, Guess, MatchStep
from ..layouts import ops
from ..layouts.bare import unknown_orientation
from ..layouts.conventions import CONVENTIONS, role_of
from ..layouts.glu import halves_between
from ..layouts.layout import Layout
from ..layouts.norms import NormOffsets
from ..sides.heads import owner_of
from ..tensors import Side, TensorInfo
from .adapt import Dequantize, Init, InputChannels, LabelMap, Op, Rows, Step, label_pairs
from .steps import REINITIALISED, Plan, PlanStep

__all__ = ["Options", "decide", "fits_for", "takes"]


def _relaid(src: TensorInfo, dst: TensorInfo, layouts: Sequence[Layout]) -> Step | None:
    """How a layout stores the source weight: transposed, axes permuted, or reshaped."""
    for layout in layouts:
        if layout.transposed(src, dst):
            return Step(ops.Transpose(0, 1), layout.why)
        dims = layout.permuted(src, dst)
        if dims is not None:
            return Step(ops.Permute(dims), layout.why)
        if layout.reshaped(src, dst):
            return Step(ops.Reshape(dst.shape), layout.why)
    return None


def _relaid_shape(step: Step, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape a stored tensor has once relaid; ``None`` when it does not fit the step."""
    try:
        return step.op.shapes([shape])[0]
    except TorchgraftError:
        return None


# Module kinds that hold the same thing in another layout (a Conv1D bias is a Linear bias; a
# convolution's bias is a Linear's, its weight one only when its kernel is 1x1).
_SAME_KIND = {"gpt2_conv1d": "linear", "conv": "linear"}


def _kinds_differ(src: TensorInfo, dst: TensorInfo) -> bool:
    if src.kind is None or dst.kind is None:
        return False
    return _SAME_KIND.get(src.kind, src.kind) != _SAME_KIND.get(dst.kind, dst.kind)


def fits_for(layouts: Sequence[Layout]) -> Callable[[TensorInfo, TensorInfo], bool]:
    """Whether a source tensor can fill a target tensor: shape (or transposed), module kind."""
    def fits(src: TensorInfo, dst: TensorInfo) -> bool:
        relaid = _relaid(src, dst, layouts)
        if _kinds_differ(src, dst) and relaid is None:
            return False
        return (_relaid_shape(relaid, src.shape) if relaid else src.shape) == dst.shape
    return fits


def takes(options: Options, src: TensorInfo, dst: TensorInfo) -> bool:
    """Whether a source tensor paired by a weak name can fill a target tensor, adapted or not.

    A name that only matches once a prefix is removed is a hint: a pair whose shapes neither
    fit nor adapt (rows of a head or an embedding, a first convolution's input channels) is
    another module that happens to share a name, not a tensor of another configuration.
    """
    relaid = _relaid(src, dst, options.layouts)
    shape = (_relaid_shape(relaid, src.shape) if relaid else None) or src.shape
    if shape == dst.shape:
        return not _kinds_differ(src, dst) or relaid is not None
    return options.adapt and _adapt(src, dst, shape, options) is not None


def _rotary(target: str, dst: Side, layouts: Sequence[Layout]) -> Step | str | None:
    """The rotary reordering a target tensor needs; a reason when its heads are unknown."""
    for layout in layouts:
        rotary = layout.rotary
        if rotary is None:
            continue
        fused = rotary.fused is not None and rotary.fused.search(target) is not None
        if not fused and not rotary.rows.search(target):
            continue
        owner = owner_of(target, dst.head_dims)
        counts = dst.head_counts.get(owner[0]) if owner else None
        if owner is None or (fused and counts is None):
            return (f"Cannot load '{target}': its rotary rows are in "
                    f"{layout.name.split('->')[0]}'s order and the model says no "
                    f"{'head counts' if owner else 'head_dim'} to reorder them by (give its "
                    "attention module head_dim, n_head and n_local_heads attributes).")
        rows = (counts[0] + counts[1]) * owner[1] if fused and counts else None
        return Step(ops.RotaryRows(owner[1], rotary.halves, rows))
    return None


@dataclass(frozen=True)
class Options:
    """What the user allowed, and what the target says, for every pair's decision.

    Attributes:
        layouts: The layouts between the two sides.
        dst: The target side.
        adapt: Whether shapes may be adapted (rows, input channels).
        init: How new rows and re-initialised heads are filled.
        label_map: Which source rows fill which target rows.
        derived: Virtual source keys (fused, split, stacked) to how they were made.
        vocab: Row counts of the target's embeddings (a head as wide is a vocabulary).
        heads: Target modules that are an output head: by role, or the last module used.
        first: The target's first module used (whose input channels may be adapted).
        doubts: Virtual source keys whose layout is a guess, to the guess (a per-head layout
            read with the model's head size, a gated projection's halves in a guessed order).
        source_heads: Whether the source states its head sizes (a module, a config, a file's
            metadata); without them a head-dependent layout (rotary rows) is a guess.
        norms: The offsets both sides' norms store their scales with (Gemma's ``gamma - 1``).
        conventions: Whether a pair may need what two code bases store differently (a norm's
            unit offset, a gated projection's halves); if not, same shapes are a plain copy.
        ruled: Source keys the user's operation rules made: in the layout the rules say, so a
            ruled tensor the model's shape takes is copied as it is (cast aside).
    """

    layouts: Sequence[Layout]
    dst: Side
    adapt: bool = True
    init: Init = "keep"
    label_map: LabelMap | None = None
    derived: Mapping[str, str] = field(default_factory=dict)
    vocab: frozenset[int] = frozenset()
    heads: frozenset[str] = frozenset()
    first: str = ""
    doubts: Mapping[str, Guess] = field(default_factory=dict)
    source_heads: bool = True
    norms: NormOffsets = field(default_factory=NormOffsets)
    conventions: bool = True
    ruled: frozenset[str] = frozenset()

    @classmethod
    def of(cls, layouts: Sequence[Layout], dst: Side, **kwargs: Any) -> Options:
        """Options with the target's vocabularies and heads found once."""
        vocab = frozenset(info.shape[0] for info in dst.tensors.values()
                          if info.kind == "embedding" and len(info.shape) == 2)
        infos = dst.tensors
        modules = [info.module for k in dst.order_at_hand if (info := infos[k]).kind != "norm"]
        heads = {m for m in dict.fromkeys(modules)  # one regex first: 100k modules
                 if _HEAD.regex.search(m) and role_of(m) == "head"}
        heads |= {modules[-1]} if modules else set()
        return cls(layouts, dst, vocab=vocab, heads=frozenset(heads),
                   first=modules[0] if modules else "", **kwargs)


#: The convention naming heads: only a module it names can have the role.
_HEAD = next(c for c in CONVENTIONS if c.role == "head")


def _shape_text(shape: tuple[int, ...]) -> str:
    return str(shape) if len(shape) != 1 else f"({shape[0]},)"


def _adapt(src: TensorInfo, dst: TensorInfo, shape: tuple[int, ...],
           options: Options) -> Op | str | None:
    """The adaptation turning ``shape`` into the target's; a reason to re-initialise it.

    ``None`` when it cannot be adapted: a width inside the network (a norm, a hidden size).
    """
    if len(shape) != len(dst.shape) or not shape or dst.kind == "norm":
        return None
    differ = [i for i, (a, b) in enumerate(zip(shape, dst.shape, strict=True)) if a != b]
    init = options.init
    if (differ == [1] and len(shape) in (3, 4, 5) and dst.kind in ("conv", None)
            and dst.module == options.first):
        return InputChannels(shape[1], dst.shape[1], init)
    if differ != [0]:
        return None
    if dst.kind == "embedding" or dst.shape[0] in options.vocab:
        return Rows(shape[0], dst.shape[0], init, None if options.label_map is None else
                    label_pairs(options.label_map, shape[0], dst.shape[0]))
    if dst.module not in options.heads:
        return None
    if options.label_map is not None:
        return Rows(shape[0], dst.shape[0], init,
                    label_pairs(options.label_map, shape[0], dst.shape[0]))
    return (f"the checkpoint has {shape[0]} rows ('{src.name}'), the model {dst.shape[0]}: a new "
            f"head, re-initialised (init={init!r}); pass label_map=... to keep rows that "
            "correspond")


def _refuse(plan: Plan, target: str, source: str, shapes: tuple[tuple[int, ...], ...],
            options: Options) -> None:
    """Record a target that no adaptation fits, with the reason and the fix."""
    shape, wanted = (_shape_text(s) for s in shapes)
    if not options.adapt:
        fix = ("Without adapt=False (CLI: --no-adapt) it is re-initialised; or add a rule that "
               "drops it.")
    else:  # rows of a head or an embedding, a first convolution's inputs: adapted above
        fix = ("A width inside the network differs: the checkpoint is another configuration "
               "of the architecture (build the model with the checkpoint's sizes), or add a "
               "rule that drops it.")
    plan.missing[target] = (f"Cannot load '{target}': checkpoint has {shape} ('{source}'), model "
                            f"expects {wanted}. {fix}")
    plan.unused[source] = f"does not fit '{target}': {shape} vs {wanted}"


def _layout_ops(target: str, source: str, src: TensorInfo, dst: TensorInfo,
                options: Options) -> tuple[list[Op], torch.dtype, Step | None, Step | str | None]:
    """The layout operations a pair needs before any adaptation, and the dtype they give.

    Returns:
        The operations, the dtype of their result, the relaying step among them (if any),
        and the rotary step the target needs (or why it cannot be reordered).
    """
    steps: list[Op] = [Step(_VIRTUAL, options.derived[source])] if source in options.derived \
        else []
    dtype = src.dtype
    if is_quantized(src.dtype) and not is_quantized(dst.dtype):
        steps.append(Dequantize(dtype_name(src.dtype)))
        dtype = torch.float32
    relaid = _relaid(src, dst, options.layouts)
    steps += [relaid] if relaid else []
    return steps, dtype, relaid, _rotary(target, options.dst, options.layouts)


#: The operation of a virtual source tensor's step: it was made fused, split or stacked already.
_VIRTUAL = ops.Chain(())


def _pair_guess(source: str, infos: tuple[TensorInfo, TensorInfo],
                rotary: Step | None, options: Options) -> Guess | None:
    """What the pair's own layout leaves a guess.

    A square bare parameter's orientation against a Linear's weight, a layout's reading of a
    shape that reads the same two ways (:attr:`~torchgraft.graft.layouts.layout.Layout.doubt`),
    or rotary rows reordered with the model's head size.
    """
    if unknown_orientation(*infos):
        return Guess((f"{source} (as stored)", f"{source} (transposed)"),
                     "a square bare parameter against a Linear's weight: neither its name nor "
                     "its shape says whether it is stored [out, in] or [in, out] (x @ W)")
    for layout in options.layouts:
        doubt = layout.doubt(*infos)
        if doubt is not None:
            return Guess(tuple(f"{source} ({reading})" for reading in doubt[0]), doubt[1])
    if rotary is not None and not options.source_heads:
        return Guess((f"{source} read with another head count",),
                     "the checkpoint does not say its head count; its rotary rows were "
                     "reordered with the model's head size")
    return None


def decide(plan: Plan, target: str, source: str, how: MatchStep, src: TensorInfo,
           options: Options) -> None:
    """Add the step that fills ``target`` from ``source``, or say why it cannot be filled.

    Args:
        plan: The plan, extended in place.
        target: The target key.
        source: The source key.
        how: The step that paired them.
        src: The source tensor's info.
        options: The options.
    """
    dst = options.dst.tensors[target]
    direct = _direct(plan, target, source, how, (src, dst), options)
    if direct is not None:
        plan.steps.append(direct)
        return
    steps, dtype, relaid, rotary = _layout_ops(target, source, src, dst, options)
    if isinstance(rotary, str):
        plan.missing[target] = rotary
        plan.unused[source] = f"its rotary rows could not be reordered for '{target}'"
        return
    steps += [rotary] if rotary is not None else []
    shape = (_relaid_shape(relaid, src.shape) if relaid else None) or src.shape
    if shape != dst.shape:
        op = _adapt(src, dst, shape, options) if options.adapt else None
        if isinstance(op, str):
            plan.reinitialised[target] = op
            plan.unused[source] = f"'{target}' {REINITIALISED}"
            return
        if op is None:
            _refuse(plan, target, source, (shape, dst.shape), options)
            return
        steps.append(op)
    conventions, guess = _conventions(source, target, options)
    cast = "" if dtype == dst.dtype else f"{dtype_name(dtype)}->{dtype_name(dst.dtype)}"
    guess = _pair_guess(source, (src, dst), rotary, options) or guess
    if guess is not None and target not in plan.guesses:
        plan.guesses[target] = guess
    plan.steps.append(PlanStep(target, source, how, (*steps, *conventions), cast,
                               _evidence(plan, target, how)))


def _direct(plan: Plan, target: str, source: str, how: MatchStep,
            infos: tuple[TensorInfo, TensorInfo], options: Options) -> PlanStep | None:
    """The step of a pair that needs no decision, if it is one.

    A tensor the user's operation rules made is in the layout the rules say: copied as it is
    (cast aside). A plain copy (the common case) is decided without the checks of
    :func:`decide`.
    """
    src, dst = infos
    if source in options.ruled and src.shape == dst.shape:
        cast = "" if src.dtype == dst.dtype else \
            f"{dtype_name(src.dtype)}->{dtype_name(dst.dtype)}"
        made = (Step(_VIRTUAL, options.derived[source]),) if source in options.derived else ()
        return PlanStep(target, source, how, made, cast, _evidence(plan, target, how))
    if (not options.layouts and src.shape == dst.shape and src.dtype == dst.dtype
            and source not in options.derived and source not in options.doubts
            and not options.conventions):
        return PlanStep(target, source, how, (), "", _evidence(plan, target, how))
    return None


def _conventions(source: str, target: str, options: Options) -> tuple[list[Op], Guess | None]:
    """What the two code bases store differently, and the guess the pair is.

    A norm's unit offset and a gated projection's halves; the guess is a layout's, else a
    convention's.
    """
    delta, offset_guess = options.norms.between(source, target)
    exchange, order_guess = halves_between(source, target)
    steps: list[Op] = [Step(ops.Offset(delta), _UNIT_OFFSET_WHY)] if delta else []
    steps += [Step(ops.Reverse(0, 2), "the two code bases store gate and up the other way "
                                     "round")] if exchange else []
    return steps, options.doubts.get(source) or offset_guess or order_guess


#: Why a norm's weight gets a unit offset.
_UNIT_OFFSET_WHY = "one norm scales by 1 + weight, the other by weight"


def _evidence(plan: Plan, target: str, how: MatchStep) -> Evidence:
    return (Evidence.GUESS if target in plan.guesses
            else Evidence.NAME if how in NAME_STEPS else Evidence.STRUCTURE)
