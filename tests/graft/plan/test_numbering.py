"""Lists numbered the other way, and children defined in another order than they run.

A decoder whose levels are numbered in the order they run, grafted from one numbered after the
encoder's levels it mirrors (latent diffusion's ``up.0`` runs last), whose mid-block its code
defines after its levels: shapes pair the level only one level fits and turn the list; levels of
one shape follow, as guesses, since no shape confirms them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from torchgraft.graft.evidence import Evidence, Verdict
from torchgraft.graft.plan.hierarchy import aligned_subtrees, sibling_order
from torchgraft.graft.plan.numbering import containers, turned, turned_order


class Level(nn.Module):
    def __init__(self, width_in: int, width: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(2, width_in)
        self.conv = nn.Conv2d(width_in, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.relu(self.norm(x)))


class InRunOrder(nn.Module):
    """Levels numbered as they run; its mid-block defined after them, run before."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.levels = nn.ModuleList([Level(8, 8), Level(8, 8), Level(8, 4)])
        self.mid = nn.Sequential(nn.Conv2d(8, 8, 1), nn.GroupNorm(2, 8))
        self.conv_out = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mid(self.conv_in(x))
        for level in self.levels:
            x = level(x)
        return self.conv_out(x)


class NumberedBack(nn.Module):
    """The same computation, its levels numbered the other way (``up.0`` runs last)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.middle = nn.Sequential(nn.Conv2d(8, 8, 1), nn.GroupNorm(2, 8))
        self.up = nn.ModuleList([Level(8, 4), Level(8, 8), Level(8, 8)])
        self.conv_out = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.middle(self.conv_in(x))
        for level in reversed(self.up):
            x = level(x)
        return self.conv_out(x)


def _trained(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.copy_(torch.randn_like(tensor))
    return model.eval()


IMAGES = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _equal(a: nn.Module, b: nn.Module) -> bool:
    with torch.no_grad():
        return torch.allclose(a(IMAGES), b(IMAGES), atol=1e-5)


@pytest.fixture(params=["pt", "safetensors"])
def saved(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[nn.Module, Path]:
    source = _trained(NumberedBack())
    path = tmp_path / f"back.{request.param}"
    if request.param == "pt":
        torch.save(source.state_dict(), path)
    else:
        save_file(source.state_dict(), path)
    return source, path


def test_a_list_numbered_the_other_way_fills_right_its_like_levels_guessed(
        saved: tuple[nn.Module, Path]) -> None:
    source, path = saved
    model = InRunOrder().eval()
    report = tg.graft(path, model)
    assert report.verdict is Verdict.UNVERIFIED, report
    assert report.mapping["levels.2.conv.weight"] == "up.0.conv.weight"  # its shape says so
    assert report.evidence["levels.2.conv.weight"] is Evidence.STRUCTURE
    assert report.mapping["levels.0.conv.weight"] == "up.2.conv.weight"  # the turn says so
    assert report.evidence["levels.0.conv.weight"] is Evidence.GUESS
    assert "up.1.conv.weight" in report.guesses["levels.0.conv.weight"].alternatives
    assert "numbers these levels the other way" in report.guesses["levels.0.conv.weight"].why
    assert report.mapping["mid.0.weight"] == "middle.0.weight"
    assert _equal(source, model)


def test_the_source_code_settles_the_guessed_levels(saved: tuple[nn.Module, Path]) -> None:
    source, path = saved
    model = InRunOrder().eval()
    report = tg.graft(path, model, source_model=NumberedBack, example_inputs=(IMAGES,))
    assert report.verdict is Verdict.OK, report
    assert _equal(source, model)


def test_like_levels_exchanged_in_the_file_are_never_ok(tmp_path: Path) -> None:
    """The broken twin: the two like levels' values exchanged in the file. It cannot tell:
    a guess, never ok, and the outputs are not the source's."""
    source = _trained(NumberedBack())
    state = source.state_dict()
    exchanged = {key.replace("up.1.", "up.#.").replace("up.2.", "up.1.").replace("up.#.", "up.2.")
                 : value for key, value in state.items()}
    torch.save(exchanged, tmp_path / "exchanged.pt")
    model = InRunOrder().eval()
    report = tg.graft(tmp_path / "exchanged.pt", model)
    assert report.verdict is Verdict.UNVERIFIED, report
    assert not _equal(source, model)


