"""Lists in messages: a few items, then how many more."""

from __future__ import annotations

from pathlib import Path

from torchgraft.text import few, quoted


def test_few_shows_the_first_items_then_counts_the_rest() -> None:
    assert few(["a", "b", "c", "d", "e"], show=quoted) == "'a', 'b', 'c' and 2 more"
    assert few(list(range(7)), 5) == "0, 1, 2, 3, 4 and 2 more"
    assert few([Path("x/model.bin")], show=lambda path: path.name) == "model.bin"


def test_few_counts_nothing_more_when_all_are_shown() -> None:
    assert few(["a", "b", "c"], show=quoted) == "'a', 'b', 'c'"
    assert few([]) == ""


def test_few_writes_out_only_the_items_it_shows() -> None:
    written: list[int] = []

    def show(item: int) -> str:
        written.append(item)
        return str(item)

    few(range(100_000), show=show)
    assert written == [0, 1, 2]
