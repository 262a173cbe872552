"""The HTML report in headless Chromium: what needs a look first and open, the rest collapsed;
a filter per kind and per evidence (guess included) in the words the tags use; a search that
hides the modules it leaves empty. Each with its control."""

from __future__ import annotations

import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.cli.test_report_output import _browser
from tests.models import Scaled


class _Dom(HTMLParser):
    """The rows, module headers and filters of a page as Chromium left it."""

    def __init__(self) -> None:
        super().__init__()
        self.modules: list[dict[str, str | None]] = []  # each <details>, "name" its path
        self.rows: list[dict[str, str | None]] = []  # each row's attributes
        self.tags: dict[str, list[str]] = {"k": [], "e": []}
        self.labels: list[str] = []
        self._open: list[dict[str, str | None]] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "details":
            self.modules.append(found)
            self._open.append(found)
        elif tag == "summary":
            self._in = "summary"
        elif tag == "div" and "t" in (found.get("class") or "").split():
            self.rows.append(found)
        elif tag == "span" and found.get("class") in self.tags:
            self._in = found["class"]
        elif tag == "input" and found.get("type") == "checkbox":
            self.labels.append(found["value"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self._open.pop()
        self._in = None if tag in ("summary", "span") else self._in

    def handle_data(self, data: str) -> None:
        if self._in == "summary" and "name" not in self._open[-1]:
            self._open[-1]["name"] = ".".join(
                [*(str(m["name"]) for m in self._open[:-1]), data.strip()])
        elif self._in in self.tags:
            self.tags[self._in].append(data)

    def module(self, name: str, side: int = 0) -> dict[str, str | None]:
        """The header of a module by its path, on the model's side (0) or the checkpoint's."""
        return [m for m in self.modules if m.get("name") == name][side]

    def shown(self) -> list[str]:
        """The keys of the rows not hidden, both sides."""
        return [str(row["data-key"]) for row in self.rows if row.get("hidden") is None]


def _nets() -> tuple[nn.Module, nn.Module]:
    source = nn.Module()
    source.enc = nn.Module()
    source.enc.p, source.enc.r = nn.LayerNorm(4), nn.LayerNorm(4)  # nothing relates the names
    source.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    target = nn.Module()
    target.enc = nn.Module()
    target.enc.a, target.enc.b = nn.LayerNorm(4), nn.LayerNorm(4)
    target.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    target.extra = nn.Linear(3, 3)  # the checkpoint has nothing for it
    return source, target


def _dom(browser: str, page: Path, query: str = "") -> _Dom:
    result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                             "--dump-dom", page.as_uri() + query],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = _Dom()
    parsed.feed(result.stdout)
    return parsed


@pytest.fixture
def browser() -> str:
    found = _browser()
    if found is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium)")
    return found


@pytest.fixture
def page(tmp_path: Path) -> Path:
    source, target = _nets()
    torch.save(source.state_dict(), tmp_path / "s.pt")
    report = tg.graft(tmp_path / "s.pt", target)
    assert report.guesses and report.missing == ["extra.weight", "extra.bias"]
    return report.to_html(tmp_path / "report.html")


def test_what_needs_a_look_is_open_and_listed_first_the_rest_collapsed(
        browser: str, page: Path) -> None:
    dom = _dom(browser, page)
    assert "open" in dom.module("extra") and "open" in dom.module("enc")  # missing, guesses
    assert "open" not in dom.module("body")  # plainly loaded: collapsed (the control)
    assert "open" in dom.module("enc", side=1) and "open" not in dom.module("body", side=1)
    text = page.read_text()
    listed = re.findall(r'<li>(\w+): <a href="#t\d+">(.+?)</a></li>', text)
    assert {why for why, _ in listed} == {"missing", "guess"}
    # one line per module, not per key: a module's name and how many of its keys
    assert {name.replace("<wbr>", "") for _, name in listed} == {
        "extra (2 keys)", "enc.a (2 keys)", "enc.b (2 keys)"}
    assert "needs a look: 6 keys in 3 modules" in text
    assert text.index("needs a look") < text.index("id=filters")  # before the trees
    assert not any(m.get("hidden") is not None for m in dom.modules)  # nothing searched


def test_filter_labels_are_the_words_of_the_tags_guess_included(browser: str,
                                                                page: Path) -> None:
    dom = _dom(browser, page)
    labels = {label.partition("-")[0]: set() for label in dom.labels}
    for label in dom.labels:
        group, _, word = label.partition("-")
        labels[group].add(word)
    assert "guess" in labels["evidence"] and "missing" in labels["kind"]
    assert labels["kind"] == set(dom.tags["k"]) and labels["evidence"] == set(dom.tags["e"])
    guessed = [row for row in dom.rows if str(row["data-key"]).startswith("enc.")]
    assert guessed and all(row["data-evidence"] == "guess" for row in guessed)


def test_a_search_hides_the_modules_it_leaves_empty_and_opens_the_rest(
        browser: str, page: Path) -> None:
    dom = _dom(browser, page, "?q=body.1")
    assert dom.shown() == ["body.1.weight", "body.1.bias"] * 2  # the model's, the checkpoint's
    for side in (0, 1):
        assert dom.module("enc", side).get("hidden") is not None
        assert dom.module("body.0", side).get("hidden") is not None
        assert dom.module("body", side).get("hidden") is None
        assert "open" in dom.module("body", side)  # collapsed until a key in it is searched
    assert dom.module("extra").get("hidden") is not None
    everything = _dom(browser, page, "?q=.")  # the control: every key matches, nothing hides
    assert not any(m.get("hidden") is not None for m in everything.modules)


def _unchecking(page: Path, value: str) -> Path:
    """A copy of the page that unchecks one filter as a user would (a test script of its own)."""
    clicked = page.with_name(f"{value}.html")
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    clicked.write_text(text.replace("</body>", (
        "<script>var box = document.querySelector('input[value=\"" + value + "\"]');"
        "box.checked = false; box.dispatchEvent(new Event('change'));</script></body>")))
    return clicked


def test_the_guess_filter_hides_guessed_keys_and_their_emptied_modules(
        browser: str, page: Path) -> None:
    dom = _dom(browser, _unchecking(page, "evidence-guess"))
    for row in dom.rows:
        assert (row.get("hidden") is not None) == (row["data-evidence"] == "guess"), row
    assert dom.module("enc").get("hidden") is not None  # only guesses in it
    assert dom.module("body").get("hidden") is None and dom.module("extra").get("hidden") is None
    named = _dom(browser, _unchecking(page, "evidence-name"))  # the control: guesses stay
    assert all(row.get("hidden") is None for row in named.rows
               if str(row["data-key"]).startswith("enc."))
    assert named.module("enc").get("hidden") is None


def test_a_diverged_module_is_open_and_listed(tmp_path: Path) -> None:
    source, target = Scaled(scale=1.0), Scaled(scale=3.0)
    report = tg.graft(source, target, example_inputs=(torch.randn(2, 4),), verify=True)
    assert report.diverged_at == "second" and report.divergence is not None
    text = report.to_html(tmp_path / "report.html").read_text()
    assert re.search(r'<li>diverged: <a href="#t\d+">second \(2 keys\)</a></li>', text)
    assert "<details open><summary>second " in text
    assert "<details><summary>first " in text  # it computes what its source does: collapsed
    agreeing = tg.graft(source, Scaled(scale=1.0), example_inputs=(torch.randn(2, 4),),
                        verify=True)  # the control
    assert agreeing.ok and agreeing.diverged_at is None
    assert "needs a look" not in agreeing.to_html(tmp_path / "ok.html").read_text()
