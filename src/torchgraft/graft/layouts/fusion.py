"""Fused and split tensors: q, k, v <-> qkv and gate, up <-> gate_up, both ways.

When the model holds a fused projection (timm's ``attn.qkv``, nanoGPT's ``c_attn``, Phi-3's
``gate_up_proj``) and the checkpoint holds its parts (``query``, ``key``, ``value``), or the
other way round, the source gets virtual tensors: lazy concatenations of the parts, or lazy
equal slices of the fused tensor. Planning then treats them as any other source tensor (by
name or by structure), and the report says where they came from. Which names are parts of
which fused projection, in which order, is data (:data:`FUSIONS`; gated MLPs' orders come
from :data:`~torchgraft.graft.layouts.glu.GLU_ORDERS`). Where a name does not say the order, the
tensors it fills are guesses, and only a fused tensor whose halves fit the other side's
shapes is split (or parts fused).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...meta import TensorRef
from ..tensors import Side, TensorInfo
from .bare import module_and_leaf
from .catalogue import family_of
from .glu import GLU_ORDERS, PARTS_REORDERED
from .ops import Concatenate, Deinterleave, Interleave, Split, TensorOp, lazy
from .virtual import Virtual

__all__ = ["FUSIONS", "Fusion", "add_virtual", "head_dim_of"]


@dataclass(frozen=True)
class Fusion:
    """One fused projection and its parts, by module name.

    Attributes:
        fused: Module names of the fused projection.
        parts: For each part, in order of rows, its module names.
        per_head: Fused names stored head by head (``[heads, parts, head_dim]``: GPT-NeoX's
            and BLOOM's ``query_key_value``) rather than part by part (``[Q; K; V]``).
        attention: The parts are q, k and v: with fewer key/value heads (grouped-query
            attention), k and v have fewer rows than q, as the attention's head counts say.
        doubt: Why the order of the parts is a guess, when the fused names do not say it.
    """

    fused: frozenset[str]
    parts: tuple[frozenset[str], ...]
    per_head: frozenset[str] = frozenset()
    attention: bool = False
    doubt: str | None = None


FUSIONS = (
    Fusion(frozenset({"qkv", "c_attn", "qkv_proj", "Wqkv", "wqkv", "query_key_value",
                      "in_proj"}),
           (frozenset({"q", "query", "q_proj", "wq"}), frozenset({"k", "key", "k_proj", "wk"}),
            frozenset({"v", "value", "v_proj", "wv"})),
           per_head=frozenset({"query_key_value"}), attention=True),
    *(Fusion(order.names, order.parts, doubt=order.doubt) for order in GLU_ORDERS),
)


def _modules(side: Side) -> dict[str, dict[str, TensorInfo]]:
    """Module path to its tensors by leaf name (bare parameters as the modules they are)."""
    modules: dict[str, dict[str, TensorInfo]] = {}
    for name, info in side.tensors.items():
        module, leaf = module_and_leaf(name)
        modules.setdefault(module, {})[leaf] = info
    return modules


def _leaf_module(path: str) -> str:
    return path.rpartition(".")[2]


def _leaves(side: Side) -> set[str]:
    """The last part of every module path of a side (``q_proj``, ``qkv``, ``in_proj``...)."""
    return {_leaf_module(module_and_leaf(name)[0]) for name in side.tensors}


def head_dim_of(src: Side, dst: Side) -> tuple[int | None, str | None]:
    """The attention head size a per-head layout is read with, and a doubt if it is a guess.

    The source's own head size (a module source, a config) decides; the model's alone is a
    guess: a checkpoint of another head count has the same shapes.

    Args:
        src: The source side.
        dst: The target side.

    Returns:
        The head size (``None`` when neither side says one), and why it is a guess, if so.
    """
    sizes = set(src.head_dims.values())
    if len(sizes) == 1:
        return sizes.pop(), None
    sizes = set(dst.head_dims.values())
    if len(sizes) == 1 and not src.head_dims:
        return sizes.pop(), ("the checkpoint does not say its head count; the model's head "
                             "size was used to read its per-head fused layout")
    return None, None


def _qkv_rows(side: Side, attention: str) -> tuple[int, ...] | None:
    """The q, k and v rows an attention module's head counts and head size say."""
    counts, head_dim = side.head_counts.get(attention), side.head_dims.get(attention)
    if counts is None or head_dim is None:
        return None
    return counts[0] * head_dim, counts[1] * head_dim, counts[1] * head_dim


def _model_rows(dst: Side, fusion: Fusion) -> set[tuple[int, ...]]:
    """The rows of each part the model's attentions want, where their head counts say them."""
    if not fusion.attention:
        return set()
    return {rows for path in _modules(dst) if _leaf_module(path) in fusion.fused
            if (rows := _qkv_rows(dst, path.rpartition(".")[0])) is not None}


def _fuse(src: Side, refs: dict[str, TensorRef], fusion: Fusion, dst: Side,
          head: tuple[int | None, str | None] | None = None) -> list[Virtual]:
    found = []
    wanted = _model_rows(dst, fusion)
    modules = _modules(src)
    by_parent: dict[str, dict[int, str]] = {}
    for path in modules:
        parent, _, leaf = path.rpartition(".")
        for k, names in enumerate(fusion.parts):
            if leaf in names:
                by_parent.setdefault(parent, {})[k] = path
    for parent, paths in by_parent.items():
        if len(paths) != len(fusion.parts):
            continue
        ordered = [paths[k] for k in range(len(fusion.parts))]
        leaves = set(modules[ordered[0]])
        if any(set(modules[p]) != leaves for p in ordered):
            continue
        infos = {leaf: [modules[p][leaf] for p in ordered] for leaf in leaves}
        if any(len({(i.shape[1:], i.dtype) for i in group}) != 1 for group in infos.values()):
            continue
        rows = tuple(i.shape[0] for i in next(iter(infos.values())))
        if wanted and rows not in wanted:
            continue  # other head counts than the model's attention: not its fused layout
        label = ",".join(_leaf_module(p) for p in ordered)
        for leaf, group in infos.items():
            name = f"{parent}.{{{label}}}.{leaf}" if parent else f"{{{label}}}.{leaf}"
            found += _fused(name, group, refs, head, fusion.doubt)
    return found


def _fused(name: str, group: list[TensorInfo], refs: dict[str, TensorRef],
           head: tuple[int | None, str | None] | None,
           doubt: str | None = None) -> list[Virtual]:
    """One fused virtual tensor from its parts: part by part, or head by head."""
    parts = tuple(i.name for i in group)
    why = "fused from " + ", ".join(parts)
    if head is None:
        op: TensorOp = Concatenate(0)
        [refs[name]] = lazy(op, [refs[p] for p in parts])
        other = (f"{name} {PARTS_REORDERED}",) if doubt else ()
        return [Virtual(name, parts, why, doubt, op, alternatives=other)]
    head_dim, doubt = head
    sizes = _group_sizes(tuple(i.shape[0] for i in group), head_dim)
    if head_dim is None or sizes is None:
        return []  # a per-head layout with no head size, or parts not of whole groups
    op = Interleave(sizes)
    [refs[name]] = lazy(op, [refs[p] for p in parts])
    return [Virtual(name, parts, f"{why}, {_grouped(sizes, head_dim)}", doubt, op)]


def _group_sizes(rows: tuple[int, ...], head_dim: int | None) -> tuple[int, ...] | None:
    """The rows of each part in one group of a layout stored group by group.

    ``[kv groups, (q heads of the group, k, v), head_dim]``: GPT-NeoX's ``query_key_value``
    has one q head per group; with grouped-query attention a group holds several.
    """
    if head_dim is None:
        return None
    groups, left = divmod(rows[-1], head_dim)
    if left or groups < 1 or any(r % groups for r in rows):
        return None
    return tuple(r // groups for r in rows)


def _grouped(sizes: tuple[int, ...], head_dim: int) -> str:
    if len(set(sizes)) == 1:
        return f"head by head (head size {head_dim})"
    return f"key/value group by group ({'+'.join(map(str, sizes))} rows, head size {head_dim})"


def _split(src: Side, refs: dict[str, TensorRef], fusion: Fusion, dst: Side,
           head: tuple[int | None, str | None]) -> list[Virtual]:
    found = []
    count = len(fusion.parts)
    model_sizes = _model_rows(dst, fusion) | _part_rows(dst, fusion)  # once: 100k tensors
    for path, tensors in _modules(src).items():
        if _leaf_module(path) not in fusion.fused:
            continue
        if any(i.kind not in (None, "linear") or not i.shape for i in tensors.values()):
            continue
        rows = {i.shape[0] for i in tensors.values()}
        sizes, doubt = _block_sizes(src, model_sizes, fusion, path, rows.pop()) \
            if len(rows) == 1 else (None, None)
        if sizes is None:
            continue
        if _leaf_module(path) in fusion.per_head:
            found += _split_per_head(refs, tensors, sizes, head, doubt)
            continue
        op = Split(0, sizes=sizes)
        starts = [sum(sizes[:k]) for k in range(count + 1)]
        for leaf, info in tensors.items():
            names = [f"{path}[{k}].{leaf}" for k in range(count)]  # sorted names keep the order
            for k, ref in enumerate(lazy(op, [refs[info.name]])):
                refs[names[k]] = ref
                others = tuple(n for n in names if n != names[k]) if fusion.doubt else ()
                found.append(Virtual(names[k], (info.name,), f"split from {info.name} (rows "
                                     f"{starts[k]}:{starts[k + 1]})", doubt or fusion.doubt,
                                     op, k, others))
    return found


def _block_sizes(src: Side, model_sizes: set[tuple[int, ...]], fusion: Fusion, path: str,
                 rows: int) -> tuple[tuple[int, ...] | None, str | None]:
    """The rows of each part of a fused tensor stored part by part, and a doubt if a guess.

    The source's attention head counts decide (a module source); else the model's parts'
    rows (``model_sizes``), when one set of them adds up (a grouped-query split read by the
    model's sizes is a guess: the file does not say its head counts); else equal parts.
    """
    count = len(fusion.parts)
    stated = _qkv_rows(src, path.rpartition(".")[0]) if fusion.attention else None
    if stated is not None:
        return (stated, None) if sum(stated) == rows else (None, None)
    wanted = {sizes for sizes in model_sizes if sum(sizes) == rows}
    if len(wanted) == 1:
        sizes = wanted.pop()
        return sizes, None if len(set(sizes)) == 1 else (
            "the checkpoint does not say its head counts; its fused q, k, v were split by the "
            f"model's sizes {list(sizes)}")
    if wanted or rows % count:
        return None, None
    return (rows // count,) * count, None


def _part_rows(dst: Side, fusion: Fusion) -> set[tuple[int, ...]]:
    """The rows of the model's unfused parts (its q, k, v weights), one tuple per module."""
    by_parent: dict[str, dict[int, int]] = {}
    for path, tensors in _modules(dst).items():
        parent, _, leaf = path.rpartition(".")
        for k, names in enumerate(fusion.parts):
            if leaf in names and "weight" in tensors and tensors["weight"].shape:
                by_parent.setdefault(parent, {})[k] = tensors["weight"].shape[0]
    return {tuple(rows[k] for k in range(len(fusion.parts))) for rows in by_parent.values()
            if len(rows) == len(fusion.parts)}


def _split_per_head(refs: dict[str, TensorRef], tensors: dict[str, TensorInfo],
                    rows: tuple[int, ...], head: tuple[int | None, str | None],
                    doubt: str | None) -> list[Virtual]:
    """The parts of a fused tensor stored head by head (or key/value group by group).

    ``rows``: the rows of each part in all; none when the head size is unknown.
    """
    head_dim, head_doubt = head
    sizes = _group_sizes(rows, head_dim)
    if head_dim is None or sizes is None:
        return []
    found = []
    op = Deinterleave(sizes)
    for leaf, info in tensors.items():
        for k, ref in enumerate(lazy(op, [refs[info.name]])):
            name = f"{info.module}[{k}].{leaf}"
            refs[name] = ref
            found.append(Virtual(name, (info.name,), f"split from {info.name} (part {k}, "
                                                     f"{_grouped(sizes, head_dim)})",
                                 head_doubt or doubt, op, k))
    return found


def _whole(fusion: Fusion, fused: set[str]) -> bool:
    """Whether the side with fused names holds no parts, where the names do not say the order.

    A model with a vision tower's ``fc1`` beside a gated MLP's ``gate_proj`` is not one.
    """
    return fusion.doubt is None or fused.isdisjoint(frozenset().union(*fusion.parts))


def _fitting(fusion: Fusion, found: list[Virtual], refs: dict[str, TensorRef], dst: Side,
             names: frozenset[str]) -> list[Virtual]:
    """The virtual tensors that can fill one of the target's ``names`` modules.

    Where names do not say the order, only those shaped as one (an ungated ``fc1`` is not
    split); all of them otherwise.
    """
    if fusion.doubt is None:
        return found
    shapes = {(info.name.rpartition(".")[2], info.shape) for info in dst.tensors.values()
              if _leaf_module(info.module) in names}
    return [v for v in found if (v.name.rpartition(".")[2], refs[v.name].meta.shape) in shapes]


def _virtual_for(fusion: Fusion, src: Side, refs: dict[str, TensorRef], dst: Side,
                 leaves: tuple[set[str], set[str]]) -> list[Virtual]:
    """One fusion's virtual tensors: fused where the model has the fused names, else split.

    Split only where the model has the parts instead.
    """
    in_src, in_dst = leaves
    names, parts = fusion.fused, frozenset().union(*fusion.parts)
    if not in_dst.isdisjoint(names) and in_src.isdisjoint(names) and _whole(fusion, in_dst):
        per_head = not in_dst.isdisjoint(fusion.per_head)
        return _contested(_fitting(fusion, _fuse(src, refs, fusion, dst, head_dim_of(src, dst)
                                                 if per_head else None), refs, dst, names),
                          in_dst & names, dst)
    if (not in_src.isdisjoint(names) and in_dst.isdisjoint(names)
            and not in_dst.isdisjoint(parts) and _whole(fusion, in_src)):
        return _contested(_fitting(fusion, _split(src, refs, fusion, dst, head_dim_of(src, dst)),
                                   refs, dst, parts), in_src & names, src)
    return []


#: Fused names that code bases store in different layouts: read by the name alone, each key
#: is a guess that compared outputs settle.
CONTESTED = {
    "wqkv": ("gpt-fast stores a fused 'wqkv' as [Q; K; V] blocks, InternLM2 key/value group "
             "by group: the name does not say which one this is"),
}
#: Why a fused tensor read by its name alone is a guess where no known naming family says
#: its layout: the name is one signal (a convention), and shapes fit every layout alike.
CONVENTION = ("a fused projection's rows are read as code bases that name it so store them; "
              "another code base stores the same shapes head by head, core by core or in "
              "another order")
#: Fused names of torch's own modules, whose layout is torch's code (``nn.MultiheadAttention``
#: stores ``[Q; K; V]``): a fact, not a convention.
TORCH_OWN = frozenset({"in_proj"})


def _contested(virtual: list[Virtual], fused: set[str], side: Side) -> list[Virtual]:
    """The virtual tensors, each a guess where its layout rests on the fused name alone.

    A name :data:`CONTESTED` is a guess; so is any other where the fused side belongs to no
    naming family the catalogue knows (whose code says its layout), torch's own modules aside.
    """
    why = next((CONTESTED[name] for name in sorted(fused) if name in CONTESTED), None)
    if why is None and family_of(side) is None and not fused <= TORCH_OWN:
        why = CONVENTION
    if why is None:
        return virtual
    return [replace(v, doubt=v.doubt or why, alternatives=v.alternatives or (
        f"{v.name} (another code base's layout of the fused rows)",)) for v in virtual]


def add_virtual(src: Side, refs: dict[str, TensorRef], dst: Side) -> tuple[Side, list[Virtual]]:
    """Give the source virtual fused or split tensors where the model needs them.

    Args:
        src: The source side.
        refs: The source's lazy tensors; virtual ones are added to it.
        dst: The target side.

    Returns:
        The source side with each virtual tensor in place of its parts, and the virtual tensors.
    """
    in_src, in_dst = _leaves(src), _leaves(dst)
    virtual = [v for fusion in FUSIONS for v in _virtual_for(fusion, src, refs, dst,
                                                             (in_src, in_dst))]
    if not virtual:
        return src, []
    replaced = {part for v in virtual for part in v.parts}
    first = {v.parts[0]: [w for w in virtual if w.parts[0] == v.parts[0]] for v in virtual}
    order: list[str] = []
    for name in src.order:
        order += [v.name for v in first.get(name, ())]
        if name not in replaced:
            order.append(name)
    tensors = {name: src.tensors[name] for name in src.tensors if name not in replaced}
    for v in virtual:
        meta = refs[v.name].meta
        tensors[v.name] = TensorInfo(v.name, meta.shape, meta.dtype, src.tensors[v.parts[0]].kind)
    family_of(src)  # the naming family is the stored names', not the virtual ones'
    return src.with_tensors(tensors, order), virtual
