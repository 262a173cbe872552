"""The HTML report: keys from a file shown as text, a policy that runs only the page's own
script, trees built and rendered without recursion, each hostile case with its control."""

from __future__ import annotations

import base64
import hashlib
import html
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.cli.test_report_output import _browser
from tests.helpers import assert_scales_linearly, calls
from torchgraft.graft.report.html import MAX_DEPTH, render_html

DEEP = ".".join(["part"] * 3000) + ".weight"  # a key of 3,000 dotted parts
HOSTILE = {
    DEEP: torch.zeros(1),
    "x.<script>document.title='pwned'</script>": torch.zeros(1),
    'y.a" onmouseover="document.title=1': torch.zeros(1),
    "z.\x1b[31mred\u202egnp.exe": torch.zeros(1),  # a terminal colour; right-to-left override
}


class _Page(HTMLParser):
    """Elements and text of a page, with the deepest nesting of <details>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.depth = self.deepest = 0
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in = tag
        if tag == "details":
            self.depth += 1
            self.deepest = max(self.deepest, self.depth)

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag == "details"
        self._in = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in == "script":
            self.scripts.append(data)
        elif self._in == "style":
            self.styles.append(data)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2))


def _page(tmp_path: Path, extra: dict[str, torch.Tensor]) -> tuple[Path, _Page]:
    model = _model()
    path = tmp_path / "ckpt.pt"
    torch.save({**model.state_dict(), **extra}, path)
    page = tg.graft(path, _model()).to_html(tmp_path / "report.html")
    parsed = _Page()
    parsed.feed(page.read_text())
    return page, parsed


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_hostile_keys_are_text_in_a_page_of_bounded_depth(tmp_path: Path) -> None:
    page, parsed = _page(tmp_path, HOSTILE)
    text = "".join(parsed.text)
    keys = {attrs.get("data-key") for _, attrs in parsed.tags}
    assert {k for k in HOSTILE if "\x1b" not in k} <= keys  # each key whole, as text
    assert "<script>document" in text  # a module's name, shown as text
    assert [t for t, _ in parsed.tags].count("script") == 1  # the page's own only
    assert not any(k.startswith("on") or k == "style" for _, attrs in parsed.tags for k in attrs)
    assert "\x1b" not in page.read_text() and "\u202e" not in page.read_text()
    assert "\\x1b[31mred\\u202egnp" in text  # written out, not obeyed
    assert parsed.deepest == MAX_DEPTH  # 3,000 parts: the deeper ones in one header


def test_the_policy_allows_the_pages_own_style_and_script_only(tmp_path: Path) -> None:
    _page_path, parsed = _page(tmp_path, {})
    policy = next(attrs["content"] for tag, attrs in parsed.tags
                  if tag == "meta" and attrs.get("http-equiv") == "Content-Security-Policy")
    assert policy is not None and "unsafe-inline" not in policy
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == f"'sha256-{_sha256(parsed.scripts[0])}'"
    assert directives["style-src"] == f"'sha256-{_sha256(parsed.styles[0])}'"


def test_plain_keys_make_the_same_tree_as_before(tmp_path: Path) -> None:  # the control
    page, parsed = _page(tmp_path, {"extra.head.weight": torch.zeros(1)})
    summaries = re.findall(r"<summary>(.*?) <span class=n>(\d+)</span>", page.read_text())
    assert ("extra", "1") in summaries and ("head", "1") in summaries and ("0", "2") in summaries
    assert parsed.deepest == 2


def test_rendering_is_linear_in_the_keys(tmp_path: Path) -> None:
    from torchgraft.graft.report.html import render_html

    def cost(count: int) -> int:
        keys = [f"encoder.layers.{i}.block.attention.query.weight" for i in range(count)]
        report = tg.GraftReport(loaded=keys, mapping=dict(zip(keys, keys, strict=True)),
                                matched_by=dict.fromkeys(keys, "exact"))
        return calls(lambda: render_html(report))

    assert_scales_linearly(cost, 2000)


@pytest.mark.slow
def test_the_cli_writes_the_page_of_a_key_of_3000_parts(tmp_path: Path) -> None:
    models = tmp_path / "tiny.py"
    models.write_text("import torch\nfrom torch import nn\n\n\ndef build():\n"
                      "    torch.manual_seed(0)\n    return nn.Sequential(nn.Linear(2, 2))\n")
    source = tmp_path / "ckpt.pt"
    torch.save({**_model().state_dict(), DEEP: torch.zeros(1)}, source)
    page = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "torchgraft", "graft", str(source), "--model",
                             f"{models}:build", "--dry-run", "--html", str(page)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "recursion" not in result.stdout + result.stderr and DEEP in page.read_text()


def test_in_a_browser_only_the_pages_own_script_runs(tmp_path: Path) -> None:
    """Headless Chromium: the page's script filters (``?q=``); a script slipped in does not run."""
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium)")
    page, _parsed = _page(tmp_path, HOSTILE)
    forged = tmp_path / "forged.html"  # as if a key had escaped: the policy still holds
    forged.write_text(page.read_text().replace(
        "</main>", "</main><script>document.title='pwned'</script>"
                   "<img src=x onerror=\"document.title='pwned'\">"))

    def dom(path: Path, query: str = "") -> str:
        result = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                                 "--dump-dom", path.as_uri() + query],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    shown = dom(page, "?q=script")
    rows = re.findall(r'<div class="t [^"]*"[^>]*>', shown)
    visible = [r for r in rows if " hidden" not in r]
    assert len(visible) == 1 and "script" in visible[0]  # its own script ran, and filtered
    title = re.search(r"<title>(.*?)</title>", page.read_text())
    assert title is not None and "pwned" not in title[1]
    assert f"<title>{title[1]}</title>" in shown
    assert f"<title>{title[1]}</title>" in dom(forged)  # neither forged one ran


