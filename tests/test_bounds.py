"""Bounds before allocation: hostile files end fast, small, and in a library error.

The cases are in ``tests/hostile_cases.py``; they run in one child process whose address
space is capped, each measured for CPU time and peak resident memory above its baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchgraft as tg
from tests.helpers import BOUNDED, PER_BYTE, assert_scales_linearly, calls
from torchgraft.bounds import (
    check_fits,
    check_length,
    check_shape,
    check_view,
    parse_yaml,
    view_extent,
)

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    folder = tmp_path_factory.mktemp("hostile")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
           "PYTHONWARNINGS": "ignore", "TORCHGRAFT_HOSTILE_SCALE": "10"}
    done = subprocess.run([sys.executable, "-m", "tests.hostile_cases", str(folder)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_every_case_ends_in_a_library_error_or_a_view(measured: list[dict[str, object]]
                                                      ) -> None:
    from tests.hostile_cases import CASES, OUTCOMES

    assert [r["case"] for r in measured] == list(CASES)
    for record in measured:
        assert record["error"] != "RAW", record
        assert record["error"] == OUTCOMES.get(str(record["case"]), "CorruptCheckpointError"), \
            record


@pytest.mark.slow
def test_every_case_is_cheap(measured: list[dict[str, object]]) -> None:
    for record in measured:
        size = int(record["file_bytes"])  # type: ignore[call-overload]
        limit_mib = max(64, 4 * size / 2**20)
        assert float(record["peak_mib"]) < limit_mib, record  # type: ignore[arg-type]
        operations = int(record["operations"])  # type: ignore[call-overload]
        assert operations < BOUNDED + PER_BYTE * size, record  # linear in the file


@pytest.mark.parametrize("value", [-1, 11, 2**63, 1.5, True, "3", None])
def test_lengths_outside_the_file_are_refused(value: object) -> None:
    with pytest.raises(tg.CorruptCheckpointError, match="at most 10"):
        check_length(value, available=10, what="a length")


def test_lengths_inside_the_file_pass() -> None:
    assert check_length(0, available=10, what="x") == 0
    assert check_length(10, available=10, what="x") == 10


@pytest.mark.parametrize("shape", [[-1], [1] * 65, [1.0], "12", [True]])
def test_malformed_shapes_are_refused(shape: object) -> None:
    with pytest.raises(tg.CorruptCheckpointError, match="malformed shape"):
        check_shape(shape, what="t")


def test_a_shape_needing_more_than_is_stored_is_refused_without_overflow() -> None:
    assert check_fits((2, 3), 4, available=24, what="t") == 24
    with pytest.raises(tg.CorruptCheckpointError, match="needs 2361183241434822606848 bytes"):
        check_fits((2**32, 2**32, 2**3), 16, available=100, what="t")


def test_a_view_is_measured_by_its_extent() -> None:
    assert view_extent((2**30, 2**30), (0, 0), 0, what="t") == 1
    assert view_extent((2, 3), (3, 1), 4, what="t") == 10
    assert view_extent((0, 5), (5, 1), 99, what="t") == 0
    check_view((2**30,), (0,), 0, 1, what="t")
    with pytest.raises(tg.CorruptCheckpointError, match="reaches element 1"):
        check_view((2,), (1,), 0, 1, what="t")
    with pytest.raises(tg.CorruptCheckpointError, match="malformed"):
        view_extent((2,), (-1,), 0, what="t")


def _alias_bomb(levels: int = 9) -> str:
    """The billion laughs: nine lines that stand for 9^levels strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_it_is_built() -> None:
    def refused() -> None:
        with pytest.raises(tg.CorruptCheckpointError, match="alias bomb"):
            parse_yaml(_alias_bomb(), what="the rules file")

    assert calls(refused) < BOUNDED  # 9^9 strings stood for, none built


def test_yaml_aliases_that_repeat_a_little_are_read() -> None:  # the control
    text = "drop: &drop null\nrules:\n  - ['^head\\.', *drop]\n  - ['^fc\\.', *drop]\n"
    assert parse_yaml(text, what="rules") == {"drop": None, "rules": [["^head\\.", None],
                                                                        ["^fc\\.", None]]}


@pytest.mark.parametrize(("text", "match"), [
    pytest.param("[" * 500 + "]" * 500, "nest deeper than 100", id="flow lists"),
    pytest.param("[" * 10_000 + "]" * 10_000, "nest deeper than 100|not valid YAML",
                 id="flow lists past libyaml's own bound"),
    pytest.param("".join(f"{' ' * i}k:\n" for i in range(1000)) + " " * 1000 + "k: 1\n",
                 "nest deeper than 100", id="block mappings"),
    pytest.param("&a [*a]", "inside what it names", id="recursive alias"),
    pytest.param("rules: [a, *nowhere]", "before it is defined", id="undefined alias"),
    pytest.param("!!python/object/apply:os.system ['true']", "not valid YAML", id="python tag"),
    pytest.param("[1, 2", "not valid YAML", id="unclosed"),
])
def test_yaml_that_nests_too_deep_or_is_not_yaml_is_refused(text: str, match: str) -> None:
    with pytest.raises(tg.CorruptCheckpointError, match=match) as caught:
        parse_yaml(text, what="the rules file")
    assert len(str(caught.value)) < 400


def test_yaml_of_the_same_depth_is_read() -> None:  # the control: 100 levels are allowed
    assert parse_yaml("[" * 100 + "]" * 100, what="rules") is not None


def test_yaml_walk_is_linear() -> None:
    def cost(rules: int) -> int:
        text = "rules:\n" + "".join(f"  - ['^layer{i}\\.', 'block{i}.']\n" for i in range(rules))
        return calls(lambda: parse_yaml(text, what="rules"))

    assert_scales_linearly(cost, 2000)
