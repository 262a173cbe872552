"""The held-out real pairs (issue 27): code bases none of torchgraft's name tables lists, grafted
with no rules from every flavour, each way; broken twins never ok.

Each pair's reference mapping (its code base's own converter where there is one) is first
proven by equal outputs through both libraries' own forward. A module source with example
inputs must then end ``ok`` with equal outputs; a file ``ok`` or ``UNVERIFIED``, with equal
outputs either way; a broken twin never ``ok``. Cases not there yet are ``xfail(strict=True)``
with the class of failure that stops them (:data:`.heldout_expectations.NOT_YET`), so that
each one that starts passing says so. The names of the held-out code bases are checked
unknown to the tables beyond what :data:`.heldout_expectations.KNOWN_TO_TABLES` froze: no
table row can make these cases pass. ``scripts/pairs_table.py --heldout`` prints the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.graft.pairs.installed import skip_without_code_bases

skip_without_code_bases("transformers", "timm", "whisper", "litgpt", "x_transformers", "encodec")

from tests.graft.pairs import heldout_mlx as mlx  # noqa: E402
from tests.graft.pairs.heldout import (  # noqa: E402
    HELDOUT_PAIR_IDS,
    HELDOUT_PAIRS,
    HELDOUT_SIDES,
    PAIR_ARCHS,
)
from tests.graft.pairs.heldout_checks import (  # noqa: E402
    marks,
    meets_the_bar,
    saved_shapes,
    settles,
)
from tests.graft.pairs.heldout_codebases import HELDOUT_ARCHS  # noqa: E402
from tests.graft.pairs.heldout_expectations import (  # noqa: E402
    KNOWN_LAYOUTS,
    KNOWN_TO_TABLES,
    NOT_YET,
    UNDECIDABLE,
)
from tests.graft.pairs.pairs import (  # noqa: E402
    Pair,
    assert_never_ok,
    case_key,
    flavours,
    graft_case,
    outputs_equal,
    through_reference,
    twin_cases,
)
from tests.graft.pairs.tables import layouts_between, recognised  # noqa: E402

CASES = [pytest.param(pair, flavour, id=f"{pair.name} [{flavour}]",
                      marks=marks(NOT_YET, pair.name, flavour))
         for pair in HELDOUT_PAIRS for flavour in flavours(pair)]
TWIN_CASES = [pytest.param(pair, twin, flavour, id=f"{pair.name} [{twin} twin, {flavour}]",
                           marks=marks(NOT_YET, *case_key(pair, flavour, twin)))
              for pair, flavour, twin in twin_cases(HELDOUT_PAIRS)]
MLX_CASES = [pytest.param(target, id=f"{mlx.SOURCE} -> {target} [{mlx.FLAVOUR}]",
                          marks=marks(NOT_YET, f"{mlx.SOURCE} -> {target}", mlx.FLAVOUR))
             for target in mlx.TARGETS]
MLX_TWIN_CASES = [pytest.param(target, twin, id=f"{mlx.SOURCE} -> {target} [{twin} twin]",
                               marks=marks(NOT_YET, f"{mlx.SOURCE} -> {target}",
                                           f"{twin}/{mlx.FLAVOUR}"))
                  for target in mlx.TARGETS for twin in mlx.TWINS]


@pytest.mark.parametrize("pair", HELDOUT_PAIRS, ids=HELDOUT_PAIR_IDS)
def test_reference_mapping_gives_equal_outputs(pair: Pair) -> None:
    result, actual, expected = through_reference(pair)
    assert not result.unexpected_keys
    assert all(not k.endswith(".weight") for k in result.missing_keys), result.missing_keys
    assert outputs_equal(actual, expected)


@pytest.mark.parametrize(("pair", "flavour"), CASES)
def test_pair(pair: Pair, flavour: str, tmp_path: Path) -> None:
    outcome = graft_case(pair, flavour, tmp_path)
    if (pair.name, flavour) in UNDECIDABLE:
        settles(pair, flavour, outcome, tmp_path)
    else:
        meets_the_bar(outcome, flavour)


@pytest.mark.parametrize(("pair", "twin", "flavour"), TWIN_CASES)
def test_broken_twin_is_never_ok(pair: Pair, twin: str, flavour: str, tmp_path: Path) -> None:
    assert_never_ok(graft_case(pair, flavour, tmp_path, twin=twin), twin)


@pytest.mark.parametrize("target", mlx.TARGETS)
def test_mlx_reference_mapping_gives_equal_outputs(target: str) -> None:
    arch = HELDOUT_ARCHS[target]
    model = arch.build().eval()
    state = load_file(mlx.FIXTURES / mlx.FILES[None])
    result = model.load_state_dict(mlx.reference(arch)(state), strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= mlx.COMPUTED, result.missing_keys
    batch, expected = mlx.inputs()
    with torch.no_grad():
        assert outputs_equal(arch.run(model, batch), expected)


@pytest.mark.parametrize("target", MLX_CASES)
def test_mlx_file(target: str) -> None:
    meets_the_bar(mlx.graft_mlx(target), mlx.FLAVOUR)


@pytest.mark.parametrize(("target", "twin"), MLX_TWIN_CASES)
def test_mlx_broken_twin_is_never_ok(target: str, twin: str, tmp_path: Path) -> None:
    assert_never_ok(mlx.graft_mlx(target, twin, tmp_path), twin)


def _mlx_shapes() -> dict[str, tuple[int, ...]]:
    with safe_open(str(mlx.FIXTURES / mlx.FILES[None]), "pt") as file:
        return {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}


def _shapes(name: str) -> dict[str, tuple[int, ...]]:
    return _mlx_shapes() if name == mlx.SOURCE else saved_shapes(PAIR_ARCHS[name])


@pytest.mark.parametrize("side", [*HELDOUT_SIDES, mlx.SOURCE])
def test_heldout_names_are_unknown_to_the_tables(side: str) -> None:
    """A table row that names a held-out code base's keys makes its cases no measure."""
    new = recognised(_shapes(side)) - KNOWN_TO_TABLES[side]
    assert not new, f"torchgraft's tables now name {side}'s keys: {sorted(new)}"


_LAYOUT_PAIRS = [(pair.source.name, pair.target.name) for pair in HELDOUT_PAIRS] + [
    (mlx.SOURCE, target) for target in mlx.TARGETS]


@pytest.mark.parametrize(("source", "target"), _LAYOUT_PAIRS,
                         ids=[f"{s} -> {t}" for s, t in _LAYOUT_PAIRS])
def test_no_new_layout_applies_between_heldout_sides(source: str, target: str) -> None:
    name = f"{source} -> {target}"
    new = layouts_between(_shapes(source), _shapes(target)) - KNOWN_LAYOUTS.get(name, frozenset())
    assert not new, f"layouts now stand between {name}: {sorted(new)}"
