"""What graft and diff print, at 80 columns, by default, with --details and --quiet; --html."""

from __future__ import annotations

import contextlib
import html
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from torchgraft.cli.words import cli_words

MODELS = '''
from torch import nn
def long_names(blocks=12, classes=7):
    model = nn.Module()
    model.encoder = nn.ModuleDict({
        f"transformer_block_number_{i}": nn.ModuleDict({
            "self_attention_query_projection": nn.Linear(8, 8),
            "feed_forward_intermediate_dense": nn.Linear(8, 16),
        }) for i in range(blocks)})
    model.classification_head_projection = nn.Linear(8, classes)
    return model
'''


def _run(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchgraft", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": str(columns)})


def _library_graft(models: Path, ckpt: Path) -> tg.GraftReport:
    """The library's report of the graft the CLI runs."""
    sys.path.insert(0, str(models.parent))
    try:
        import longmodels

        return tg.graft(ckpt, longmodels.long_names())
    finally:
        sys.path.remove(str(models.parent))
        sys.modules.pop("longmodels", None)


def _breakable(line: str) -> bool:
    """Whether a line too long for 80 columns could have been wrapped (no word fills a line)."""
    return max(len(word) for word in line.split()) < 80 - 12 - 3


def _row(lines: list[str], start: int) -> str:
    """A printed row with the lines it continues on (indented under its key), joined."""
    end = start + 1
    while end < len(lines) and lines[end].startswith(" " * 12):
        end += 1
    return " ".join(" ".join(lines[start:end]).split())


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "longmodels.py").write_text(MODELS)
    sys.path.insert(0, str(tmp_path))
    try:
        import longmodels  # type: ignore[import-not-found]

        trained = longmodels.long_names(classes=5)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("longmodels", None)
    wrapper = nn.Module()
    wrapper.model = trained
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"state_dict": wrapper.state_dict()}, ckpt)
    return tmp_path / "longmodels.py", ckpt


