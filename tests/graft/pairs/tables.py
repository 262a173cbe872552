"""What torchgraft's name tables recognise of a code base's keys.

The held-out suite measures graft on code bases no table was written for; this says, for a
set of keys, every table entry that names any of them: the naming families (``family_of``),
the fused projections (``FUSIONS``), the gated MLPs (``GLU_ORDERS``), the experts' names and
stacked parameters, the bare parameters, the name-keyed layouts that apply between two sides,
and the roles the conventions give a module. A held-out side's entries are frozen in
:data:`~tests.graft.pairs.heldout_expectations.KNOWN_TO_TABLES`: a new table row that names
one of its keys fails the suite, so no table can make a held-out case pass.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torchgraft.graft.layouts import bare, catalogue, conventions, experts, fusion, glu
from torchgraft.graft.layouts.frameworks import FRAMEWORK_LAYOUTS
from torchgraft.graft.layouts.layout import Layout
from torchgraft.graft.tensors import Side, TensorInfo


def side_of(shapes: dict[str, tuple[int, ...]]) -> Side:
    """A side of these keys and shapes, as a file gives them (no module kinds)."""
    return Side({name: TensorInfo(name, shape, torch.float32) for name, shape in shapes.items()})


def _module_names() -> dict[str, frozenset[str]]:
    """Every module (or parameter) name a table lists, by the table."""
    return {
        "FUSIONS": frozenset().union(*(f.fused | frozenset().union(*f.parts)
                                       for f in fusion.FUSIONS)),
        "GLU_ORDERS": frozenset().union(*(order.names for order in glu.GLU_ORDERS)),
        "experts.ROLES": frozenset(n for names in experts.ROLES.values() for n in names),
        "experts.STACKED": frozenset(experts.STACKED),
        "BARE_PARAMETERS": frozenset(p.name for p in bare.BARE_PARAMETERS),
    }


def recognised(shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """Every table entry that names one of these keys.

    A module name in a list of names counts only inside the part of a model that list is
    about: the experts' names under an ``experts`` module, stacked parameters directly in one.

    Args:
        shapes: Key to shape, of one side (a module's state dict, or a saved file's).

    Returns:
        Entries such as ``family transformers-llama``, ``FUSIONS qkv``, ``role o: attn.proj``.
    """
    found = set()
    family = catalogue.family_of(side_of(shapes))
    if family is not None:
        found.add(f"family {family}")
    tables = _module_names()
    modules = {bare.module_and_leaf(key)[0] for key in shapes}
    children: dict[str, set[str]] = {}
    for module in modules:
        parent, _, name = module.rpartition(".")
        children.setdefault(parent, set()).add(name)
    for key in shapes:
        module = bare.module_and_leaf(key)[0]
        parts = module.split(".")
        for table, names in tables.items():
            name = key.rpartition(".")[2] if table == "BARE_PARAMETERS" else parts[-1]
            if name in names and _in_scope(table, parts):
                found.add(f"{table} {name}")
        parent, _, name = module.rpartition(".")
        contexts, role = conventions.role_parts(module, frozenset(children[parent] - {name}))
        where = _named(parts)
        if role is not None:
            found.add(f"role {role}: {where}")
        found.update(f"context {context}: {where}" for context in contexts
                     if context in _NAMED_CONTEXTS)
    return found


#: Contexts a name gives a module by its role; the others (encoder, decoder, vision, text)
#: say only which tower a module is in.
_NAMED_CONTEXTS = ("cross", "shortcut")


def _named(parts: list[str]) -> str:
    """A module by its own name, with its parent's where its own is a number."""
    return ".".join(parts[-2:]) if parts[-1].isdigit() else parts[-1]


def _in_scope(table: str, parts: list[str]) -> bool:
    """Whether a module (its path's parts) is where a table's names mean something: the
    experts' projection names inside an expert, stacked names directly in ``experts``."""
    if table == "experts.ROLES":
        return len(parts) > 2 and parts[-3] == "experts"
    if table == "experts.STACKED":
        return len(parts) > 1 and parts[-2] == "experts"
    return True


def layouts_between(source: dict[str, tuple[int, ...]],
                    target: dict[str, tuple[int, ...]]) -> set[str]:
    """The layouts (catalogue, experts' and other frameworks') that apply from one side to
    another, by name."""
    src, dst = side_of(source), side_of(target)
    layouts: Iterable[Layout] = (*catalogue.LAYOUTS, *FRAMEWORK_LAYOUTS,
                                 *experts.expert_layouts(src, dst))
    return {f"layout {layout.name}" for layout in layouts
            if layout not in GENERIC and layout.applies(src, dst)}


#: Layouts that shapes alone decide, naming no code base: no table row.
GENERIC = (catalogue.UNIT_DIMS,)
