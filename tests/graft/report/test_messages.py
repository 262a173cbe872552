"""Messages that do not mislead: counts that add up, counters never among guesses, the meta
device's init warning only where a row is new. Each case with its control."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg

_META_WARNING = "the model is on the meta device"


class _Norms(nn.Module):
    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        for name in names:
            setattr(self, name, nn.BatchNorm2d(4))


def test_bookkeeping_counters_are_never_guesses() -> None:
    source = nn.Sequential(_Norms(("norm_a", "norm_b")))
    report = tg.graft(source.state_dict(), nn.Sequential(_Norms(("pre", "post"))))
    assert report.verdict == "unverified"
    assert not [k for k in report.guesses if k.endswith("num_batches_tracked")]
    assert len(report.guesses) == report.counts()["guessed"] == 8  # weight, bias, mean, var x2
    assert "8 guessed" in report.headline()
    # the control: the same module's statistics are guesses, and each names its own twin
    assert report.guesses["0.pre.running_mean"].alternatives[0].endswith(".running_mean")
    assert all(key.rpartition(".")[2] == alt.rpartition(".")[2]
               for key, guess in report.guesses.items() for alt in guess.alternatives)


def _layers(count: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(4, 4) for _ in range(count)))


def test_headline_counts_add_up_with_the_summary(tmp_path: Path) -> None:
    save_file(_layers(2).state_dict(), tmp_path / "two.safetensors")
    with torch.device("meta"):
        model = _layers(4)  # layers 2 and 3 missing, computed by the model's code
    report = tg.graft(tmp_path / "two.safetensors", model)
    counts = report.counts()
    assert counts["missing"] == 4 and len(report.initialised) == 4  # computed, still missing
    assert counts["initialised"] == 0 and "initialised" not in report.headline()
    assert "  init " not in str(report)  # the summary lists them as missing, as counted
    # the control: what the model's code computes and nothing lacks counts as initialised
    with torch.device("meta"):
        llama_like = _Rotary()
    save_file({"proj.weight": torch.ones(4, 4)}, tmp_path / "proj.safetensors")
    computed = tg.graft(tmp_path / "proj.safetensors", llama_like)
    assert computed.counts()["initialised"] == len(computed.initialised) == 1
    assert "1 initialised" in computed.headline()
    assert "  init      1 key  e.g. inv_freq" in str(computed)


class _Rotary(nn.Module):
    """A projection and a non-persistent buffer its code computes (as a rotary embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, bias=False)
        self.register_buffer("inv_freq", torch.arange(2.0), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.inv_freq = torch.arange(2.0, device=self.inv_freq.device)


def test_the_meta_init_warning_only_where_some_row_is_new(tmp_path: Path) -> None:
    save_file(_layers(2).state_dict(), tmp_path / "same.safetensors")
    with torch.device("meta"):
        same = _layers(2)
    copied = tg.graft(tmp_path / "same.safetensors", same)
    assert copied.ok and not [w for w in copied.warnings if _META_WARNING in w]
    # the control: a head whose rows differ takes init='normal' on meta: said
    save_file(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 10)).state_dict(),
              tmp_path / "ten.safetensors")
    with torch.device("meta"):
        headed = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3))
    report = tg.graft(tmp_path / "ten.safetensors", headed)
    assert report.reinitialised and [w for w in report.warnings if _META_WARNING in w]
