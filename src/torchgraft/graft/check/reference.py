"""What a graft's outputs are compared with: the source's module, or its own model.

The source's own model is built from its config or given as ``source_model=``, and filled from
the same checkpoint.

:func:`reference_for` decides, from what the caller gave, whether there is anything to compare
with: a source module with inputs; ``source_model=``; a checkpoint folder whose ``config.json``
names a transformers class. Inputs are the caller's, else generated from the config, else (where
the caller asked for a comparison: ``source_model=``, ``verify=True``, or a folder's model) from
the models' first modules, and bound to each model's ``forward`` by argument name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ...errors import TorchgraftError
from ...renames import Rule
from ..report.report import GraftReport
from ..search.activations import Call, as_call
from ..sides.inputs import Inputs, bind, by_role, describe_inputs, from_config, from_modules
from .source_model import (
    MAX_AUTO_BYTES,
    SourceModel,
    SourceModelLike,
    from_folder,
    resolve,
    unbuilt,
)

__all__ = ["Reference", "Want", "expect_reference", "reference_for"]

logger = logging.getLogger("torchgraft")

#: Fills a module of the source's code base from the graft's source (with rules that rename the
#: source's keys to the module's); returns its report.
Fill = Callable[[nn.Module, list[Rule]], GraftReport]


@dataclass(frozen=True)
class Reference:
    """A model that computes what the source computes, and the inputs to compare on.

    Attributes:
        module: The model.
        source_call: Its inputs.
        target_call: The grafted model's inputs.
        names: Source keys (as the plan names them) to the reference model's keys.
        origin: What it is, for the report.
        generated: What the inputs are where they were generated, not the caller's (``from
            its config: token ids (1, 8)``); empty for the caller's.
        otherwise: Other inputs to try in turn where a model fails on these (source call,
            target call, what they are): images of other sizes.
    """

    module: nn.Module
    source_call: Call
    target_call: Call
    names: dict[str, str]
    origin: str
    generated: str = ""
    otherwise: tuple[tuple[Call, Call, str], ...] = ()

    def tries(self) -> list[Reference]:
        """This reference, then the same with each other inputs, in the order to try them."""
        return [self, *(replace(self, source_call=source, target_call=target,
                                generated=generated, otherwise=())
                        for source, target, generated in self.otherwise)]


@dataclass(frozen=True)
class Want:
    """What the caller asked: ``verify``, inputs, a source model, the size of the weights.

    ``by_name``: every key of the graft was filled by its exact name, as stored.
    ``source_shapes``: the source's tensors' shapes, by key (a folder's config is checked
    against them before a model is built from it).
    """

    verify: bool | str
    example_inputs: Any
    source_inputs: Any
    roles: Inputs | None
    source_model: SourceModelLike | None
    source_bytes: int
    by_name: bool = False
    source_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def _give_up(warnings: list[str], why: str) -> None:
    """Nothing to compare with after all: a warning (the graft is filled; never an error)."""
    warnings.append(f"outputs were not compared: {why}")


#: What ``verify=True`` is told when there is nothing to compare with.
_NOTHING = ("verify=True needs something to compare with: source_model= (CLI: --source-model "
            "MODULE:FACTORY; a model of the source's code base, or what builds one), a source "
            "module, or a checkpoint folder whose config.json names a transformers class (with "
            "transformers installed)")


def expect_reference(source: Any, module: nn.Module | None, want: Want) -> None:
    """Before any tensor is filled: refuse ``verify=True`` when there is nothing to compare with.

    What the caller asked for is checked while the model is untouched; once it is filled,
    verification only ever warns.

    Args:
        source: The graft's source (a path, a module...).
        module: The source module, when the source is one.
        want: What the caller asked.

    Raises:
        TorchgraftError: With ``verify=True``, when there is nothing to compare with, no inputs
            for a source module, or a config.json beside the file that cannot be read.
    """
    if want.verify is not True:
        return
    if module is not None:
        if want.example_inputs is None and not want.roles and not from_modules(module):
            raise TorchgraftError("verify=True: no inputs can be generated for the source "
                                  "module (no nn.Embedding, convolution or nn.Linear says what "
                                  "it takes); pass example_inputs= (and source_inputs=)")
        return
    try:
        candidate = _candidate(source, want)
    except TorchgraftError as exc:  # the config's file named first, as it was
        raise TorchgraftError(f"verify=True: {exc.message}", path=exc.path) from None
    if candidate is None:
        why = unbuilt(source) if isinstance(source, (str, os.PathLike)) else None
        if why is not None:  # a config beside the file, refused: named, with the reason
            config, reason = why
            raise TorchgraftError(f"verify=True needs something to compare with, and this "
                                  f"config builds no model: {reason}; give source_model= "
                                  "(CLI: --source-model MODULE:FACTORY)", path=config)
        raise TorchgraftError(_NOTHING)


def reference_for(source: Any, module: nn.Module | None, target: nn.Module, want: Want,
                  fill: Fill, warnings: list[str]) -> Reference | None:
    """The reference to compare the grafted ``target`` with, if there is one.

    With ``verify="auto"``, a model of the very class and config a folder's config.json
    describes, every key filled by its own name, is not compared: the reference would be
    the same model filled the same way (and would take as much memory again).

    Never raises: what stops a comparison is said in ``warnings`` (``verify=True`` was checked
    before the fill, by :func:`expect_reference`).

    Args:
        source: The graft's source (a path, a module...).
        module: The source module, when the source is one.
        target: The grafted model.
        want: What the caller asked.
        fill: Fills a source-model module from ``source``.
        warnings: Where to say why outputs were not compared.

    Returns:
        The reference, or ``None`` when there is nothing to compare with.
    """
    if module is not None:  # both codes at hand: compared on generated inputs where none given
        return _with_inputs(module, target, want, {}, "the source module", want.roles, warnings,
                            generate=True)
    try:
        candidate = _candidate(source, want)
    except TorchgraftError as exc:  # a config.json beside the file that cannot be read
        _give_up(warnings, str(exc))
        return None
    if candidate is None:
        _unbuilt_config(source, warnings)
        return None
    if want.verify == "auto" and want.by_name and candidate.same_as(target):
        logger.info("outputs not compared with %s: the model is its class and config, every "
                    "key filled by its own name", candidate.origin)
        return None
    if want.verify is not True and want.source_bytes > MAX_AUTO_BYTES:
        warnings.append(f"outputs were not compared with {candidate.origin}: the weights are "
                        f"over {MAX_AUTO_BYTES >> 30} GiB (pass verify=True to compare anyway)")
        return None
    try:
        built = candidate.build()
        filled = fill(built, candidate.renames(built))
    except Exception as exc:  # the caller's callable, a constructor, a copy that failed
        _give_up(warnings, f"{candidate.origin} could not be built and filled: "
                           f"{type(exc).__name__}: {exc}")
        return None
    if not filled.ok:
        _give_up(warnings, f"{candidate.origin} could not be filled from the checkpoint by name "
                           f"({filled.headline()})")
        return None
    names = {source_key: key for key, source_key in filled.mapping.items()}
    try:
        config = candidate.inputs or _from_module_config(built)
    except TorchgraftError as exc:  # the model's own config sizes an input past its bound
        _give_up(warnings, str(exc))
        return None
    return _with_inputs(built, target, want, names, candidate.origin,
                        want.roles or config, warnings, "from its config" if config else "")


def _with_inputs(module: nn.Module, target: nn.Module, want: Want, names: dict[str, str],
                 origin: str, roles: Inputs | None, warnings: list[str],
                 made: str = "", *, generate: bool = False) -> Reference | None:
    """The reference with the caller's inputs, else ``roles``, bound to each forward by name.

    The caller's inputs as a mapping of argument names are bound to each model's ``forward``
    by name too (``input_ids`` goes to ``idx`` where that model calls it so). Without any,
    where the caller asked for a comparison (``verify=True``, or a model of the source's
    code base, or the source module itself: ``generate``), inputs are generated from the
    models' first modules, each to try in turn.

    Args:
        module: The reference model.
        target: The grafted model.
        want: What the caller asked.
        names: Source keys to the reference model's keys.
        origin: What the reference is.
        roles: Inputs by role (the caller's, or generated from a config).
        warnings: Where to say why outputs are not compared.
        made: Where ``roles`` were generated from (empty: the caller's).
        generate: Generate inputs where none are given (the source module is at hand).
    """
    if want.example_inputs is not None and not (
            isinstance(want.example_inputs, Mapping) and want.source_inputs is want.example_inputs):
        return Reference(module, as_call(want.source_inputs), as_call(want.example_inputs),
                         names, origin)
    if want.example_inputs is not None:
        roles, made = by_role(want.example_inputs), ""
    tries = [(roles, f"{made}: {describe_inputs(roles)}" if made else "")] if roles else []
    asked = want.verify is True or bool(names) or generate
    if not tries and asked:
        tries = [(inputs, f"from the models: {describe_inputs(inputs)}")
                 for inputs in from_modules(module, target)]
    if not tries:
        if asked:
            _give_up(warnings, f"no inputs can be generated for {origin} (no nn.Embedding, "
                               "convolution or nn.Linear says what it takes); give them as "
                               "example_inputs= (CLI: --inputs FILE or --input-shape N,C,H,W)")
        return None
    bound: list[tuple[Call, Call, str]] = []
    failed: list[str] = []
    for inputs, what in tries:
        try:
            bound.append((bind(module, inputs), bind(target, inputs), what))
        except TorchgraftError as exc:
            failed.append(str(exc))
    if not bound:
        _give_up(warnings, "; ".join(dict.fromkeys(failed)))
        return None
    (source_call, target_call, generated), *otherwise = bound
    return Reference(module, source_call, target_call, names, origin, generated,
                     tuple(otherwise))


def _from_module_config(module: nn.Module) -> Inputs:
    """Inputs from a module's own config (a transformers model's ``config.to_dict()``)."""
    to_dict = getattr(getattr(module, "config", None), "to_dict", None)
    config = to_dict() if callable(to_dict) else None
    return from_config(config) if isinstance(config, dict) else Inputs()


def _unbuilt_config(source: Any, warnings: list[str]) -> None:
    """Say so when a checkpoint's folder has a config.json that no model is built from."""
    if not isinstance(source, (str, os.PathLike)):
        return
    why = unbuilt(source)
    if why is not None:
        config, reason = why
        warnings.append(f"outputs were not compared: {config} builds no model: {reason}; give "
                        "source_model= (CLI: --source-model MODULE:FACTORY) to compare")


def _candidate(source: Any, want: Want) -> SourceModel | None:
    if want.source_model is not None:
        return resolve(want.source_model)
    if isinstance(source, (str, os.PathLike)):
        return from_folder(source, shapes=want.source_shapes)
    return None
