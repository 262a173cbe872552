r"""Rules that name an operation: concatenate, split, reorder rotary rows, transpose...

A renaming rule (:class:`~torchgraft.renames.Rule`) only gives a key another name. An
:class:`OpRule` makes new source tensors from stored ones with one of the reversible
operations of :mod:`~torchgraft.graft.layouts.ops`
(:data:`~torchgraft.graft.layouts.ops.KINDS`), e.g. a gpt-fast ``wqkv`` from separate q, k, v::

    {"op": "concatenate", "dim": 0,
     "from": ["(.*)\\.q_proj\\.weight", "(.*)\\.k_proj\\.weight", "(.*)\\.v_proj\\.weight"],
     "to": "\\1.wqkv.weight"}

``from`` holds one pattern per input (matched against whole keys, ``re.fullmatch``); inputs
of one application share the same groups. ``to`` holds one template per output (the first
pattern's groups; by default the input's own name, for operations of one tensor). The other
fields are the operation's own (``dim``, ``sizes``, ``count``, ``head_dim``...); rotary rows
also take ``n_heads`` instead of ``head_dim``. Operation rules run in order, before the
renaming rules, on the checkpoint's keys and what earlier operation rules made; the tensors
they make replace their inputs and are known by ``name`` (the user said so).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import TorchgraftError, shown
from ...meta import TensorRef
from ...patterns import TimedPattern
from ..tensors import Side, TensorInfo
from . import ops

__all__ = ["Derivation", "OpRule", "apply_op_rules", "op_rule"]

#: Kinds a rule may name (a chain is several rules in order).
_KINDS = {kind: cls for kind, cls in ops.KINDS.items() if kind != "chain"}
#: Kinds that take several inputs and give one output.
_MANY_TO_ONE = frozenset({"concatenate", "interleave", "stack", "weight_norm"})
#: Kinds that take one input and give several outputs.
_ONE_TO_MANY = frozenset({"split", "deinterleave", "unstack", "weight_norm_split"})
#: Fields of a rule that are not the operation's.
_RULE_FIELDS = ("op", "from", "to")


@dataclass(frozen=True)
class Derivation:
    """Tensors made from others by one operation (a rule's, or a fused projection's).

    Attributes:
        outputs: The made keys, one per output of ``op``.
        op: The operation.
        inputs: The keys it was applied to, in order.
        origin: What asked for it, for reports (``rule 3``).
    """

    outputs: tuple[str, ...]
    op: ops.TensorOp
    inputs: tuple[str, ...]
    origin: str = ""


@dataclass(frozen=True)
class OpRule:
    """A rule that makes source tensors with an operation (see the module's text).

    Attributes:
        kind: The operation's name in :data:`~torchgraft.graft.layouts.ops.KINDS`.
        sources: One whole-key pattern per input.
        targets: One template per output.
        params: The operation's fields (``n_heads`` for rotary rows besides).
        number: The rule's place among the rules (from 1), for messages.
        path: The rules file it was read from, named in messages.
        regexes: The compiled patterns.
        matchers: The patterns as keys are matched with them, within a time budget of this
            rule's (:class:`~torchgraft.patterns.TimedPattern`; a copy has a budget of its own).
    """

    kind: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()
    number: int = 0
    path: str | None = field(default=None, compare=False)
    regexes: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    matchers: tuple[TimedPattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "regexes", tuple(re.compile(s) for s in self.sources))
        except (re.error, RecursionError, OverflowError) as exc:
            raise self.error(f"a 'from' pattern is not a regex: {exc}") from None
        object.__setattr__(self, "matchers", tuple(
            TimedPattern(r, what=f"rule {self.number}'s 'from' pattern", path=self.path)
            for r in self.regexes))

    def __str__(self) -> str:
        return (f"rule {self.number} ({self.kind} {shown(list(self.sources), 200)} -> "
                f"{shown(list(self.targets), 200)})")

    def error(self, why: str) -> TorchgraftError:
        """An error naming this rule, and the rules file it is in."""
        return TorchgraftError(f"{self}: {why}", path=self.path)

    def op(self, shapes: Sequence[tuple[int, ...]]) -> ops.TensorOp:
        """The operation for inputs of these shapes (``n_heads`` gives the head size).

        Without shapes (the rule's fields checked as it is read), a head size of 2 stands in.
        """
        params = dict(self.params)
        heads = params.pop("n_heads", None)
        if heads is not None:
            rows = shapes[0][0] if shapes and shapes[0] else 0
            if heads < 1 or rows % heads:
                raise self.error(f"{rows} rows are not {heads} heads")
            params["head_dim"] = rows // heads if shapes else 2
        return _KINDS[self.kind](**params)  # type: ignore[no-any-return]


def _as_list(value: Any, what: str, origin: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or \
            not all(isinstance(v, str) for v in items):
        raise TorchgraftError(f"{origin}: '{what}' must be a key pattern or a list of them")
    return tuple(items)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_ints(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(map(_is_int, value))


#: How each field type of an operation is checked, by its annotation.
_FIELD_CHECKS: dict[str, tuple[str, Any]] = {
    "int": ("a whole number", _is_int),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "float": ("a number", lambda v: _is_int(v) or isinstance(v, float)),
    "tuple[int, ...]": ("a list of whole numbers", _is_ints),
    "Shape": ("a list of whole numbers", _is_ints),
}


def _field_value(name: str, value: Any, kind: str, origin: str) -> Any:
    """A field checked, as the operation's dataclass holds it (lists become tuples)."""
    annotation = next((str(f.type) for f in dataclasses.fields(_KINDS[kind]) if f.name == name),
                      "int")
    what, check = _FIELD_CHECKS[annotation]
    if not check(value):
        raise TorchgraftError(f"{origin}: {kind}'s {name} must be {what}, not {shown(value, 40)}")
    return tuple(value) if isinstance(value, list) else value


def _params(item: Mapping[str, Any], kind: str, origin: str) -> tuple[tuple[str, Any], ...]:
    names = [f.name for f in dataclasses.fields(_KINDS[kind])]
    allowed = names + (["n_heads"] if kind == "rotary" else [])
    extra = [k for k in item if k not in _RULE_FIELDS and k not in allowed]
    if extra:
        raise TorchgraftError(f"{origin}: {kind} takes no field {extra[0]!r}; its fields are "
                              f"{', '.join(allowed) or 'none'} (besides op, from, to)")
    params = tuple((k, _field_value(k, item[k], kind, origin)) for k in allowed if k in item)
    keys = {k for k, _ in params}
    if kind == "rotary" and len(keys & {"head_dim", "n_heads"}) != 1:
        raise TorchgraftError(f"{origin}: rotary takes one of head_dim and n_heads")
    return params


def _counts(kind: str, sources: tuple[str, ...], targets: tuple[str, ...], origin: str) -> None:
    """Check how many inputs and outputs the kind takes."""
    if len(sources) > 1 and kind not in _MANY_TO_ONE:
        raise TorchgraftError(f"{origin}: {kind} reads one tensor: give one 'from' pattern")
    if kind in _ONE_TO_MANY and len(targets) < 2:
        raise TorchgraftError(f"{origin}: {kind} makes several tensors: give one 'to' template "
                              "per part")
    if kind not in _ONE_TO_MANY and len(targets) > 1:
        raise TorchgraftError(f"{origin}: {kind} makes one tensor: give one 'to' template")


def op_rule(item: Mapping[str, Any], number: int, *, path: str | None = None) -> OpRule:
    """An operation rule from its declarative form (a rules file's mapping).

    Args:
        item: ``{"op": kind, "from": pattern(s), "to": template(s), ...fields}``.
        number: Its place among the rules, from 1.
        path: The rules file it is read from, named in messages.

    Returns:
        The rule.

    Raises:
        TorchgraftError: If the kind is unknown, a field is not the operation's, or the
            patterns and templates do not fit the kind; the message names the rule.
    """
    origin = f"rule {number}"
    kind = item.get("op")
    if kind not in _KINDS:
        raise TorchgraftError(f"{origin}: unknown operation {kind!r}; use one of "
                              f"{', '.join(_KINDS)} (several rules in order chain them)")
    if "from" not in item:
        raise TorchgraftError(f"{origin}: {kind} needs 'from' (the key pattern(s) it reads)")
    sources = _as_list(item["from"], "from", origin)
    targets = _as_list(item.get("to", r"\g<0>"), "to", origin)
    _counts(kind, sources, targets, origin)
    try:
        rule = OpRule(kind, sources, targets, _params(item, kind, origin), number, path)
        rule.op([])  # the fields fit the operation (no shapes needed but for n_heads)
    except TypeError as exc:
        raise TorchgraftError(f"{origin}: the fields do not fit {kind}: {exc}") from None
    except TorchgraftError as exc:
        raise TorchgraftError(f"{origin}: {exc.message}") from None
    return rule


def _by_groups(rule: OpRule, k: int, names: Sequence[str]) -> dict[tuple[Any, ...], str]:
    """The keys pattern ``k`` matches, by their groups (which must tell them apart)."""
    found: dict[tuple[Any, ...], str] = {}
    for name in names:
        match = rule.matchers[k].fullmatch(name)
        if match is None:
            continue
        if match.groups() in found:
            raise rule.error(f"'{rule.sources[k]}' matches '{found[match.groups()]}' and "
                             f"'{name}' with the same groups: capture what tells them apart "
                             "(the parts of one tensor are found by equal groups)")
        found[match.groups()] = name
    return found


def _matches(rule: OpRule, names: Sequence[str]) -> list[tuple[re.Match[str], tuple[str, ...]]]:
    """Each application: the first pattern's match and one key per pattern, same groups."""
    firsts = [(m, name) for name in names if (m := rule.matchers[0].fullmatch(name))]
    if not firsts:
        raise rule.error(f"'{rule.sources[0]}' matches no checkpoint key (patterns match whole "
                         "keys); fix the pattern or remove the rule")
    if len(rule.sources) == 1:
        return [(match, (name,)) for match, name in firsts]
    others = [_by_groups(rule, k, names) for k in range(len(rule.sources))]
    out = []
    for match, name in firsts:
        keys = [name]
        for k, by_groups in enumerate(others[1:], start=1):
            if match.groups() not in by_groups:
                raise rule.error(f"'{name}' matches '{rule.sources[0]}' but no key matches "
                                 f"'{rule.sources[k]}' with the same groups "
                                 f"{list(match.groups())}")
            keys.append(by_groups[match.groups()])
        out.append((match, tuple(keys)))
    return out


@dataclass
class _Working:
    """The source's keys as the rules so far left them."""

    tensors: dict[str, TensorInfo]
    refs: dict[str, TensorRef]
    derivations: list[Derivation] = field(default_factory=list)


def _derive(rule: OpRule, match: re.Match[str], inputs: tuple[str, ...],
            work: _Working) -> tuple[Derivation, list[TensorInfo]]:
    """One application of a rule: how its outputs are made, and their infos."""
    infos = [work.tensors[name] for name in inputs]
    try:
        op = rule.op([info.shape for info in infos])
        made = ops.lazy(op, [work.refs[name] for name in inputs])
        outputs = tuple(match.expand(t) for t in rule.targets)
    except (re.error, IndexError) as exc:
        raise rule.error(f"a 'to' template does not fit the pattern: {exc}") from None
    except TorchgraftError as exc:
        raise rule.error(str(exc)) from None
    if len(made) != len(outputs):
        raise rule.error(f"{op.describe()} makes {len(made)} tensors of '{inputs[0]}', and "
                         f"{len(outputs)} 'to' templates name them")
    work.refs.update(zip(outputs, made, strict=True))
    return Derivation(outputs, op, inputs, f"rule {rule.number}"), [
        TensorInfo(name, ref.meta.shape, ref.meta.dtype, infos[0].kind)
        for name, ref in zip(outputs, made, strict=True)]


def _apply(rule: OpRule, work: _Working) -> None:
    """Every application of a rule; what it makes takes the place of its first input."""
    applied = [_derive(rule, match, inputs, work)
               for match, inputs in _matches(rule, list(work.tensors))]
    consumed = {name for derivation, _infos in applied for name in derivation.inputs}
    at_first = {derivation.inputs[0]: infos for derivation, infos in applied}
    tensors: dict[str, TensorInfo] = {}
    for name, info in work.tensors.items():
        for new in at_first.get(name, ()):
            if new.name in tensors or (new.name in work.tensors and new.name not in consumed):
                raise rule.error(f"it would make '{new.name}' twice; give each output a name "
                                 "of its own")
            tensors[new.name] = new
        if name not in consumed:
            tensors[name] = info
    work.tensors = tensors
    work.derivations += [derivation for derivation, _infos in applied]


def apply_op_rules(rules: Sequence[OpRule], side: Side,
                   refs: dict[str, TensorRef]) -> tuple[Side, list[Derivation]]:
    """Make the tensors operation rules ask for, in place of their inputs.

    Args:
        rules: The operation rules, in order.
        side: The source side.
        refs: The source's lazy tensors; made ones are added (or replace their input, when an
            operation keeps the input's name).

    Returns:
        The source side with the made tensors in place of their inputs, and how each was
        made, in the order they were.

    Raises:
        TorchgraftError: Naming the rule, if it matches nothing or its operation does not fit
            the tensors it matches.
    """
    if not rules:
        return side, []
    work = _Working(dict(side.tensors), refs)
    for rule in rules:
        _apply(rule, work)
    order = [name for name in side.order if name in work.tensors]
    order += [name for name in work.tensors if name not in side.tensors]
    return side.with_tensors(work.tensors, order), work.derivations