@pytest.mark.slow
def test_default_output_summarises_renames_and_fits_80_columns(
        tmp_path: Path, setup: tuple[Path, Path]) -> None:
    models, ckpt = setup
    result = _run("graft", str(ckpt), "--model", f"{models}:long_names", "--out",
                  str(tmp_path / "out.pt"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_long = [line for line in lines if len(line) > 80 and _breakable(line)]
    assert not too_long  # only a key longer than a line stands alone, whole
    assert lines[0] == "graft ok: 48 loaded, 48 renamed, 2 reinitialised, 2 unused"
    renamed = [_row(lines, i) for i, line in enumerate(lines)
               if line.split()[:1] == ["wrapper"]]  # 'model.' removed
    assert len(renamed) == 1 and "48 keys" in renamed[0]
    assert lines[-2].split() == ["details", "--details", "lists", "every", "key"]
    reinit = [i for i, line in enumerate(lines) if line.split()[:1] == ["reinit"]]
    assert len(reinit) == 1  # one row per module: its weight's reason
    assert "classification_head_projection (2 keys)" in lines[reinit[0]]
    # piped output is wrapped, never cut: the whole reason, continued under the key
    report = _library_graft(models, ckpt)
    reason = cli_words(report.reinitialised["classification_head_projection.weight"])
    row = _row(lines, reinit[0])
    assert row.endswith(" ".join(reason.split()))


def test_rows_are_cut_only_on_a_terminal() -> None:
    from rich.console import Console

    from torchgraft.cli.render import print_rows

    rows = [("missing", "encoder." + "very_long_module_name." * 2 + "weight",
             "a reason long enough to need more than one line at eighty columns: " * 3)]
    for terminal, full in ((True, False), (True, True), (False, False)):
        console = Console(width=80, force_terminal=terminal, no_color=True, record=True)
        print_rows(console, rows, full=full)
        text = console.export_text()
        assert all(len(line) <= 80 for line in text.splitlines())
        if terminal and not full:
            assert len(text.splitlines()) == 1 and "..." in text
        else:
            assert " ".join(text.split()) == " ".join(f"missing {rows[0][1]} {rows[0][2]}".split())


def test_piped_rows_never_wrap_a_number_away_from_its_word() -> None:
    import textwrap

    from rich.console import Console

    from torchgraft.cli.render import print_rows

    note = ("outputs were not compared: --source-model could not be filled from the "
            "checkpoint by name (graft UNVERIFIED: 12 loaded, 12 renamed, 10 guessed)")
    # the control: a plain word wrap at this width leaves "10" at the end of a line
    assert textwrap.wrap(note, width=68)[1].endswith(" 10")
    console = Console(width=80, force_terminal=False, no_color=True, record=True)
    print_rows(console, [("warning", "", note)])
    lines = console.export_text().splitlines()
    assert len(lines) > 1 and not any(re.search(r"\d$", line) for line in lines), lines
    assert " ".join(" ".join(lines).split()) == f"warning {note}"


@pytest.mark.slow
def test_details_lists_every_key_and_quiet_only_the_verdict(
        tmp_path: Path, setup: tuple[Path, Path]) -> None:
    models, ckpt = setup
    base = ["graft", str(ckpt), "--model", f"{models}:long_names", "--overwrite"]
    details = _run(*base, "--out", str(tmp_path / "a.pt"), "--details")
    rows = [line for line in details.stdout.splitlines() if line.split()[:1] == ["wrapper"]]
    assert len(rows) == 48
    assert not [line for line in details.stdout.splitlines()
                if len(line) > 80 and _breakable(line)]
    assert "..." not in details.stdout.replace("--label-map ...", "")  # every key whole
    quiet = _run(*base, "--out", str(tmp_path / "b.pt"), "--quiet")
    assert quiet.returncode == 0 and len(quiet.stdout.splitlines()) == 1
    assert quiet.stderr == ""


@pytest.mark.slow
def test_cli_and_library_say_the_same(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    models, ckpt = setup
    result = _run("graft", str(ckpt), "--model", f"{models}:long_names", "--out",
                  str(tmp_path / "c.pt"), columns=200)
    report = _library_graft(models, ckpt)
    assert result.stdout.splitlines()[0] == report.headline() == str(report).splitlines()[0]


@pytest.mark.slow
def test_diff_lists_ten_of_each_kind_unless_details(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({f"layer.{i}.weight": torch.ones(2) for i in range(25)}, a)
    torch.save({f"layer.{i}.weight": torch.ones(2) * 2 for i in range(25)}, b)
    short = _run("diff", str(a), str(b))
    assert short.returncode == 1
    assert short.stdout.splitlines()[0] == "differ: 0 equal, 25 with other values"
    assert "... 15 more" in short.stdout and len(short.stdout.splitlines()) == 12
    full = _run("diff", str(a), str(b), "--details")
    assert len(full.stdout.splitlines()) == 26
    assert len(_run("diff", str(a), str(b), "-q").stdout.splitlines()) == 1


@pytest.mark.slow
def test_html_report_written_by_the_cli(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    models, ckpt = setup
    page = tmp_path / "report.html"
    result = _run("graft", str(ckpt), "--model", f"{models}:long_names", "--out",
                  str(tmp_path / "d.pt"), "--html", str(page))
    assert result.returncode == 0 and "report page" in result.stdout
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    assert text.count('class="t kind-wrapper"') == 2 * 48  # both sides of each renamed tensor
    assert text.count('class="t kind-reinitialised look"') == 2  # a new head needs a look
    assert text.count('class="t kind-unused"') == 2  # the old head's rows, not loaded


def _browser() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                         "google-chrome")) if p), None)


def test_html_report_in_a_real_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Headless Chromium opens the page of the README's graft: DOM, search and a screenshot.

    ``TORCHGRAFT_SCREENSHOT=docs/images/graft-report.png`` regenerates the README's picture.
    """
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium)")
    from tests.test_readme import python_blocks, shown_output

    first = python_blocks()[0]  # it builds its own model and writes its own file
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(first, "README.md:python block 1", "exec"), namespace)
    report = namespace["report"]
    assert isinstance(report, tg.GraftReport)
    page = report.to_html(tmp_path / "report.html")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1400,1000"]

    def dom(query: str = "") -> str:
        result = subprocess.run([*flags, "--dump-dom", page.as_uri() + query],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    shown = dom()
    headline = re.search(r"<h1>(.*?)</h1>", shown)
    assert headline is not None
    assert re.sub(r"<[^>]+>", "", headline[1]) == (shown_output(first) or [""])[0]
    assert "trained.pt into Sequential" in shown  # the page names the file and the model
    assert "model: 9 tensors" in shown and 'id="search"' in shown
    assert "outputs not compared" in shown
    assert 'data-kind="adapted"' in shown and 'data-kind="reinitialised"' in shown
    assert "(32, 4, 3, 3) float32" in shown and "(32, 3, 3, 3) float32" in shown  # both sides
    reason = html.escape(report.reinitialised["fc.weight"], quote=False)
    assert f"<div class=\"why\">{reason}</div>" in shown  # visible, not only on hover
    assert '<span class="e">name</span>' in shown  # each key's evidence
    assert "new=&#x27;fc&#x27;" in shown or "new='fc'" in shown  # the call to copy
    searched = dom("?q=conv.weight")
    rows = re.findall(r'<div class="t [^"]*"[^>]*>', searched)
    visible = [r for r in rows if " hidden" not in r]
    assert len(rows) == 18 and len(visible) == 2
    assert all("conv.weight" in r for r in visible)
    shot = Path(os.environ.get("TORCHGRAFT_SCREENSHOT", tmp_path / "report.png")).absolute()
    taken = subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()],
                           capture_output=True, text=True, timeout=120)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
