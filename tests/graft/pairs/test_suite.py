"""Real code-base pairs, grafted with no rules from every flavour; broken twins never ok.

Each pair's reference mapping is first proven by equal outputs (both libraries' own forward).
Then every pair x flavour is grafted: the verdict must be ok with equal outputs (or UNVERIFIED
where nothing a file holds can decide, listed in :data:`UNDECIDABLE`, with equal outputs still),
and never ok with other outputs. Cases not there yet are ``xfail(strict=True)`` with the
reason, in :data:`NOT_YET`; ``scripts/pairs_table.py`` prints the whole table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.graft.pairs.installed import skip_without_code_bases

skip_without_code_bases("transformers", "timm", "open_clip", "whisper", "torchtune",
                        "efficientnet_pytorch")

from tests.graft.pairs.expectations import NOT_YET, UNDECIDABLE  # noqa: E402
from tests.graft.pairs.pairs import (  # noqa: E402
    PAIR_IDS,
    PAIRS,
    Pair,
    assert_never_ok,
    assert_rules_reproduce,
    flavours,
    graft_case,
    outputs_equal,
    through_reference,
    twin_cases,
)


def _marked(pair: Pair, case: str) -> list[pytest.MarkDecorator]:
    reason = NOT_YET.get((pair.name, case))
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


CASES = [pytest.param(pair, flavour, id=f"{pair.name} [{flavour}]",
                      marks=_marked(pair, flavour))
         for pair in PAIRS for flavour in flavours(pair)]
TWIN_CASES = [pytest.param(pair, twin, flavour, id=f"{pair.name} [{twin} twin, {flavour}]",
                           marks=_marked(pair, f"{twin}/{flavour}"))
              for pair, flavour, twin in twin_cases()]


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_reference_mapping_gives_equal_outputs(pair: Pair) -> None:
    result, actual, expected = through_reference(pair)
    assert not result.unexpected_keys
    assert all(not k.endswith(".weight") for k in result.missing_keys), result.missing_keys
    assert outputs_equal(actual, expected)


@pytest.mark.slow
@pytest.mark.parametrize(("pair", "flavour"), CASES)
def test_pair(pair: Pair, flavour: str, tmp_path: Path) -> None:
    outcome = graft_case(pair, flavour, tmp_path)
    assert not (outcome.verdict == "ok" and not outcome.equal), (
        f"false ok: outputs differ\n{outcome.report}")
    expected = "UNVERIFIED" if (pair.name, flavour) in UNDECIDABLE else "ok"
    assert outcome.verdict == expected, str(outcome.report)
    # UNVERIFIED too: the graft's guess for the real pair is the natural one
    assert outcome.equal, f"{outcome.verdict} with other outputs\n{outcome.report}"


@pytest.mark.slow
@pytest.mark.parametrize(("pair", "twin", "flavour"), TWIN_CASES)
def test_broken_twin_is_never_ok(pair: Pair, twin: str, flavour: str, tmp_path: Path) -> None:
    assert_never_ok(graft_case(pair, flavour, tmp_path, twin=twin), twin)


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_rules_reproduce_the_settled_graft(pair: Pair, tmp_path: Path) -> None:
    assert_rules_reproduce(pair, tmp_path)
