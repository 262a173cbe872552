"""Units: a module's nearest numbered ancestor, numbered by a number or by letters and one."""

from __future__ import annotations

import pytest

from torchgraft.graft.layouts.conventions import numbered, unit_of


@pytest.mark.parametrize(("path", "unit"), [
    ("layer1.0.downsample.1", "layer1.0"),
    ("layer1.0.bn2", "layer1.0"),
    ("s1.b2.conv1.bn", "s1.b2.conv1"),  # timm's ConvNormAct inside block b2 of stage s1
    ("s1.b2.se.fc1", "s1.b2"),
    ("stages.0.blocks.3.conv_dw", "stages.0.blocks.3"),
    ("features.3", ""),  # a module of a top-level Sequential: the root unit
    ("conv_stem", ""),
])
def test_unit_of(path: str, unit: str) -> None:
    assert unit_of(path) == unit


@pytest.mark.parametrize(("part", "expected"), [
    ("3", True), ("b2", True), ("stage3", True), ("layer_1", True),
    ("conv", False), ("q_proj", False), ("3b", False), ("fc1x", False), ("", False),
])
def test_numbered(part: str, expected: bool) -> None:
    assert numbered(part) is expected
