"""Parts of the model that look new on purpose: what ``new=`` (CLI ``--new``) would declare.

Fine-tuning adds a head the checkpoint never had (BERT's ``classifier``), or one whose rows
differ (21 classes on a 1000-class checkpoint). The graft then reports it missing or
re-initialised; declaring it new (``new="classifier"``) says it is so on purpose. The report
proposes the exact names to declare, for what looks like such a part:

- a **whole module** of the model (every key under it, bookkeeping buffers aside, is missing
  or re-initialised; the highest such module, so ``head`` rather than ``head.fc`` and
  ``head.norm``), and
- **named like a head** (a part of its name is ``classifier``, ``head``, ``fc``, ``lm_head``,
  ``score``, ``logits``, ``cls``, or ends so: ``cls_score``, ``mask_head``), or the **last**
  such module of the model, with nothing the checkpoint filled after it (not the last of a
  run of numbered blocks the checkpoint lacks: ``experts.1999`` after ``experts.1998``).

It is a proposal, said as one ("if ... is new on purpose"): a key missing because the
checkpoint names it otherwise is settled with rules instead.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

from ..plan.steps import is_bookkeeping

__all__ = ["HEAD_NAME", "new_parts", "python_new", "cli_new"]

#: A part of a module's name that says it is a head.
HEAD_NAME = re.compile(r"(?:^|_)(?:classifier|head|heads|fc|score|scores|logits|cls)$")
#: The most modules proposed at once.
_MOST = 3


def _ancestors(key: str) -> list[str]:
    """The modules above a key, nearest first: ``a.b.w`` -> ``a.b``, ``a``."""
    parts = key.split(".")[:-1]
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def new_parts(targets: Sequence[str], troubled: Collection[str]) -> list[str]:
    """The modules that look new on purpose, in the model's order (at most three).

    Linear in the number of keys times their depth: each module's keys are counted once.

    Args:
        targets: Every key of the model, in its order.
        troubled: Keys missing (bookkeeping aside) or re-initialised.

    Returns:
        Module names to declare new, such as ``["classifier"]``; empty when none looks new.
    """
    if not troubled:
        return []
    troubled = set(troubled)
    keys: dict[str, int] = {}  # module -> how many keys it holds (bookkeeping aside)
    bad: dict[str, int] = {}  # module -> how many of them are troubled
    first: dict[str, int] = {}  # module -> where its first key stands in the model
    last_good = -1  # where the model's last key that is not troubled stands
    for i, key in enumerate(targets):
        if is_bookkeeping(key):
            continue
        if key not in troubled:
            last_good = i
        for module in _ancestors(key):
            keys[module] = keys.get(module, 0) + 1
            bad[module] = bad.get(module, 0) + (key in troubled)
            first.setdefault(module, i)
    whole: set[str] = set()
    for key in troubled:
        highest = None
        for module in _ancestors(key):
            if module not in keys or bad[module] != keys[module]:
                break
            highest = module
        if highest is not None:
            whole.add(highest)
    found = sorted(whole, key=lambda m: first[m])
    last = found[-1] if found and first[found[-1]] > last_good else None
    if last is not None and len(found) > 1 and _numbered_run(found[-2], last):
        last = None  # the last of many numbered blocks the checkpoint lacks: no head
    return [m for m in found if m == last
            or any(HEAD_NAME.search(part) for part in m.split("."))][:_MOST]


def _numbered_run(before: str, last: str) -> bool:
    """Whether two modules are numbered siblings (``experts.8``, ``experts.9``)."""
    parent, _, number = last.rpartition(".")
    other_parent, _, other = before.rpartition(".")
    return number.isdigit() and other.isdigit() and parent == other_parent


def python_new(modules: Iterable[str]) -> str:
    """``new='classifier'``, or ``new=['a', 'b']``: the argument that declares them."""
    names = list(modules)
    if len(names) == 1:
        return f"new='{names[0]}'"
    return "new=[" + ", ".join(f"'{m}'" for m in names) + "]"


def cli_new(modules: Iterable[str]) -> str:
    """``--new classifier``, once per module: the flags that declare them."""
    return " ".join(f"--new {m}" for m in modules)
