"""A graft's plan as a rules file: what was found, written so that it is never searched again.

The file holds operation rules that make each tensor the model needs under the model's own
key (the plan's derivations: fused rows taken apart in the layout found, parts joined; then each
key's own layout operations: a transpose, rotary rows), and renaming rules for keys copied as
they are. Fed back (``rules=``, CLI ``--rules``), every key is filled by its name, as the user
said, so the same graft is ok by rule, with no search. It is the format ``--rules`` reads:
what a user writes by hand, or shares as a conversion between two code bases.

Renames apply in order, each to the key the previous ones left: where a key's new name is
another's old one (two keys exchanged), it is renamed through a mark (``@@``) that a last rule
takes off, so that no key is renamed twice.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..layouts import ops
from ..layouts.op_rules import Derivation
from ..plan.adapt import Step
from ..plan.steps import Plan, PlanStep

__all__ = ["MARK", "rules_of"]

#: What a renamed key carries while later renames run, where its new name is another's old one.
MARK = "@@"

#: An operation's name as rules name it.
_KIND_OF = {cls: kind for kind, cls in ops.KINDS.items()}


def _op_rule(op: ops.TensorOp, inputs: Iterable[str], outputs: Iterable[str]) -> dict[str, Any]:
    """One operation as a rule: its kind, its fields, its inputs' and outputs' exact names."""
    fields = {field.name: getattr(op, field.name)
              for field in dataclasses.fields(op)}  # type: ignore[arg-type]
    params = {name: list(value) if isinstance(value, tuple) else value
              for name, value in fields.items() if value is not None}
    listed = [re.escape(name) for name in inputs]
    made = [name.replace("\\", "\\\\") for name in outputs]
    return {"op": _KIND_OF[type(op)], "from": listed if len(listed) > 1 else listed[0],
            "to": made if len(made) > 1 else made[0], **params}


def _flat(op: ops.TensorOp) -> list[ops.TensorOp]:
    """An operation's steps: a chain's, in order, else itself."""
    return [o for inner in op.ops for o in _flat(inner)] if isinstance(op, ops.Chain) else [op]


def _reachable(steps: Iterable[PlanStep], made: Mapping[str, Derivation]) -> set[str]:
    found: set[str] = set()
    todo = [step.source for step in steps]
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            derivation = made.get(name)
            todo += list(derivation.inputs) if derivation is not None else []
    return found


def _derivation_rules(derivations: Iterable[Derivation],
                      shapes: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
    """Derivations, in the order they were made, one rule per operation.

    A chain's operations are rules in turn, through names of their own (``name#k``).
    """
    rules: list[dict[str, Any]] = []
    for derivation in derivations:
        given = [shapes.get(name, (1,)) for name in derivation.inputs]
        shapes.update(zip(derivation.outputs, derivation.op.shapes(given), strict=True))
        steps = _flat(derivation.op)
        names: list[str] = list(derivation.inputs)
        for k, op in enumerate(steps):
            made = op.shapes(given)
            outputs = list(derivation.outputs) if k == len(steps) - 1 else [
                f"{derivation.outputs[0]}#{k}.{j}" for j in range(len(made))]
            rules.append(_op_rule(op, names, outputs))
            names, given = outputs, made
    return rules


def _step_rules(step: PlanStep) -> list[dict[str, Any]]:
    """A key's own layout operations, from its source to the model's key."""
    layout = _layout(step)
    rules = []
    name = step.source
    for k, op in enumerate(layout):
        made = step.target if k == len(layout) - 1 else f"{step.target}#{k}"
        rules.append(_op_rule(op, [name], [made]))
        name = made
    return rules


def _named(derivations: Iterable[Derivation], steps: Iterable[PlanStep],
           stored: Iterable[str]) -> list[Derivation]:
    """The derivations with each output a step copies as it is named as the model's key.

    An output read by one step with no layout operation of its own takes the step's target
    name (so that it is filled by name, as the user said), unless that name is a stored key
    the derivation does not consume.
    """
    readers: dict[str, list[PlanStep]] = {}
    for step in steps:
        readers.setdefault(step.source, []).append(step)
    kept = set(stored)
    names: dict[str, str] = {}
    for derivation in derivations:
        for output in derivation.outputs:
            reading = readers.get(output, [])
            if len(reading) == 1 and not _layout(reading[0]) and \
                    (reading[0].target not in kept or reading[0].target in derivation.inputs):
                names[output] = reading[0].target
    return [dataclasses.replace(d, outputs=tuple(names.get(n, n) for n in d.outputs),
                                inputs=tuple(names.get(n, n) for n in d.inputs))
            for d in derivations]


def _layout(step: PlanStep) -> list[ops.TensorOp]:
    """A step's own layout operations (what made its source aside), in order."""
    return [o for op in step.ops if isinstance(op, Step) and not op.identity
            for o in _flat(op.op)]


