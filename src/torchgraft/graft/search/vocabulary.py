"""The hypotheses of a unit, generated from the vocabulary of layout operations.

A unit's decision points (:data:`Dimension`) are found from its keys' steps, never from a table
of code bases:

- each fused tensor among them (split into the model's parts, joined from the source's, or
  copied between two fused layouts): its rows in blocks or in groups (as many as the heads,
  the key/value heads or the cores the models or their sizes allow), its parts stored in any
  order, the rotary rows of its q and k in the other order;
- a q and a k filled apart (by role, in either model's names): their rotary rows reordered;
- same-shape siblings: modules of one signature under one parent, same-shape tensors of one
  module, the alternatives a plan's guess listed, same-shape modules structure paired
  elsewhere: exchanged;
- square weights: transposed.

A choice is one option of one decision point; combinations of them are tried by
:func:`choices`, fewest changes first. Options that read the rows the same way as the plan, or
as another option, are left out (their effect on row indices is compared).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ...meta import TensorMeta, TensorRef
from ..evidence import Guess
from ..layouts import ops
from ..layouts.conventions import role_of
from ..sides.heads import model_heads
from .edits import Edit, Exchange, Relayout, Rotate, Transpose
from .view import PlanView

__all__ = ["Choice", "Dimension", "Heads", "choices", "dimensions", "heads_of", "lookalikes"]


@dataclass(frozen=True)
class Choice:
    """One way to fill some of a unit's keys otherwise: edits, applied in order."""

    edits: tuple[Edit, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key an edit changes."""
        return tuple(dict.fromkeys(k for edit in self.edits for k in edit.keys))

    def describe(self) -> str:
        """What it does, for the report."""
        return "; ".join(edit.describe() for edit in self.edits)


#: A decision point's options other than the plan's own, in the order to try them.
Dimension = list[Choice]


@dataclass(frozen=True)
class Heads:
    """What the models say of their attention: head sizes, and head and key/value head counts."""

    sizes: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()


def heads_of(*models: nn.Module) -> Heads:
    """The head sizes and counts the models state: their configs, their modules' attributes."""
    sizes: list[int] = []
    counts: list[int] = []
    for model in models:
        config = getattr(model, "config", None)
        hidden, heads = (getattr(config, "hidden_size", None),
                         getattr(config, "num_attention_heads", None))
        stated = getattr(config, "head_dim", None)
        if isinstance(stated, int) and stated > 0:
            sizes.append(stated)
        if isinstance(hidden, int) and isinstance(heads, int) and heads:
            sizes.append(hidden // heads)
        found = model_heads(model)[0]
        sizes += sorted(v for v in found.get("head size", ()) if v > 1)
        counts += sorted(v for name in ("heads", "kv heads") for v in found.get(name, ()) if v)
    return Heads(tuple(dict.fromkeys(sizes)), tuple(dict.fromkeys(counts)))


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _leaf(key: str) -> str:
    return key.rpartition(".")[2]


#: The parts of a fused module, by its role.
_FUSED_PARTS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up"), "up_gate": ("up", "gate")}
#: Cores a fused tensor's rows may be stored by (model-parallel shards), beyond head counts.
_CORES = (2, 4, 8)


def _groups(sizes: Sequence[int], heads: Heads) -> list[int]:
    """Group counts a fused tensor of these parts may be stored in: 1 (blocks) first."""
    found = [1, *heads.counts, *(size // head for head in heads.sizes for size in sizes
                                 if size % head == 0), *_CORES]
    return [g for g in dict.fromkeys(found)
            if g >= 1 and all(size % g == 0 and size >= g for size in sizes)]


def _rotaries(heads: Heads, roles: Sequence[str | None]) -> list[tuple[int, bool] | None]:
    """Rotary choices for a fused tensor's parts: none, else each head size, each way."""
    if len(roles) < 2 or ("q" not in roles and len(roles) != 3):
        return [None]
    return [None, *((head, halves) for head in heads.sizes if head % 2 == 0
                    for halves in (True, False))]


@dataclass
class _Site:
    """A fused tensor among a unit's keys, as the plan reads it."""

    kind: str
    legs: list[tuple[str, ...]] = field(default_factory=list)
    sizes: tuple[int, ...] = ()
    roles: tuple[str | None, ...] = ()


def _is_rows(op: ops.TensorOp, *, joined: bool) -> bool:
    """Whether an operation cuts (or joins) along rows."""
    if joined:
        return isinstance(op, ops.Interleave) or (isinstance(op, ops.Concatenate) and op.dim == 0)
    return isinstance(op, ops.Deinterleave) or (isinstance(op, ops.Split) and op.dim == 0)


#: Where a key's fused rows are: the site's kind and identity, the leg, parts' rows and roles.
_Leg = tuple[tuple[object, ...], tuple[str, ...], tuple[int, ...], tuple["str | None", ...]]


def _leg_of(key: str, view: PlanView, filled_from: Mapping[str, str]) -> _Leg | None:
    """How a key is filled from or into fused rows, if it is."""
    step = view.steps[key]
    made = view.made.get(step.source)
    if made is not None and _is_rows(made.op, joined=False) and len(made.outputs) > 1:
        leg = tuple(filled_from.get(name, "") for name in made.outputs)
        if "" in leg:
            return None
        return (("split", tuple(_module(k) for k in leg)), leg,
                tuple(view.rows(name) for name in made.outputs),
                tuple(role_of(_module(k)) for k in leg))
    if made is not None and _is_rows(made.op, joined=True) and len(made.inputs) > 1:
        return (("join", _module(key)), (key,), tuple(view.rows(name) for name in made.inputs),
                tuple(role_of(_module(name)) for name in made.inputs))
    roles = _FUSED_PARTS.get(role_of(_module(key)) or "") or \
        _FUSED_PARTS.get(role_of(_module(step.source)) or "")
    if roles is None or not view.rows(step.source):
        return None
    return ("copy", _module(key)), (key,), (), roles


def _sites(keys: Sequence[str], view: PlanView, heads: Heads,
           filled_from: Mapping[str, str]) -> list[_Site]:
    """The fused tensors the unit's keys are filled from or into, weight and bias together.

    A fused tensor copied as it is gets a site for each way its rows may split into parts.
    """
    sites: dict[tuple[object, ...], _Site] = {}
    for key in keys:
        found = _leg_of(key, view, filled_from)
        if found is None:
            continue
        identity, leg, sizes, roles = found
        site = sites.setdefault(identity, _Site(str(identity[0]), [], sizes, roles))
        if leg not in site.legs:
            site.legs.append(leg)
    listed = []
    for site in sites.values():
        if site.kind != "copy":
            listed.append(site)
            continue
        rows = view.rows(view.steps[site.legs[0][0]].source)
        listed += [_Site("copy", site.legs, sizes, site.roles)
                   for sizes in _copy_sizes(rows, len(site.roles), heads)]
    return listed


def _copy_sizes(rows: int, parts: int, heads: Heads) -> list[tuple[int, ...]]:
    """The parts' rows a fused tensor copied as it is may hold: equal parts, else by heads."""
    found = [(rows // parts,) * parts] if rows % parts == 0 else []
    if parts == 3:
        for head in heads.sizes:
            for q in (c * head for c in heads.counts if c * head < rows):
                kv = (rows - q) // 2
                if kv > 0 and kv % head == 0 and q + 2 * kv == rows:
                    found += [(q, kv, kv)]
    return list(dict.fromkeys(found))


def _index_ref(first: int, rows: int) -> TensorRef:
    values = torch.arange(first, first + rows, dtype=torch.float64)
    return TensorRef(TensorMeta.of((rows,), torch.float64), lambda: values)


def _fake(view: PlanView, name: str, refs: dict[str, TensorRef],
          stored: bool = False) -> TensorRef:
    """A stand-in for a source tensor whose values number its rows, apart from every other's.

    A rule may make a tensor under its input's name (a transpose in place): its input is the
    stored tensor (``stored``).
    """
    key = f"{name}\0stored" if stored else name
    if key not in refs:
        made = None if stored else view.made.get(name)
        if made is None:
            first = sum(ref.meta.shape[0] for ref in refs.values())
            shape = view.refs[name].meta.shape
            refs[key] = _index_ref(first, shape[0] if shape else 1)
        else:
            inputs = [_fake(view, i, refs, stored=i in made.outputs) for i in made.inputs]
            refs.update(zip(made.outputs, ops.lazy(made.op, inputs), strict=True))
    return refs[key]


def _effect(edit: Relayout | None, site: _Site, view: PlanView) -> tuple[float, ...]:
    """Where a site's first leg reads each row from, with an edit (or as the plan has it)."""
    leg = site.legs[0]
    steps = {key: view.steps[key] for key in leg}
    fake = PlanView(dict(view.steps), dict(view.made), {})
    for key in leg:
        _fake(view, steps[key].source, fake.refs)
    if edit is not None:
        replace(edit, legs=(leg,)).apply(fake, steps)
    return tuple(float(v) for key in leg for v in fake.refs[steps[key].source].read().tolist())


def _relayouts(site: _Site, view: PlanView, heads: Heads) -> Dimension:
    """A site's layouts other than the plan's, each reading the rows another way."""
    n = len(site.sizes)
    fused_source = site.kind != "join"
    seen = {_effect(None, site, view)}
    found: Dimension = []
    orders = itertools.permutations(range(n)) if fused_source else (
        order for order in itertools.permutations(range(n))
        if all(site.sizes[order[k]] == site.sizes[k] for k in range(n)))
    for order in orders:
        for groups in _groups(site.sizes, heads) if fused_source else [1]:
            for target_groups in _groups(site.sizes, heads) if site.kind != "split" else [1]:
                for rotary in _rotaries(heads, site.roles):
                    edit = Relayout(site.kind, tuple(site.legs), site.sizes, site.roles, order,
                                    groups, target_groups, rotary)
                    try:
                        effect = _effect(edit, site, view)
                    except Exception:  # sizes the rows do not take
                        continue
                    if effect not in seen:
                        seen.add(effect)
                        found.append(Choice((edit,)))
    return found


def _rotations(keys: Sequence[str], view: PlanView, heads: Heads,
               fused: set[str]) -> Dimension:
    """A q and a k filled apart (roles from either model's names): their rotary rows."""
    by_role: dict[str, list[str]] = {}
    for key in keys:
        if key in fused or len(view.steps[key].ops) > 1:
            continue
        role = role_of(_module(key)) or role_of(_module(view.steps[key].source))
        if role in ("q", "k"):
            by_role.setdefault(role, []).append(key)
    if len(by_role) != 2:
        return []
    pair = tuple(by_role["q"] + by_role["k"])
    rows = {view.rows(view.steps[k].source) for k in pair}
    return [Choice((Rotate(pair, head, halves),)) for head in heads.sizes
            if head % 2 == 0 and all(r % head == 0 for r in rows) for halves in (True, False)]


def _signature(keys: Sequence[str], shapes: Mapping[str, tuple[int, ...]]
               ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((_leaf(k), shapes[k]) for k in keys))


def _module_exchange(first: str, second: str, by_module: Mapping[str, list[str]]) -> Choice:
    pairs = tuple((f"{first}.{_leaf(k)}", f"{second}.{_leaf(k)}") for k in by_module[first])
    return Choice((Exchange(pairs),))


def _exchanges(keys: Sequence[str], shapes: Mapping[str, tuple[int, ...]],
               guesses: Mapping[str, Guess], filled_from: Mapping[str, str],
               everywhere: Mapping[str, list[str]], buffers: Collection[str]) -> list[Dimension]:
    """Same-shape siblings exchanged: modules, a module's tensors, a guess's alternatives.

    A module's tensors are exchanged with tensors of their kind only: parameters with
    parameters, buffers (running statistics) with buffers. A guessed module's alternatives are
    one decision point: it is exchanged with one of them.
    """
    by_module: dict[str, list[str]] = {}
    for key in keys:
        by_module.setdefault(_module(key), []).append(key)
    found: list[Dimension] = []
    modules = list(by_module)
    for first, second in itertools.combinations(modules, 2):
        if _module(first) == _module(second) and \
                _signature(by_module[first], shapes) == _signature(by_module[second], shapes):
            found.append([_module_exchange(first, second, by_module)])
    for members in by_module.values():
        for a, b in itertools.combinations(members, 2):
            if shapes[a] == shapes[b] and (a in buffers) == (b in buffers):
                found.append([Choice((Exchange(((a, b),)),))])
    for module in modules:
        others = dict.fromkeys(_module(filled_from[alt]) for k in by_module[module]
                               for alt in guesses.get(k, Guess((), "")).alternatives
                               if alt in filled_from and _module(filled_from[alt]) != module)
        found.append([_module_exchange(module, other, everywhere) for other in others
                      if _signature(everywhere.get(other, []), shapes)
                      == _signature(by_module[module], shapes)])
    return found


#: At most this many same-shape modules elsewhere are exchanged with a diverging module.
_LOOKALIKES = 16


def _shared(a: str, b: str) -> int:
    """How many leading parts two module paths share."""
    return sum(1 for _ in itertools.takewhile(lambda p: p[0] == p[1],
                                              zip(a.split("."), b.split("."), strict=False)))


def lookalikes(module: str, shapes: Mapping[str, tuple[int, ...]],
               everywhere: Mapping[str, list[str]]) -> list[Dimension]:
    """A module exchanged with one of the same-shape modules elsewhere, nearest first.

    Structure can pair a module with another block's where names say nothing: tried last,
    after the module's own unit, at most :data:`_LOOKALIKES` of them.
    """
    own = everywhere.get(module, [])
    if not own:
        return []
    signature = _signature(own, shapes)
    others = [m for m, members in everywhere.items()
              if m != module and _signature(members, shapes) == signature]
    others.sort(key=lambda m: -_shared(m, module))
    return [[_module_exchange(module, other, everywhere) for other in others[:_LOOKALIKES]]]


def _transposes(keys: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> list[Dimension]:
    """Each square weight transposed."""
    return [[Choice((Transpose((key,)),))] for key in keys
            if len(shapes[key]) == 2 and shapes[key][0] == shapes[key][1] > 1
            and _leaf(key) == "weight"]


def dimensions(keys: Sequence[str], view: PlanView, shapes: Mapping[str, tuple[int, ...]],
               heads: Heads, guesses: Mapping[str, Guess],
               everywhere: Mapping[str, list[str]], buffers: Collection[str]) -> list[Dimension]:
    """A unit's decision points: fused layouts, rotary orders, exchanges, transposes.

    Args:
        keys: The unit's loaded keys.
        view: The plan's steps.
        shapes: Every target key's shape.
        heads: What the models say of their attention.
        guesses: The plan's guesses, whose alternatives are exchanges to try.
        everywhere: Every loaded module's keys (a guess's alternatives' tensors).
        buffers: The model's buffer keys.
    """
    found: list[Dimension] = []
    fused: set[str] = set()
    filled_from = {step.source: target for target, step in view.steps.items()}
    for site in _sites(keys, view, heads, filled_from):
        fused.update(k for leg in site.legs for k in leg)
        found.append(_relayouts(site, view, heads))
    found.append(_rotations(keys, view, heads, fused))
    found += _exchanges(keys, shapes, guesses, filled_from, everywhere, buffers)
    found += _transposes(keys, shapes)
    return [dimension for dimension in found if dimension]


def _ranked(edit: Edit) -> int:
    """Edits apply layouts first, then exchanges, then operations on the way."""
    return (Relayout, Exchange, Rotate, Transpose).index(type(edit))


def choices(found: Sequence[Dimension], budget: int) -> Iterator[Choice]:
    """Combinations of options of distinct decision points, fewest first, at most ``budget``.

    Options of one decision point exclude each other; two options touching the same keys are
    not combined unless their kinds compose (a layout, then an exchange or a transpose).
    """
    given = 0
    for size in range(1, len(found) + 1):
        for picked in itertools.combinations(range(len(found)), size):
            for options in itertools.product(*(found[k] for k in picked)):
                edits = tuple(sorted((e for o in options for e in o.edits), key=_ranked))
                if size > 1 and not _composes(edits):
                    continue
                yield Choice(edits)
                given += 1
                if given >= budget:
                    return


def _composes(edits: Sequence[Edit]) -> bool:
    """Whether no two edits of one kind touch the same key (a key is laid out once...)."""
    for kind in (Relayout, Exchange, Rotate, Transpose):
        touched = [k for e in edits if isinstance(e, kind) for k in e.keys]
        if len(touched) != len(set(touched)):
            return False
    return True

