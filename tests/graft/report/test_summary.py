"""A graft's report in Python: one warning when not ok, a short ``str``, every key in
``details()``, a one-line ``repr``; report text that does not contradict itself. Each case with
its control."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.models import Scaled
from torchgraft.graft.report.summary import SHOWN


class _Pairs(nn.Module):
    """Blocks of two same-shape norms; the source names them ``p``/``r``, the model ``a``/``b``."""

    def __init__(self, blocks: int, names: tuple[str, str]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        for _ in range(blocks):
            block = nn.Module()
            for name in names:
                setattr(block, name, nn.LayerNorm(4))
            self.blocks.append(block)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "torchgraft" and r.levelno >= logging.WARNING]


def _warned(graft: Callable[[], tg.GraftReport]) -> tuple[tg.GraftReport, list[str]]:
    """The report of a graft and the TorchgraftWarnings it emitted (every one, not once)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = graft()
    return report, [str(w.message) for w in caught if w.category is tg.TorchgraftWarning]


def test_a_graft_not_ok_warns_once_an_ok_one_not(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="torchgraft")
    report, [message] = _warned(
        lambda: tg.graft(_Pairs(2, ("p", "r")).state_dict(), _Pairs(2, ("a", "b"))))
    assert report.verdict == "unverified" and not _warnings(caplog)  # a warning, not a log
    assert message.startswith("graft UNVERIFIED: 8 loaded") and "8 guessed" in message
    assert "  guess     blocks.0.a (2 keys)" in message  # what needs a look, as print shows
    assert "source_model=" in message and "report.details()" in message  # how to settle
    missing, [message] = _warned(
        lambda: tg.graft({"0.weight": torch.zeros(2, 2)}, nn.Sequential(nn.Linear(2, 2))))
    assert missing.verdict == "incomplete" and "  missing   0.bias  " in message
    assert "new=" in message  # a part new on purpose is declared so
    ok, said = _warned(lambda: tg.graft(_Pairs(2, ("a", "b")).state_dict(),
                                        _Pairs(2, ("a", "b"))))
    assert ok.ok and not said  # the control: nothing to say


def test_str_is_a_summary_one_line_per_module_details_every_key() -> None:
    report = tg.graft(_Pairs(12, ("p", "r")).state_dict(), _Pairs(12, ("a", "b")))
    assert len(report.guesses) == 48  # 24 modules of 2 keys
    text = str(report).splitlines()
    guessed = [line for line in text if line.split()[:1] == ["guess"]]
    assert len(guessed) == SHOWN + 1 and guessed[-1].split()[1:] == ["...", "19", "more",
                                                                    "modules"]
    assert "blocks.0.a (2 keys)  <- blocks.0.p" in guessed[0]  # a module, not a tensor
    assert text[-1].endswith("report.details() lists every key") and len(text) < 15
    details = report.details()
    assert all(f"  guess     {key}  <- " in details for key in report.guesses)
    assert repr(report) == "GraftReport(verdict='unverified', loaded=48, renamed=48, guessed=48)"
    small = tg.graft(_Pairs(1, ("p", "r")).state_dict(), _Pairs(1, ("a", "b")))
    assert "guess     ..." not in str(small)  # the control: two modules, none left out


def test_a_diverged_report_does_not_ask_for_inputs_to_compare() -> None:
    inputs = (torch.randn(2, 4),)
    diverged = tg.graft(Scaled(scale=1.0), Scaled(scale=3.0), example_inputs=inputs, verify=True)
    assert diverged.verdict == "diverged"
    settle = diverged.settle()
    assert settle.startswith("outputs were compared and differ") and "inputs" not in settle
    assert "so outputs are compared" not in str(diverged) + diverged.details()
    guessed = tg.graft(_Pairs(1, ("p", "r")).state_dict(), _Pairs(1, ("a", "b")))
    assert "source_model=" in guessed.settle()  # the control: unverified, outputs not compared


class _Llama(nn.Module):
    """Llama's names (a rotary family): q, o and a gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        layer = nn.Module()
        layer.self_attn, layer.mlp = nn.Module(), nn.Module()
        layer.self_attn.q_proj, layer.self_attn.o_proj = nn.Linear(4, 8), nn.Linear(8, 4)
        layer.mlp.gate_proj = nn.Linear(4, 6)
        self.model.layers = nn.ModuleList([layer])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.model.layers[0]
        return layer.self_attn.o_proj(layer.self_attn.q_proj(x)), layer.mlp.gate_proj(x)


class _Custom(nn.Module):
    """The same computation under names no naming family lists."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Module()
        block.attn, block.ff = nn.Module(), nn.Module()
        block.attn.query, block.attn.out = nn.Linear(4, 8), nn.Linear(8, 4)
        block.ff.gate = nn.Linear(4, 6)
        self.blocks = nn.ModuleList([block])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        block = self.blocks[0]
        return block.attn.out(block.attn.query(x)), block.ff.gate(x)


def test_outputs_compared_equal_drop_the_rotary_caution() -> None:
    source = _Llama().eval()
    unverified = tg.graft(source, _Custom(), verify=False)
    assert any("rotary (RoPE) order" in w for w in unverified.warnings)  # the control
    compared = tg.graft(source, _Custom(), example_inputs=(torch.randn(2, 4),), verify=True)
    assert compared.ok and compared.max_abs_diff == 0.0
    assert not any("rotary" in w for w in compared.warnings), compared.warnings
    assert "check the outputs" not in str(compared)
