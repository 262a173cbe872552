"""PEFT adapters: a graft scoped to the adapter's tensors.

A PEFT ``save_pretrained`` folder (``adapter_config.json`` beside ``adapter_model.*``) holds an
adapter's tensors only (LoRA's ``lora_A`` / ``lora_B``...), never the base model's. Grafted into
a model that carries adapter layers (a ``PeftModel``, or a base model given them by
``get_peft_model`` / ``inject_adapter_in_model``), the report is about the adapter: ok when every
adapter tensor of the model is loaded; the base weights are "not part of an adapter", not
missing. Into a model without adapter layers it is refused with what to do.

Adapter layers are recognised by what PEFT's tuner layers declare (``adapter_layer_names``) and
its ``ModulesToSaveWrapper`` (``modules_to_save``), read from the model's own modules: peft is
never imported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ...errors import TorchgraftError
from ...io.contain import read_json
from ...renames import Rule
from ..layouts.layout import Layout

__all__ = ["CONFIG_NAME", "Adapter", "adapter_keys", "find_adapter", "modules_to_save_layout",
           "refuse_plain_target"]

CONFIG_NAME = "adapter_config.json"
#: An adapter config larger than this is not one (PEFT's are about 1 KiB).
_MAX_CONFIG_BYTES = 1024 * 1024

@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter a checkpoint file belongs to.

    Attributes:
        folder: The adapter's folder.
        peft_type: ``"LORA"``, ``"IA3"``...
        target_modules: The modules it adapts, as its config names them.
    """

    folder: Path
    peft_type: str
    target_modules: list[str]


def find_adapter(path: Path) -> Adapter | None:
    """The PEFT adapter whose weights ``path`` holds, from the config beside them.

    Args:
        path: The checkpoint file opened (``adapter_model.safetensors``).

    Returns:
        The adapter, or ``None`` when the file is not an adapter's (no readable config).
    """
    config_path = path.parent / CONFIG_NAME
    if not path.name.startswith("adapter_model") or not config_path.is_file():
        return None
    try:
        config = read_json(config_path, limit=_MAX_CONFIG_BYTES, what=CONFIG_NAME)
    except TorchgraftError:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("peft_type"), str):
        return None
    targets = config.get("target_modules")
    names = [targets] if isinstance(targets, str) else [
        str(t) for t in targets] if isinstance(targets, list) else []
    return Adapter(path.parent, config["peft_type"], names)


def _adapter_prefixes(model: nn.Module) -> list[str]:
    """Where the model's adapter tensors live: ``q.lora_A.``, ``head.modules_to_save.``..."""
    prefixes = []
    for path, module in model.named_modules():
        dot = f"{path}." if path else ""
        layers: Any = getattr(module, "adapter_layer_names", None)
        if isinstance(layers, tuple) and layers:
            prefixes += [f"{dot}{name}." for name in layers if isinstance(name, str)]
        if isinstance(getattr(module, "modules_to_save", None), nn.ModuleDict) and hasattr(
                module, "original_module"):
            prefixes.append(f"{dot}modules_to_save.")
    return prefixes


def adapter_keys(model: nn.Module, keys: list[str]) -> set[str] | None:
    """The keys of ``keys`` that belong to the model's adapter layers.

    Args:
        model: The unwrapped target.
        keys: Its state-dict keys.

    Returns:
        Those keys; ``None`` when the model has no adapter layers.
    """
    prefixes = tuple(_adapter_prefixes(model))
    if not prefixes:
        return None
    return {k for k in keys if k.startswith(prefixes)}


_SAVED_COPY = re.compile(r"^(?P<module>.+)\.modules_to_save\.(?P<adapter>[^.]+)\.(?P<leaf>.+)$")


def modules_to_save_layout(keys: list[str]) -> Layout | None:
    """Where an adapter file's whole modules (``modules_to_save``) go in the model.

    PEFT saves the adapter's own copy of a module under the module's plain name
    (``head.weight``); the model keeps it as ``head.modules_to_save.<adapter>.weight``, beside
    the base model's ``head.original_module.weight``. A prefix before the name is kept
    (``base_model.model.``, which a model given adapter layers in place does not have).

    Args:
        keys: The target's state-dict keys.

    Returns:
        A layout renaming each such name, or ``None`` when the model saves no module.
    """
    renames = tuple(
        Rule(r"^(.*\.)?" + re.escape(f"{m['module']}.{m['leaf']}") + "$",
             rf"\1{m['module']}.modules_to_save.{m['adapter']}.{m['leaf']}")
        for m in map(_SAVED_COPY.match, keys) if m is not None)
    if not renames:
        return None
    return Layout(name="peft-modules-to-save", applies=lambda src, dst: True, renames=renames,
                  across=False)


def refuse_plain_target(adapter: Adapter, source: str) -> TorchgraftError:
    """The error for an adapter grafted into a model without adapter layers: what to do."""
    folder = str(adapter.folder)
    adapted = ", ".join(adapter.target_modules) or "its target modules"
    return TorchgraftError(
        f"this is a PEFT adapter ({adapter.peft_type} on {adapted}; {CONFIG_NAME} beside "
        "it): it holds the adapter's tensors only, "
        "and the model has no adapter layers to take them. Give the model its adapter layers "
        f"first, then graft: model = peft.get_peft_model(model, "
        f"peft.PeftConfig.from_pretrained({folder!r})); tg.graft({folder!r}, model) (or load "
        f"both at once: peft.PeftModel.from_pretrained(model, {folder!r})). The base weights "
        "come from the base model's own checkpoint", path=source)
