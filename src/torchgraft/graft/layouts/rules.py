"""User rules: renames (``(regex, replacement)`` pairs; ``None`` drops the key) and operations.

A rule given as a mapping with an ``op`` names an operation (concatenate, split, rotary
rows...): see :mod:`~torchgraft.graft.layouts.op_rules`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...bounds import parse_json, parse_yaml
from ...errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TorchgraftError,
    UnsupportedCheckpointError,
    shown,
)
from ...io.contain import read_contained
from ...renames import Rule
from .op_rules import OpRule, op_rule

__all__ = ["MAX_RULES_BYTES", "Rules", "RulesSpec", "parse_rules", "read_rules"]

#: A rules file larger than this is not one (a thousand rules are some 100 KB).
MAX_RULES_BYTES = 4 << 20


RulesSpec = (Sequence[tuple[str, str | None] | Sequence[Any] | Mapping[str, Any] | Rule | OpRule]
             | Mapping[str, str | None] | str | os.PathLike[str] | None)


@dataclass(frozen=True)
class Rules:
    """The user's rules, by kind.

    Attributes:
        renames: Renaming rules, in order.
        ops: Operation rules, in order (they run before the renames).
    """

    renames: tuple[Rule, ...] = ()
    ops: tuple[OpRule, ...] = ()


def _one(item: Any, number: int, path: Path | None) -> Rule | OpRule:
    """One rule from its declarative form, its matching timed (a budget of its own).

    A rule read from a file (``path``) names the file in its messages.
    """
    if isinstance(item, Rule):
        return item.timed()
    if isinstance(item, OpRule):
        return dataclasses.replace(item)
    if isinstance(item, Mapping):
        return op_rule(item, number, path=None if path is None else str(path))
    if (not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str)
            or not (item[1] is None or isinstance(item[1], str))):
        raise TorchgraftError(f"rule {number} {shown(item, 80)} is not a [pattern, "
                              "replacement] pair (replacement: a string, or null to drop the "
                              "key) nor an operation ({\"op\": ..., \"from\": ..., \"to\": ...})")
    return Rule(item[0], item[1]).timed(what=f"rule {number}'s pattern", path=path)


def _pairs(data: Any, path: Path | None = None) -> Iterable[Rule | OpRule]:
    if isinstance(data, Mapping):
        data = data.get("rules", data) if "rules" in data else list(data.items())
    if not isinstance(data, (list, tuple)):
        raise TorchgraftError("rules must be a list of [pattern, replacement] pairs "
                              "and operations, or a mapping of pattern to replacement")
    for number, item in enumerate(data, start=1):
        yield _one(item, number, path)


def _read_file(path: Path) -> Any:
    """A rules file's data, its nesting and (YAML) its aliases bounded before it is built.

    The file is read as a regular file of at most :data:`MAX_RULES_BYTES` (a FIFO is refused
    before it is opened), links followed (the user named it), and parsed as UTF-8 JSON or YAML.
    """
    what = "the rules file"
    try:
        data = read_contained(path.parent, path.name, named_by=path, what=what,
                              limit=MAX_RULES_BYTES, follow_links=True)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TorchgraftError(f"the rules file is not UTF-8 text ({exc.reason} at byte "
                                  f"{exc.start}): save it as UTF-8", path=path) from None
        if path.suffix.lower() in (".yaml", ".yml"):
            return parse_yaml(text, what=what, path=path)
        return parse_json(text, what=what, path=path)
    except CheckpointNotFoundError:
        raise TorchgraftError("rules file not found", path=path) from None
    except (CorruptCheckpointError, UnsupportedCheckpointError) as exc:  # not a checkpoint's
        raise TorchgraftError(exc.message, path=path) from None


def read_rules(spec: RulesSpec) -> Rules:
    r"""Read rules given as pairs, operations, a mapping, or a JSON/YAML file of those.

    Args:
        spec: ``[(r"^backbone\.", ""), (r"^head\.", None)]``, ``{r"^backbone\.": ""}``, a list
            that also holds operations (``{"op": "concatenate", "from": [...], "to": ...}``,
            :mod:`~torchgraft.graft.layouts.op_rules`), a path to a ``.json``/``.yaml`` file
            holding one of those (or ``{"rules": [...]}``), or ``None``.

    Returns:
        The rules, by kind, each in the order it applies.

    Raises:
        TorchgraftError: If a rule or the file is malformed (naming the rule).
    """
    if spec is None:
        return Rules()
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        try:
            rules = list(_pairs(_read_file(path), path))
        except TorchgraftError as exc:  # a rule's message names the rule: and the file
            raise exc.located(path) from None
    else:
        rules = list(_pairs(spec))
    return Rules(tuple(r for r in rules if isinstance(r, Rule)),
                 tuple(r for r in rules if isinstance(r, OpRule)))


def parse_rules(spec: RulesSpec) -> list[Rule]:
    r"""Read renaming rules given as pairs, a mapping, or a JSON/YAML file of either.

    Args:
        spec: As :func:`read_rules` takes it, without operations.

    Returns:
        The rules, in the order they apply.

    Raises:
        TorchgraftError: If a rule or the file is malformed, or a rule names an operation.
    """
    rules = read_rules(spec)
    if rules.ops:
        raise TorchgraftError(f"{rules.ops[0]}: only renaming rules apply here; operations "
                              "apply in tg.graft and tg.save(layout_of=...)")
    return list(rules.renames)