def test_the_same_list_in_run_order_is_structure(tmp_path: Path) -> None:
    """The control: a list numbered alike on both sides pairs in order, by structure."""
    source = _trained(InRunOrder())
    renamed = {key.replace("levels.", "stages.").replace("mid.", "middle."): value
               for key, value in source.state_dict().items()}
    torch.save(renamed, tmp_path / "alike.pt")
    model = InRunOrder().eval()
    report = tg.graft(tmp_path / "alike.pt", model)
    assert report.mapping["levels.0.conv.weight"] == "stages.0.conv.weight"
    assert report.evidence["levels.0.conv.weight"] is Evidence.STRUCTURE
    assert _equal(source, model)


# the pure parts, on module paths -----------------------------------------------------------

TARGET = ["conv_in", "mid.0", "levels.0.norm", "levels.0.conv", "levels.1.norm", "levels.1.conv",
          "levels.2.norm", "levels.2.conv", "conv_out"]
SOURCE = ["conv_in", "up.0.norm", "up.0.conv", "up.1.norm", "up.1.conv", "up.2.norm",
          "up.2.conv", "middle.0", "conv_out"]
#: Each path's shape class: level 2 of the target (0 of the source) is the narrow one.
SHAPES = {"conv_in": 0, "mid.0": 1, "middle.0": 1, "norm": 2, "conv": 3, "narrow norm": 4,
          "narrow conv": 5, "conv_out": 6}


def _classes(paths: list[str], narrow: str) -> list[int]:
    return [SHAPES[p] if p in SHAPES else
            SHAPES[("narrow " if p.startswith(narrow) else "") + p.rpartition(".")[2]]
            for p in paths]


def _whole(rows: list[int], cols: list[int]) -> bool:
    a, b = _classes(TARGET, "levels.2"), _classes(SOURCE, "up.0")
    return sorted(a[i] for i in rows) == sorted(b[j] for j in cols)


def test_containers_are_module_lists_in_the_order_they_come() -> None:
    found = containers(SOURCE)
    assert list(found) == ["up"]
    assert [level.path for level in found["up"]] == ["up.0", "up.1", "up.2"]
    assert containers(["a.0.x", "a.2.x"]) == {}  # not numbered 0 to n - 1


def test_a_turn_is_found_by_the_level_only_one_shape_fits() -> None:
    [turn] = turned(TARGET, SOURCE, (_classes(TARGET, "levels.2"), _classes(SOURCE, "up.0")),
                    _whole)
    assert (turn.source, turn.target, turn.size, turn.forced) == ("up", "levels", 3,
                                                                  frozenset({2}))
    order = turned_order(SOURCE, [turn])
    assert [SOURCE[k] for k in order][1:7] == ["up.2.norm", "up.2.conv", "up.1.norm",
                                               "up.1.conv", "up.0.norm", "up.0.conv"]


def test_no_turn_where_the_levels_fit_in_order_or_all_alike() -> None:
    same = [p.replace("levels.", "up.") for p in TARGET]
    assert turned(TARGET, same, (_classes(TARGET, "levels.2"), _classes(same, "up.2")),
                  lambda rows, cols: sorted(_classes(TARGET, "levels.2")[i] for i in rows)
                  == sorted(_classes(same, "up.2")[j] for j in cols)) == []


def test_children_take_the_order_their_shapes_pair_them_in() -> None:
    order = sibling_order(TARGET, SOURCE, _whole)
    assert [SOURCE[k] for k in order][:2] == ["conv_in", "middle.0"]


def test_modules_holding_each_other_pair_from_the_root_down() -> None:
    pairs = aligned_subtrees(TARGET, SOURCE, _whole)
    named = {(tuple(TARGET[i] for i in rows), tuple(SOURCE[j] for j in cols))
             for rows, cols in pairs}
    assert (("levels.2.norm", "levels.2.conv"), ("up.0.norm", "up.0.conv")) in named
    assert (("mid.0",), ("middle.0",)) in named


def _experts(layers: int) -> list[str]:
    return [f"layers.{i}.{part}" for i in range(layers)
            for part in (*(f"experts.{e}.{w}" for e in range(16) for w in ("up", "down")),
                         "norm")]


def test_comparing_modules_costs_in_proportion_to_the_model() -> None:
    """Counted, not timed: twice the layers, at most about twice the comparisons (many alike
    parents are not each compared with each)."""
    calls: list[int] = []

    def whole(rows: list[int], cols: list[int]) -> bool:
        calls.append(1)
        return len(rows) == len(cols)

    counts = []
    for layers in (8, 16, 32):
        calls.clear()
        paths = _experts(layers)
        sibling_order(paths, paths, whole)
        aligned_subtrees(paths, paths, whole)
        counts.append(len(calls))
    assert counts[1] <= 2.2 * counts[0] and counts[2] <= 2.2 * counts[1], counts