def test_a_buffer_kept_as_the_model_computed_it_is_shown_as_initialised() -> None:
    """Never shown as loaded by exact name: the page says the model's code computed it."""

    class Scaled(nn.Module):
        def __init__(self, *, keep: bool) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)
            self.register_buffer("freq", torch.ones(2), persistent=keep)

    report = tg.graft(Scaled(keep=False), Scaled(keep=True))
    assert "freq" in report.initialised
    page = _Page()
    page.feed(render_html(report))
    kinds = [attrs.get("data-kind") for tag, attrs in page.tags if attrs.get("data-kind")]
    assert "initialised" in kinds and "computed by the model's code" in "".join(page.text)


def test_the_page_names_file_and_model_and_gives_a_command_to_copy(tmp_path: Path) -> None:
    """Title with the checkpoint and the model; modules, not keys, need a look; no mid-word
    breaks; the call that settles it. The control: an ok graft has nothing to copy."""
    backbone = nn.Sequential(nn.Linear(4, 4))
    torch.save(backbone.state_dict(), tmp_path / "backbone.pt")
    model = nn.Sequential(nn.Linear(4, 4))
    model.add_module("classifier_head", nn.Linear(4, 3))
    text = tg.graft(tmp_path / "backbone.pt", model).to_html(tmp_path / "r.html").read_text()
    path = str(tmp_path / "backbone.pt")
    assert f"<title>{html.escape(path)} into Sequential: incomplete - torchgraft</title>" in text
    assert f"<p class=sides id=sides>{html.escape(path)} into Sequential</p>" in text
    assert re.search(r'<li>missing: <a href="#t\d+">classifier_<wbr>head \(2 keys\)</a>', text)
    assert "break-all" not in text  # names break after a dot or an underscore only
    assert "<b>weight</b>" in text and "classifier_<wbr>head" in text
    command = html.escape(f"tg.graft({path!r}, model, new='classifier_head')")
    assert f"<pre class=command id=command>{command}</pre>" in text
    ok = tg.graft(tmp_path / "backbone.pt", nn.Sequential(nn.Linear(4, 4)))
    assert "id=command" not in ok.to_html(tmp_path / "ok.html").read_text()
