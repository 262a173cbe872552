"""mlx-whisper's file (written by MLX's ``save_weights``: plain safetensors, no marker,
convolutions channels last) grafted into PyTorch's Whisper models.

MLX models are not PyTorch modules, so this pair goes one way, from the committed fixture
(``scripts/make_framework_fixtures.py mlx-whisper``; versions in the fixtures' MANIFEST.json),
whose MLX outputs for fixed inputs lie beside it. The broken twins are MLX's own files too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

import torchgraft as tg
from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import TWIN_HEADS, Arch, Inputs
from tests.graft.pairs.heldout_codebases import HELDOUT_ARCHS
from tests.graft.pairs.pairs import Outcome, outputs_equal, verdict, write_sorted_siblings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "frameworks" / "mlx"
SOURCE = "mlx-whisper (MLX save_weights)"
TARGETS = ("openai-whisper (32 wide)", "transformers Whisper (32 wide)")
#: The twin and the file it is grafted from (``heads``: the model has another head count).
FILES = {None: "whisper.safetensors", "deeper": "whisper_deeper.safetensors",
         "norms": "whisper_norms.safetensors", "heads": "whisper.safetensors",
         "sorted": "whisper.safetensors"}
TWINS = ("deeper", "heads", "norms", "sorted")
#: The sorted twin's two same-shape siblings (MLX's file keeps openai-whisper's names).
SIBLINGS = ("encoder.blocks.0.attn_ln.weight", "encoder.blocks.0.attn_ln.bias")
FLAVOUR = "mlx"
#: The targets' keys MLX computes (the encoder's sinusoids) rather than saves.
COMPUTED = frozenset({"encoder.positional_embedding", "model.encoder.embed_positions.weight"})


def inputs() -> tuple[Inputs, torch.Tensor]:
    """The fixture's inputs and MLX's logits for them."""
    saved = np.load(FIXTURES / "whisper_io.npz")
    empty = torch.empty(0)
    return (Inputs(torch.from_numpy(saved["tokens"]), empty, torch.from_numpy(saved["mel"]),
                   empty), torch.from_numpy(saved["logits"]))


def mlx_to_openai_whisper(state: ref.State) -> ref.State:
    """mlx-examples' whisper/convert.py the other way: ``mlp1``/``mlp2`` are ``mlp.0``/``mlp.2``,
    convolution weights ``[out, kernel, in]`` are ``[out, in, kernel]``; the alignment heads
    are not weights."""
    out: ref.State = {}
    for key, value in state.items():
        if key == "alignment_heads":
            continue
        if key.startswith("encoder.conv") and key.endswith(".weight"):
            value = value.transpose(1, 2)
        out[key.replace(".mlp1.", ".mlp.0.").replace(".mlp2.", ".mlp.2.")] = value
    return out


def reference(target: Arch) -> ref.Mapping:
    """The MLX file's state dict to the target's."""
    if target.name == TARGETS[0]:
        return mlx_to_openai_whisper
    return lambda state: ref.openai_whisper_to_hf_whisper(mlx_to_openai_whisper(state))


def graft_mlx(target_name: str, twin: str | None = None,
              folder: Path | None = None) -> Outcome:
    """Graft the MLX file (or a twin's) into a fresh target; compare with MLX's outputs.

    The sorted twin is MLX's file with :data:`SIBLINGS` renamed
    (:func:`~tests.graft.pairs.pairs.write_sorted_siblings`), written into ``folder``.
    """
    target_arch = HELDOUT_ARCHS[target_name]
    target = target_arch.build(heads=TWIN_HEADS if twin == "heads" else None).eval()
    source = FIXTURES / FILES[twin]
    if twin == "sorted":
        assert folder is not None, "the sorted twin is written into a folder"
        source = write_sorted_siblings(load_file(source), SIBLINGS, folder / FILES[twin])
    report = tg.graft(source, target)
    batch, expected = inputs()
    try:
        with torch.no_grad():
            equal = outputs_equal(target_arch.run(target.eval(), batch), expected)
    except Exception:  # a graft that left the target unable to run
        equal = False
    return Outcome(verdict(report), equal, report)
