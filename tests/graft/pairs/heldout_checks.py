"""What the held-out suite (``test_heldout.py``, both its groups) checks of a case, and
how a case not there yet is marked.

A module source with example inputs must end ``ok`` with equal outputs; a file ``ok`` or
``UNVERIFIED``, with equal outputs either way (:func:`meets_the_bar`). A file that cannot tell
must end ``UNVERIFIED`` and be settled by the source's code (:func:`settles`). A case listed
as not yet is ``xfail(strict=True)`` (:func:`marks`): one that starts passing fails the suite
until its mark is taken off.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.graft.pairs.codebases import Arch
from tests.graft.pairs.pairs import INPUTS, Outcome, Pair, graft_case


class ShortOfTheBar(AssertionError):
    """A case that is not (yet) filled right, or not ok where it should be: what a not-yet
    mark of a pair's case expects. A false ok or an error is never expected there: it fails
    even under the mark."""


def marks(not_yet: Mapping[tuple[str, str], str], pair: str,
          case: str) -> list[pytest.MarkDecorator]:
    """The mark of a case listed in ``not_yet`` (by pair name, and flavour or
    ``twin/flavour``). A pair's case expects :class:`ShortOfTheBar`; a twin's expects the
    false ok it is listed for (an assertion)."""
    reason = not_yet.get((pair, case))
    if reason is None:
        return []
    raises = AssertionError if "/" in case else ShortOfTheBar
    return [pytest.mark.xfail(strict=True, reason=reason, raises=raises)]


def meets_the_bar(outcome: Outcome, flavour: str) -> None:
    """Filled right; a module source with inputs ok, a file ok or honestly unverified."""
    assert not (outcome.verdict == "ok" and not outcome.equal), (
        f"false ok: outputs differ\n{outcome.report}")
    allowed = ("ok",) if flavour == "module" else ("ok", "UNVERIFIED")
    if outcome.verdict not in allowed:
        raise ShortOfTheBar(str(outcome.report))
    if not outcome.equal:
        raise ShortOfTheBar(f"{outcome.verdict} with other outputs\n{outcome.report}")


def settles(pair: Pair, flavour: str, outcome: Outcome, folder: Path) -> None:
    """A file that cannot tell: UNVERIFIED with the guess named (never ok); the source's code
    settles it: ok with equal outputs. Short of that is :class:`ShortOfTheBar`."""
    assert not (outcome.verdict == "ok" and not outcome.equal), (
        f"false ok: outputs differ\n{outcome.report}")
    if outcome.verdict != "UNVERIFIED" or not outcome.report.guesses:
        raise ShortOfTheBar(f"not UNVERIFIED with the guess named\n{outcome.report}")
    source_inputs, inputs = pair.source.inputs(INPUTS), pair.target.inputs(INPUTS)
    assert source_inputs is not None and inputs is not None
    (folder / "settled").mkdir()
    settled = graft_case(pair, flavour, folder / "settled", source_model=pair.source.build,
                         example_inputs=inputs, source_inputs=source_inputs)
    meets_the_bar(settled, "module")


def saved_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """Key to shape of every way a code base writes a model: its state dict, its saved folder
    (``.safetensors`` and ``.pth`` files in it)."""
    model = arch.build()
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    if arch.saves is None:
        return shapes
    with tempfile.TemporaryDirectory() as folder:
        for path in arch.saves(model, Path(folder)).iterdir():
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as file:
                    shapes |= {k: tuple(file.get_slice(k).get_shape()) for k in file.keys()}
            elif path.suffix == ".pth":
                saved = torch.load(path, weights_only=True)
                shapes |= {key: tuple(value.shape) for key, value in saved.items()}
    return shapes
