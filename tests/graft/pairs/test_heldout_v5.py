"""Issue 37's held-out pairs (:mod:`.heldout_v5`): code bases no table or other test names,
grafted with no rules from every flavour, each way; broken twins never ok, the sorted twin
never ok with other outputs.

As ``test_heldout.py``: each pair's reference mapping (the libraries' own converters where
there are some) is proven by equal outputs through both libraries' own forward first; then a
module source with example inputs must end ``ok`` with equal outputs, a file ``ok`` or
``UNVERIFIED`` with equal outputs. Cases not there yet are ``xfail(strict=True)`` with the
class of failure that stops them (:data:`.heldout_v5_expectations.NOT_YET`): each one that
starts passing says so. A table row naming these code bases' keys beyond what
:data:`.heldout_v5_expectations.KNOWN_TO_TABLES` froze fails the suite.
``scripts/pairs_table.py --v5`` prints the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.graft.pairs.installed import skip_without_code_bases

skip_without_code_bases("transformers", "diffusers", "timm", "ldm", "olmo", "olmo_core")

from tests.graft.pairs.heldout_checks import (  # noqa: E402
    marks,
    meets_the_bar,
    saved_shapes,
    settles,
)
from tests.graft.pairs.heldout_v5 import (  # noqa: E402
    V5_PAIR_ARCHS,
    V5_PAIR_IDS,
    V5_PAIRS,
    V5_SIDES,
)
from tests.graft.pairs.heldout_v5_expectations import (  # noqa: E402
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
         for pair in V5_PAIRS for flavour in flavours(pair)]
TWIN_CASES = [pytest.param(pair, twin, flavour, id=f"{pair.name} [{twin} twin, {flavour}]",
                           marks=marks(NOT_YET, *case_key(pair, flavour, twin)))
              for pair, flavour, twin in twin_cases(V5_PAIRS)]


@pytest.mark.parametrize("pair", V5_PAIRS, ids=V5_PAIR_IDS)
def test_reference_mapping_gives_equal_outputs(pair: Pair) -> None:
    result, actual, expected = through_reference(pair)
    assert not result.unexpected_keys
    assert all(not k.endswith(".weight") for k in result.missing_keys), result.missing_keys
    assert outputs_equal(actual, expected)


@pytest.mark.slow
@pytest.mark.parametrize(("pair", "flavour"), CASES)
def test_pair(pair: Pair, flavour: str, tmp_path: Path) -> None:
    outcome = graft_case(pair, flavour, tmp_path)
    if (pair.name, flavour) in UNDECIDABLE:
        settles(pair, flavour, outcome, tmp_path)
    else:
        meets_the_bar(outcome, flavour)


@pytest.mark.slow
@pytest.mark.parametrize(("pair", "twin", "flavour"), TWIN_CASES)
def test_broken_twin_is_never_ok(pair: Pair, twin: str, flavour: str, tmp_path: Path) -> None:
    assert_never_ok(graft_case(pair, flavour, tmp_path, twin=twin), twin)


@pytest.mark.parametrize("side", V5_SIDES)
def test_v5_names_are_unknown_to_the_tables(side: str) -> None:
    """A table row that names a held-out code base's keys makes its cases no measure."""
    new = recognised(saved_shapes(V5_PAIR_ARCHS[side])) - KNOWN_TO_TABLES[side]
    assert not new, f"torchgraft's tables now name {side}'s keys: {sorted(new)}"


@pytest.mark.parametrize("pair", V5_PAIRS, ids=V5_PAIR_IDS)
def test_no_new_layout_applies_between_v5_sides(pair: Pair) -> None:
    new = layouts_between(saved_shapes(pair.source), saved_shapes(pair.target)) - (
        KNOWN_LAYOUTS.get(pair.name, frozenset()))
    assert not new, f"layouts now stand between {pair.name}: {sorted(new)}"
