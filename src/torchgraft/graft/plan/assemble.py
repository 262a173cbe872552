"""A module whose tensors the other side keeps in two places, told apart by their roles.

BEiT's attention keeps its q, k, v weights fused in ``qkv`` (split by fusion into its parts)
and the q and v biases as bare parameters of the attention, ``q_bias`` and ``v_bias`` (the key
has none); another code base keeps ``q_proj`` with its weight and bias. What structure leaves,
a model module whose role names say it (``q_proj`` is ``q``) takes each of its tensors from the
one unpaired tensor of the other side, in the scope the pairs so far align with it, that has
the same role (``qkv[0]``, ``q_bias``: a bare parameter named for its role), the same leaf
(``q_bias`` is a bias) and the same shape; and the other way round. Roles alone tell ``q_bias``
from ``v_bias`` (the same shape): a guess for a file, unless the order both sides store them in
agrees (:mod:`~torchgraft.graft.plan.structure`'s two families of signals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..evidence import Guess, MatchStep
from ..layouts.conventions import role_parts
from ..tensors import owner
from .infer import Scopes
from .state import PassState
from .steps import is_bookkeeping

__all__ = ["assemble"]

#: A bare parameter named for its role and the leaf it stands for: ``q_bias``, ``k_weight``.
_NAMED = re.compile(r"^(?P<role>\w+)_(?P<leaf>bias|weight)$")


@dataclass(frozen=True)
class _Piece:
    """One unpaired tensor, as the leaf of the module its name says it belongs to."""

    key: str
    module: str
    leaf: str
    shape: tuple[int, ...]
    role: str | None


def _piece(key: str, name: str, shape: tuple[int, ...]) -> _Piece:
    module, leaf = owner(name), name.rpartition(".")[2]
    named = _NAMED.match(leaf)
    if named is not None and leaf not in ("weight", "bias"):
        module, leaf = f"{module}.{named['role']}" if module else named["role"], named["leaf"]
    return _Piece(key, module, leaf, shape, role_parts(module)[1])  # its contexts aside


def _pieces(keys: list[str], names: dict[str, str],
            shapes: dict[str, tuple[int, ...]]) -> list[_Piece]:
    return [_piece(k, names.get(k, k), shapes[k]) for k in keys
            if not is_bookkeeping(names.get(k, k))]


def _under(scope: str, path: str) -> bool:
    return not scope or path.startswith(scope + ".")


def assemble(state: PassState) -> None:
    """Fill a module's tensors, role by role, from unpaired tensors kept elsewhere."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    filled = {state.dst.ties.get(t, t) for t in state.pairs}
    targets = _pieces([t for t in left_t if state.dst.ties.get(t, t) not in filled], {},
                      {k: i.shape for k, i in state.dst.tensors.items()})
    sources = _pieces(left_s, state.renamed, {k: i.shape for k, i in state.src.tensors.items()})
    scopes = Scopes(state.pairs, state.renamed)
    found: dict[str, str] = {}
    for piece in targets:
        alike, chosen = _candidates(piece, sources, scopes, set(found.values()))
        if chosen is None:
            continue
        found[piece.key] = chosen.key
        if len(alike) > 1 and not state.described.source_is_module:
            state.by_convention.add(piece.key)
            state.plan.guesses[piece.key] = Guess(
                tuple(state.renamed.get(s.key, s.key) for s in alike if s is not chosen),
                f"{len(alike)} tensors of the checkpoint fit '{piece.key}' and only their "
                "roles' names tell which is its")
    state.take(found, MatchStep.STRUCTURE)


def _candidates(piece: _Piece, sources: list[_Piece], scopes: Scopes,
                taken: set[str]) -> tuple[list[_Piece], _Piece | None]:
    """The tensors that fit ``piece`` in its narrowest aligned scope, and the one of its role.

    Returns:
        Those of its leaf and shape, and the one among them of its role (``None`` unless
        exactly one).
    """
    if piece.role is None:
        return [], None
    for scope in scopes.partners(piece.module, target=True):
        alike = [s for s in sources if s.key not in taken and _under(scope, s.module)
                 and s.leaf == piece.leaf and s.shape == piece.shape]
        chosen = [s for s in alike if s.role == piece.role]
        if chosen:
            return alike, chosen[0] if len(chosen) == 1 else None
    return [], None