def rules_of(plan: Plan) -> list[Any]:
    """A plan's steps as rules that fill every key by its name, in the order they apply.

    Args:
        plan: The plan a graft ran (as settled: what the search found is part of it).

    Returns:
        Operation rules (mappings), then renaming rules (``[pattern, replacement]`` pairs).
    """
    stored = dict(plan.layout.stored) if plan.layout is not None else {}
    derivations = plan.layout.derivations if plan.layout is not None else tuple(plan.inferred)
    made = {name: d for d in derivations for name in d.outputs}
    used = _reachable(plan.steps, made)
    named = _named([d for d in derivations if set(d.outputs) & used], plan.steps, stored)
    shapes = {key: tuple(info.shape) for key, info in stored.items()}
    rules: list[Any] = _derivation_rules(named, shapes)
    renamed: list[tuple[str, str]] = []
    produced = {name for d in named for name in d.outputs}
    for step in plan.steps:
        operated = _step_rules(step)
        rules += operated
        if not operated and step.source != step.target and step.target not in produced:
            renamed.append((step.source, step.target))
    olds = {old for old, _ in renamed}
    marked = any(new in olds for _, new in renamed)
    rules += [[f"^{re.escape(old)}$", (MARK if marked else "") + new.replace("\\", "\\\\")]
              for old, new in renamed]
    if marked:
        rules.append([f"^{MARK}", ""])
    return _generalised(rules)


_DIGITS = re.compile(r"\d+")


def _numbers(names: Iterable[str]) -> list[str]:
    return [run for name in names for run in _DIGITS.findall(name)]


def _template(names: Iterable[str], varying: int) -> tuple[str, ...]:
    """Names with the ``varying``-th run of digits (counted over all of them) as ``{n}``."""
    count = -1

    def mark(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return "{n}" if count == varying else match.group(0)

    return tuple(_DIGITS.sub(mark, name) for name in names)


def _generalised(rules: list[Any]) -> list[Any]:
    """Rules alike but for one number (a block's) as one rule over those numbers.

    Each rule's names (its keys as it reads and makes them) are templated with one run of
    digits as a group; rules of one template, whose made names carry the same number, become
    one rule whose pattern takes exactly the numbers seen, in the place of the first.
    """
    by_template: dict[tuple[Any, ...], list[tuple[int, str]]] = {}
    for index, rule in enumerate(rules):
        found = _varying(rule)
        if found is not None:
            template, number = found
            by_template.setdefault(template, []).append((index, number))
    merged: dict[int, Any] = {}
    dropped: set[int] = set()
    for template, members in by_template.items():
        if len(members) < 2:
            continue
        first = members[0][0]
        numbers = sorted({n for _, n in members}, key=int)
        merged[first] = _over(rules[first], template, numbers)
        dropped.update(index for index, _ in members[1:])
    return [merged.get(k, rule) for k, rule in enumerate(rules) if k not in dropped]


def _names(rule: Any) -> tuple[list[str], list[str]]:
    """A rule's names: what it reads (unescaped) and what it makes."""
    if isinstance(rule, dict):
        sources = rule["from"] if isinstance(rule["from"], list) else [rule["from"]]
        targets = rule["to"] if isinstance(rule["to"], list) else [rule["to"]]
        return [_unescaped(s) for s in sources], list(targets)
    return [_unescaped(rule[0][1:-1])], [rule[1]]


def _unescaped(pattern: str) -> str:
    return re.sub(r"\\(.)", r"\1", pattern)


def _varying(rule: Any) -> tuple[tuple[Any, ...], str] | None:
    """The rule's template over its first run of digits, where its made names say the same.

    Returns:
        The template (with the operation's fields), and the number; ``None`` where no run of
        digits is the same in what it reads and what it makes.
    """
    sources, targets = _names(rule)
    numbers = _numbers(sources)
    if not numbers or any("\\" in t for t in targets):
        return None
    value = numbers[0]
    reads = _template(sources, 0)
    made = [_template([t], k)[0] for t in targets
            for k, run in enumerate(_DIGITS.findall(t)) if run == value][:len(targets)]
    if len(made) != len(targets):
        return None
    fields = tuple(sorted((k, repr(v)) for k, v in rule.items() if k not in ("from", "to"))) \
        if isinstance(rule, dict) else ("rename",)
    return (reads, tuple(made), fields), value


def _over(rule: Any, template: tuple[Any, ...], numbers: list[str]) -> Any:
    """One rule for every number: its group takes exactly those numbers."""
    reads, made, _fields = template
    group = "(" + "|".join(numbers) + ")"
    patterns = [re.escape(name).replace(re.escape("{n}"), group) for name in reads]
    targets = [name.replace("{n}", "\\1") for name in made]
    if isinstance(rule, dict):
        return {**rule, "from": patterns if len(patterns) > 1 else patterns[0],
                "to": targets if len(targets) > 1 else targets[0]}
    return [f"^{patterns[0]}$", targets[0]]
