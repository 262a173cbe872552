"""Compare a graft's outputs with its reference; where they diverge, settle the guesses there.

When outputs differ, the first diverging unit (the module, in call order, whose activation
differs from the reference module that filled it) is where a guess went wrong. Every
hypothesis the plan's guesses give for that unit is tried on the model in place: two
same-shape sibling modules swapped (one per alternative the plan listed), rotary rows in the
other order, a gated projection's halves exchanged, a fused tensor's rows read in another
layout (``[Q; K; V]`` blocks, or head by head / key-value group by group, for each head size
the models state). The one that makes the unit agree is kept and reported, the others
undone; each tried is listed in ``report.tried``. Then outputs are compared again, until they
agree or no hypothesis helps. Outputs that agree make every key ``verified``.

Verification never turns a filled graft into an error: a model that fails on the inputs, or
outputs that do not correspond, leave the verdict the file earned, with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import TorchgraftError
from ...logs import IN_REPORT
from ...text import few
from ..evidence import ROTARY_ALTERNATIVE, Evidence
from ..layouts.conventions import unit_of
from ..layouts.glu import PARTS_REORDERED
from ..layouts.ops import Concatenate, Deinterleave, Interleave, RotaryRows, Split
from ..plan.adapt import Step, reversible
from ..plan.steps import Plan
from ..report.report import GraftReport
from ..search.activations import Run, differ, run_recorded
from ..sides.heads import model_heads
from ..sides.model import state_tensors
from ..tensors import TensorInfo
from .compare import NotComparable, Verification, compare
from .reference import Reference

__all__ = ["Hypothesis", "RowOrder", "hypotheses", "verify_graft"]

logger = logging.getLogger("torchgraft")

#: At most this many diverging units are settled in one graft.
MAX_UNITS = 64


@dataclass(frozen=True)
class RowOrder:
    """The rows of several target keys, taken together, in another order.

    Attributes:
        keys: The keys, their rows concatenated in this order.
        order: Row ``j`` of the result is row ``order[j]`` of the concatenation.
    """

    keys: tuple[str, ...]
    order: tuple[int, ...]

    def apply(self, state: dict[str, torch.Tensor], *, undo: bool = False) -> None:
        """Reorder the rows in place (or put them back)."""
        tensors = [state[key] for key in self.keys]
        rows = torch.cat([t.detach() for t in tensors])
        index = torch.tensor(self.order, device=rows.device)
        rows = rows[torch.argsort(index) if undo else index]
        for tensor, part in zip(tensors, torch.split(rows, [t.shape[0] for t in tensors]),
                                strict=True):
            tensor.copy_(part)


@dataclass(frozen=True)
class Hypothesis:
    """Another way to fill a unit: target keys exchanged in pairs, rows permuted.

    Attributes:
        name: Shown in the report.
        swaps: Pairs of target keys whose values (and sources) are exchanged.
        permutes: Target keys whose rows are reordered (rotary order), with the reordering.
        halves: Target keys whose two halves of rows are exchanged (a fused gated
            projection's gate and up).
        rows: Fused rows read in another layout (blocks or groups), over one or more keys.
    """

    name: str
    swaps: tuple[tuple[str, str], ...] = ()
    permutes: tuple[tuple[str, RotaryRows], ...] = ()
    halves: tuple[str, ...] = ()
    rows: tuple[RowOrder, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys whose rows it reorders (their modules' activations are in another order)."""
        return (*(k for k, _permute in self.permutes), *self.halves,
                *(k for order in self.rows for k in order.keys))

    def apply(self, state: dict[str, torch.Tensor], report: GraftReport, *,
              undo: bool = False) -> None:
        """Change the model in place as the hypothesis says (or change it back)."""
        with torch.no_grad():
            for first, second in self.swaps:
                held = state[first].detach().clone()
                state[first].copy_(state[second])
                state[second].copy_(held)
                report.mapping[first], report.mapping[second] = (report.mapping[second],
                                                                 report.mapping[first])
            for key, permute in self.permutes:
                way = permute.inverse([tuple(state[key].shape)]) if undo else permute
                state[key].copy_(way.apply([state[key].detach().clone()])[0])
            for key in self.halves:  # its own inverse
                top, bottom = state[key].detach().clone().chunk(2)
                state[key].copy_(torch.cat([bottom, top]))
            for order in self.rows:
                order.apply(state, undo=undo)


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _scopes(unit: str) -> list[str]:
    """The unit and its parent: a wrong q or k shows in a sibling's output (attention's)."""
    return [unit, _module(unit)] if unit else [unit]


def _within(key: str, scope: str) -> bool:
    return not scope or key.startswith(scope + ".")


def hypotheses(report: GraftReport, unit: str, head_dims: Iterable[int] = (),
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Hypothesis]:
    """The hypotheses of a diverging unit, nearest guesses first.

    Guesses in the unit come first, then those in its parent (a wrong q or k
    shows in the attention output, not in its own), then those of modules outside every
    numbered block (an embedding and a head swapped show in the first block: a head's output
    is no embedding's to compare). For a guessed module, each alternative
    module swapped with it (every tensor with its namesake); for guessed rotary rows, the q
    and k weights in the scope permuted into the other rotary order (for each head size
    given); for a guessed fused layout (a fused tensor made from parts, or parts split from
    one), its rows read in each other layout: blocks, or groups of each head size given.
    Last, where ``shapes`` are given, the unit swapped with each module of the same
    tensors and shapes that structure matched (nearest first, at most
    :data:`MAX_LOOKALIKES`): structure can be wrong where names say nothing.

    Args:
        report: The graft's report (its guesses, evidence and mapping).
        unit: The target module path where outputs first diverge.
        head_dims: Head sizes to try for rotary permutations.
        shapes: Target key to shape, for swaps with same-shape modules.

    Returns:
        The hypotheses, each once.
    """
    found: dict[str, Hypothesis] = {}
    for scope in [*_scopes(unit), None]:
        guessed = [k for k in report.guesses if _within(k, scope)] if scope is not None else [
            k for k in report.guesses if not unit_of(_module(k))]  # outside every block
        for hypothesis in [*_swaps(report, guessed), *_rotary(report, guessed, head_dims),
                           *_halves(report, guessed), *_layouts(report, guessed, head_dims,
                                                                shapes or {})]:
            found.setdefault(hypothesis.name, hypothesis)
    for hypothesis in _lookalikes(report, unit, shapes or {}):
        found.setdefault(hypothesis.name, hypothesis)
    return list(found.values())


#: At most this many same-shape modules are tried against a diverging unit.
MAX_LOOKALIKES = 16


def _signature(report: GraftReport, module: str,
               shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A module's loaded tensors (leaf, shape), if none is known by name; else empty."""
    keys = [k for k in report.loaded if _module(k) == module]
    if not keys or any(report.evidence.get(k) is Evidence.NAME or k not in shapes
                       for k in keys):
        return ()
    return tuple(sorted((k.rpartition(".")[2], shapes[k]) for k in keys))


def _lookalikes(report: GraftReport, unit: str,
                shapes: Mapping[str, tuple[int, ...]]) -> list[Hypothesis]:
    signature = _signature(report, unit, shapes)
    if not signature:
        return []
    others = {_module(k) for k in report.loaded} - {unit}
    alike = [m for m in others if _signature(report, m, shapes) == signature]
    alike.sort(key=lambda m: -len(os.path.commonpath([m.replace(".", "/"),
                                                      unit.replace(".", "/")])))
    return [Hypothesis(f"'{unit}' and '{other}' swapped (same shapes, matched by structure)",
                       tuple((f"{unit}.{leaf}", f"{other}.{leaf}") for leaf, _ in signature))
            for other in alike[:MAX_LOOKALIKES]]


def _swaps(report: GraftReport, guessed: list[str]) -> list[Hypothesis]:
    filled_from = {source: target for target, source in report.mapping.items()}
    found = []
    for key in guessed:
        module = _module(key)
        for alternative in report.guesses[key].alternatives:
            other = filled_from.get(alternative)
            if other is None or _module(other) == module:
                continue
            first, second = sorted((module, _module(other)))
            leaves = {k.rpartition(".")[2] for k in report.loaded if _module(k) == first}
            swaps = tuple((f"{first}.{leaf}", f"{second}.{leaf}") for leaf in sorted(leaves)
                          if f"{second}.{leaf}" in report.mapping)
            if swaps:
                found.append(Hypothesis(f"'{first}' and '{second}' swapped", swaps))
    return found


def _rotary(report: GraftReport, guessed: list[str], head_dims: Iterable[int]) -> list[Hypothesis]:
    """For guessed rotary rows, the q and k weights and biases in the other rotary order.

    A fused ``[Q; K; V]`` keeps its V rows: the rows the graft reordered are the ones tried.
    """
    rows = tuple(k for k in guessed if k.endswith((".weight", ".bias")) and any(
        a.endswith(ROTARY_ALTERNATIVE) for a in report.guesses[k].alternatives))
    if not rows:
        return []
    reordered = {step.target: rotary.rows for step in report.plan.steps for op in step.ops
                 if isinstance(rotary := reversible(op), RotaryRows)} \
        if report.plan is not None else {}
    where = _module(_module(rows[0])) or "the model"
    return [Hypothesis(f"rotary rows of {', '.join(repr(k) for k in rows)} permuted ("
                       f"{'Meta -> transformers' if to_halves else 'transformers -> Meta'} order, "
                       f"head_dim {head_dim}) in '{where}'",
                       permutes=tuple((k, RotaryRows(head_dim, to_halves, reordered.get(k)))
                                      for k in rows))
            for head_dim in dict.fromkeys(head_dims) for to_halves in (False, True)]


def _halves(report: GraftReport, guessed: list[str]) -> list[Hypothesis]:
    """For fused tensors whose parts' order was guessed, the parts the other way round.

    A module's tensors go together (a fused projection's weight and bias were fused alike).
    """
    by_module: dict[str, list[str]] = {}
    for key in guessed:
        if any(a.endswith(PARTS_REORDERED) for a in report.guesses[key].alternatives):
            by_module.setdefault(_module(key), []).append(key)
    return [Hypothesis(f"halves of {', '.join(repr(k) for k in keys)} exchanged",
                       halves=tuple(keys)) for keys in by_module.values()]


#: A fused tensor's layout: ``None`` for parts in blocks (``[Q; K; V]``), else the number of
#: groups its rows are stored in (head by head, key/value group by group).
_Layout = int | None


def _stored_rows(rows: tuple[int, ...], layout: _Layout) -> list[int]:
    """For each row as stored in ``layout``, its row among the parts taken in blocks."""
    if layout is None:
        return list(range(sum(rows)))
    found: list[int] = []
    for group in range(layout):
        start = 0
        for size in rows:
            per = size // layout
            found += range(start + group * per, start + (group + 1) * per)
            start += size
    return found


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, row in enumerate(order):
        inverse[row] = position
    return inverse


def _describe(rows: tuple[int, ...], layout: _Layout) -> str:
    if layout is None:
        return f"[{'; '.join(map(str, rows))}] rows in blocks"
    return f"{layout} groups of {'+'.join(str(r // layout) for r in rows)} rows"


def _derived(report: GraftReport, key: str) -> tuple[object, tuple[str, ...],
                                                     tuple[str, ...]] | None:
    """The operation that made the source of ``key``: op, its inputs and its outputs."""
    plan = report.plan
    source = report.mapping.get(key)
    if plan is None or plan.layout is None or source is None:
        return None
    for derivation in plan.layout.derivations:
        if source in derivation.outputs:
            return derivation.op, derivation.inputs, derivation.outputs
    return None


#: A fused layout as read: its keys, each part's rows, the layout, whether the keys are parts.
_Fused = tuple[tuple[str, ...], tuple[int, ...], _Layout, bool]


def _fused_rows(report: GraftReport, key: str,
                shapes: Mapping[str, tuple[int, ...]]) -> _Fused | None:
    """How ``key`` was read from a fused layout; ``None`` when it was not filled from one."""
    found = _derived(report, key)
    if found is None or report.plan is None or report.plan.layout is None:
        return None
    op, inputs, outputs = found
    if isinstance(op, (Concatenate, Interleave)) and shapes.get(key):
        return _fused_target(op, inputs, report.plan.layout.stored, key, shapes[key][0])
    if isinstance(op, (Split, Deinterleave)):
        return _split_parts(op, report, outputs, shapes)
    return None


def _fused_target(op: Concatenate | Interleave, inputs: tuple[str, ...],
                  stored: Mapping[str, TensorInfo], key: str, total: int) -> _Fused | None:
    """A target fused from parts: ``[parts]`` blocks, or groups of them."""
    if isinstance(op, Interleave):
        groups = total // sum(op.sizes)
        return (key,), tuple(size * groups for size in op.sizes), groups, False
    infos = [stored.get(name) for name in inputs]
    rows = tuple(i.shape[0] for i in infos if i is not None and i.shape)
    return ((key,), rows, None, False) if op.dim == 0 and len(rows) == len(inputs) else None


def _split_parts(op: Split | Deinterleave, report: GraftReport, outputs: tuple[str, ...],
                 shapes: Mapping[str, tuple[int, ...]]) -> _Fused | None:
    """Targets filled with the parts of one fused source, read as blocks or groups."""
    filled_from = {source: target for target, source in report.mapping.items()}
    keys = tuple(filled_from.get(name, "") for name in outputs)
    if not all(shapes.get(k) for k in keys):
        return None
    rows = tuple(shapes[k][0] for k in keys)
    if isinstance(op, Split):
        return (keys, rows, None, True) if op.dim == 0 else None
    return keys, rows, rows[-1] // op.sizes[-1], True


def _plain_steps(report: GraftReport, keys: Iterable[str]) -> bool:
    """Whether the keys were filled without operations of their own (rows as read)."""
    plan = report.plan
    steps = {s.target: s for s in plan.steps} if plan is not None else {}
    return all(k in steps and all(isinstance(op, Step) and op.identity for op in steps[k].ops)
               for k in keys)


#: Where a fused layout was read: its module, each part's rows, the layout, whether parts.
_Site = tuple[str, tuple[int, ...], _Layout, bool]


def _layouts(report: GraftReport, guessed: list[str], head_dims: Iterable[int],
             shapes: Mapping[str, tuple[int, ...]]) -> list[Hypothesis]:
    """For a guessed fused layout, its rows read in each other layout.

    A fused target made ``[Q; K; V]`` may be stored head by head (or key/value group by
    group), and the other way round; parts split from a fused source may have been read in
    the wrong one. Groups come from each head size given (as many groups as key/value heads,
    or as heads). A module's weight and bias are read again together.
    """
    sites: dict[_Site, list[tuple[str, ...]]] = {}
    for key in guessed:
        fused = _fused_rows(report, key, shapes)
        if fused is None or not _plain_steps(report, fused[0]):
            continue
        keys, rows, read, parts = fused
        site = (_module(_module(keys[0])) if parts else _module(keys[0]), rows, read, parts)
        if keys not in sites.setdefault(site, []):
            sites[site].append(keys)
    sizes = [d for d in dict.fromkeys(head_dims) if d > 0]
    return [hypothesis for site, groups in sites.items()
            for hypothesis in _relaid(site, groups, sizes)]


def _relaid(site: _Site, groups: list[tuple[str, ...]], sizes: list[int]) -> list[Hypothesis]:
    """The hypotheses of one site: its rows in each layout but the one read."""
    path, rows, read, parts = site
    as_read = _stored_rows(rows, read)
    found = []
    for layout in [None, *dict.fromkeys(count // size for size in sizes
                                        for count in (rows[-1], rows[0])
                                        if count % size == 0 and count // size > 1)]:
        if layout == read or (layout is not None and any(r % layout for r in rows)):
            continue
        other = _stored_rows(rows, layout)
        order = tuple([as_read[i] for i in _inverse(other)] if parts
                      else [_inverse(as_read)[i] for i in other])
        what = f"the parts in '{path}'" if parts else f"'{path}'"
        found.append(Hypothesis(f"fused rows of {what} read as {_describe(rows, layout)}, "
                                f"not {_describe(rows, read)}",
                                rows=tuple(RowOrder(keys, order) for keys in groups)))
    return found


def _agrees(source: Run, target: nn.Module, reference: Reference, unit: str,
            module_map: Mapping[str, str], rtol: float) -> bool:
    """Whether the unit's activation agrees with its (possibly new) reference module's."""
    seen = run_recorded(target, reference.target_call).seen
    source_path = module_map.get(unit)
    return (unit in seen and source_path in source.seen
            and differ(source.seen[source_path], seen[unit], rtol) is None)


def _settle(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference,
            source: Run, unit: str, rtol: float,
            tried: dict[tuple[str, str], str], kept: list[Hypothesis]) -> Hypothesis | None:
    """Try each hypothesis of the unit in turn; keep the first that makes it agree.

    ``tried``: (unit, hypothesis) to its outcome. A hypothesis tried against another unit is
    tried again: a guess upstream (kept since) may have hidden what it would have settled;
    one ``kept`` is never undone.
    """
    state = state_tensors(target)
    shapes = {key: tuple(tensor.shape) for key, tensor in state.items()}
    kept_names = {h.name for h in kept}
    for hypothesis in hypotheses(report, unit, _head_dims(target, reference.module), shapes):
        key = (unit, hypothesis.name)
        if key in tried or hypothesis.name in kept_names:
            continue
        try:
            hypothesis.apply(state, report)
        except Exception as exc:  # shapes it cannot take: nothing changed that stays
            tried[key] = f"could not be applied ({type(exc).__name__}: {exc})"
            continue
        try:
            agrees = _agrees(source, target, reference, unit,
                             _module_map(report, plan, reference.names), rtol)
        except TorchgraftError as exc:
            agrees, tried[key] = False, f"the model failed with it ({exc})"
        if agrees:
            tried[key] = f"made '{unit}' agree: kept"
            return hypothesis
        tried.setdefault(key, f"'{unit}' still diverged")
        hypothesis.apply(state, report, undo=True)
    return None


def _head_dims(*models: nn.Module) -> list[int]:
    """Head sizes the models say: their configs' width per head, their modules' head sizes."""
    found: list[int] = []
    for model in models:
        config = getattr(model, "config", None)
        hidden, heads = (getattr(config, "hidden_size", None),
                         getattr(config, "num_attention_heads", None))
        stated = getattr(config, "head_dim", None)
        if isinstance(stated, int) and stated > 0:
            found.append(stated)
        if isinstance(hidden, int) and isinstance(heads, int) and heads:
            found.append(hidden // heads)
        found += sorted(v for v in model_heads(model)[0].get("head size", ()) if v > 1)
    return list(dict.fromkeys(found))


def _module_map(report: GraftReport, plan: Plan, names: dict[str, str],
                reordered: Iterable[str] = ()) -> dict[str, str]:
    """Target module to the reference module that filled it, as the report's mapping says now.

    Modules whose rows were reordered (rotary) are left out: their activations differ in order.
    """
    permuted = {_module(s.target) for s in plan.steps
                if any(isinstance(reversible(op), RotaryRows) for op in s.ops)} | set(reordered)
    found = {_module(key): _module(names.get(source, source))
             for key, source in report.mapping.items()}
    return {k: v for k, v in found.items() if k not in permuted}


def verify_graft(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference, *,
                 rtol: float = 1e-4) -> None:
    """Compare what corresponds, settle guesses where it diverges, and record the outcome.

    Never raises for the graft's sake: a model that fails on the inputs, or nothing that
    corresponds, is a warning, and the verdict stays as the file earned it.

    Args:
        report: The graft's report: its evidence, divergence and mapping are updated.
        plan: The executed plan.
        target: The grafted model (changed in place when a hypothesis is kept).
        reference: What to compare with.
        rtol: Tolerance relative to the reference output's largest magnitude.
    """
    first = _first_run(report, plan, target, reference, rtol)
    if first is None:
        logger.warning("%s", report.warnings[-1], extra=IN_REPORT)
        return
    reference, source, result = first
    kept: list[Hypothesis] = []
    tried: dict[tuple[str, str], str] = {}
    while result.divergence is not None and result.unit is not None and len(kept) < MAX_UNITS:
        hypothesis = _settle(report, plan, target, reference, source, result.unit[0], rtol,
                             tried, kept)
        if hypothesis is None:
            break
        kept.append(hypothesis)
        reordered = [_module(key) for h in kept for key in h.keys]
        try:
            result = compare(source, target, None, reference.target_call,
                             module_map=_module_map(report, plan, reference.names, reordered),
                             rtol=rtol, outputs=not report.new)
        except TorchgraftError as exc:  # it ran with the hypothesis once: not expected
            report.warnings.append(f"outputs could not be compared again after settling: {exc}")
            break
    report.tried = [f"{name}: {outcome}" for (_, name), outcome in tried.items()]
    _record(report, result, reference, [h.name for h in kept])


def _first_run(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference,
               rtol: float) -> tuple[Reference, Run, Verification] | None:
    """The first comparison the models run for: the inputs given, or each generated in turn.

    Generated inputs are tried until both models run on them (images of another size...).
    Where the models fail on every one, or nothing of their outputs corresponds, the report
    says why in a warning (the verdict stays as the file earned it).

    Returns:
        The reference with the inputs used, the source's run, and the comparison; ``None``
        when outputs were not compared.
    """
    failures: list[str] = []
    for tried in reference.tries():
        try:
            source = run_recorded(tried.module, tried.source_call)
            return tried, source, compare(
                source, target, None, tried.target_call, rtol=rtol, outputs=not report.new,
                module_map=_module_map(report, plan, tried.names))
        except NotComparable as exc:  # the models ran: other inputs would not help
            report.warnings.append(f"outputs were not compared with {reference.origin}: {exc}")
            return None
        except TorchgraftError as exc:
            failures.append(f"{exc} (on inputs generated {tried.generated})"
                            if tried.generated else str(exc))
    every = "the models fail on every input generated: " if len(failures) > 1 else ""
    give = ("; give inputs the models take: example_inputs= (CLI: --inputs FILE or "
            "--input-shape N,C,H,W)" if reference.generated else "")
    report.warnings.append(f"outputs were not compared with {reference.origin}: {every}"
                           f"{'; '.join(failures)}{give}")
    return None


def _record(report: GraftReport, result: Verification, reference: Reference,
            kept: Iterable[str]) -> None:
    report.max_abs_diff = result.max_abs_diff
    report.verified_with = reference.origin
    report.settled = list(kept)
    if result.compared != "outputs":
        report.warnings.append(f"compared {result.compared}")
    if result.divergence is not None:
        tried = f"; {len(report.tried)} hypotheses tried" if report.tried else ""
        report.diverged_at = result.unit[0] if result.unit is not None else None
        report.divergence = (f"{result.divergence}; {result.compared} differ by "
                             f"{result.max_abs_diff:.3g} (tolerance {result.tolerance:.3g}) "
                             f"from {reference.origin}'s{tried}")
    elif result.uncovered:
        report.warnings.append(f"they agree, but {few(result.uncovered, show=repr)} run after "
                               "it and were not compared: the verdict stays as the file earned "
                               "it")
    else:
        report.mark_verified()
