"""tg.graft end to end: the seed scenarios, adaptations, rules, structure, strictness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import SmallNet, assert_same_state, data_parallel_state, save_on, small_net
from tests.models import ResNet18, pretrained_resnet18


def test_dataparallel_checkpoint_saved_on_cuda1_into_bare_model(tmp_path: Path) -> None:
    trained = small_net(1).eval()
    path = tmp_path / "dp.pth"
    save_on("cuda:1", {"epoch": 3, "state_dict": data_parallel_state(trained)}, path)
    model = SmallNet().eval()
    report = tg.graft(path, model)
    assert report.ok and not report.unused
    assert set(report.matched_by.values()) == {"wrapper"}
    assert report.mapping["conv.weight"] == "module.conv.weight"
    assert_same_state(model.state_dict(), trained.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(model(x), trained(x))


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["dataparallel", "compile", "both"])
def test_bare_checkpoint_into_wrapped_model(tmp_path: Path, wrap: str) -> None:
    trained = small_net(2)
    path = tmp_path / "bare.pt"
    torch.save(trained.state_dict(), path)
    inner = SmallNet()
    model: nn.Module = {"dataparallel": nn.DataParallel(inner), "compile": torch.compile(inner),
                        "both": nn.DataParallel(torch.compile(inner))}[wrap]
    report = tg.graft(path, model)
    assert report.ok and set(report.matched_by.values()) == {"exact"}
    assert_same_state(inner.state_dict(), trained.state_dict())


@pytest.mark.slow
def test_pretrained_into_4_channel_21_class_variant(tmp_path: Path) -> None:
    pretrained = pretrained_resnet18()
    path = tmp_path / "resnet18.pth"
    torch.save(pretrained.state_dict(), path)
    variant = ResNet18(num_classes=21, in_chans=4).eval()
    fresh_head = variant.fc.weight.detach().clone()
    report = tg.graft(path, variant)
    assert report.ok and not report.clean
    assert report.adapted == {
        "conv1.weight": "in_channels 3->4: 3 kept, 1 new = the mean of the pretrained channels"}
    assert set(report.reinitialised) == {"fc.weight", "fc.bias"}
    assert "1000 rows ('fc.weight'), the model 21: a new head" in report.reinitialised["fc.weight"]
    assert set(report.unused) == {"fc.weight", "fc.bias"}
    assert torch.equal(variant.fc.weight, fresh_head)  # init="keep": the model's own head
    assert torch.equal(variant.conv1.weight[:, 3], pretrained.conv1.weight.mean(1))
    with pytest.raises(tg.GraftError, match="'fc.weight' re-initialised"):
        tg.graft(path, ResNet18(num_classes=21, in_chans=4), strict=True)

    kept = ResNet18(num_classes=21, in_chans=4).eval()
    report = tg.graft(path, kept, label_map=list(range(21)))
    assert report.clean
    assert report.adapted["fc.weight"] == "rows 1000->21: 21 kept chosen by label_map"
    rgb = torch.randn(2, 3, 64, 64)
    rgbd = torch.cat([rgb, torch.zeros(2, 1, 64, 64)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(kept(rgbd), pretrained(rgb)[:, :21], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fewer_input_channels_fold_by_sum(tmp_path: Path) -> None:
    pretrained = pretrained_resnet18()
    grey = ResNet18(num_classes=1000, in_chans=1).eval()
    report = tg.graft(pretrained.state_dict(), grey)
    assert "folded" in report.adapted["conv1.weight"]
    x = torch.randn(1, 1, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(grey(x), pretrained(x.expand(1, 3, 64, 64)),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("init", ["keep", "normal", "zeros"])
def test_new_rows_follow_init(init: str) -> None:
    source = {"fc.weight": torch.randn(3, 8), "fc.bias": torch.randn(3)}
    model = nn.Sequential()
    model.fc = nn.Linear(8, 1000)
    before = model.fc.weight.detach().clone()
    report = tg.graft(source, model, init=init, label_map=[0, 1, 2])  # type: ignore[arg-type]
    assert report.adapted["fc.weight"] == \
        f"rows 3->1000: 3 kept chosen by label_map, 997 new (init={init})"
    assert torch.equal(model.fc.weight[:3], source["fc.weight"])
    new_rows = model.fc.weight[3:].detach()
    if init == "keep":
        assert torch.equal(new_rows, before[3:])
    elif init == "zeros":
        assert not new_rows.any() and not model.fc.bias[3:].any()
    else:
        assert 0.015 < float(new_rows.std()) < 0.025 and not model.fc.bias[3:].any()


@pytest.mark.parametrize("init", ["keep", "normal", "zeros"])
def test_new_head_is_reinitialised_whole(init: str) -> None:
    source = {"fc.weight": torch.randn(3, 8), "fc.bias": torch.randn(3)}
    model = nn.Sequential()
    model.fc = nn.Linear(8, 10)
    before = model.fc.weight.detach().clone()
    report = tg.graft(source, model, init=init)  # type: ignore[arg-type]
    assert report.ok and set(report.reinitialised) == {"fc.weight", "fc.bias"}
    assert not report.loaded
    weight = model.fc.weight.detach()
    if init == "keep":
        assert torch.equal(weight, before)
    elif init == "zeros":
        assert not weight.any()
    else:
        assert not torch.equal(weight[:3], source["fc.weight"]) and not model.fc.bias.any()


def test_embedding_and_vocabulary_head_keep_shared_rows() -> None:
    source = {"emb.weight": torch.randn(10, 4), "head.weight": torch.randn(10, 4)}
    model = nn.Module()
    model.emb = nn.Embedding(12, 4)
    model.head = nn.Linear(4, 12, bias=False)
    report = tg.graft(source, model)
    assert report.ok and not report.reinitialised
    assert torch.equal(model.emb.weight[:10], source["emb.weight"])
    assert torch.equal(model.head.weight[:10], source["head.weight"])


def test_label_map_picks_rows() -> None:
    source = {"fc.weight": torch.arange(40.0).reshape(10, 4), "fc.bias": torch.arange(10.0)}
    model = nn.Sequential()
    model.fc = nn.Linear(4, 3)
    tg.graft(source, model, label_map={0: 9, 1: 4, 2: 0})
    assert torch.equal(model.fc.bias, torch.tensor([9.0, 4.0, 0.0]))
    assert torch.equal(model.fc.weight[1], source["fc.weight"][4])


def test_adapt_false_and_strict(tmp_path: Path) -> None:
    source = {"fc.weight": torch.randn(1000, 8), "fc.bias": torch.randn(1000),
              "extra": torch.ones(1)}
    model = nn.Sequential()
    model.fc = nn.Linear(8, 21)
    before = model.fc.weight.detach().clone()
    report = tg.graft(source, model, adapt=False)
    assert not report.ok and report.missing == ["fc.weight", "fc.bias"]
    assert torch.equal(model.fc.weight, before)
    with pytest.raises(tg.GraftError) as info:
        tg.graft(source, model, adapt=False, strict=True)
    assert str(info.value).startswith(
        "strict graft failed: Cannot load 'fc.weight': checkpoint has (1000, 8) ('fc.weight'), "
        "model expects (21, 8). Without adapt=False (CLI: --no-adapt) it is re-initialised; "
        "or add a rule that drops it.")
    assert info.value.report.unused == ["fc.weight", "fc.bias", "extra"]
    with pytest.raises(tg.GraftError, match="'extra' in the checkpoint is not used"):
        tg.graft(source, model, strict=True, label_map=range(21))


def test_bookkeeping_buffers_never_fail(model: SmallNet) -> None:
    old = {k: v for k, v in small_net(3).state_dict().items()
           if not k.endswith("num_batches_tracked")}
    report = tg.graft(old, model, strict=True)
    assert report.ok and report.missing == ["bn.num_batches_tracked"]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_rules_file_renames_and_drops(tmp_path: Path, suffix: str) -> None:
    trained = small_net(4)
    source = {k.replace("conv.", "stem.").replace("fc.", "head."): v
              for k, v in trained.state_dict().items()}
    rules = {"rules": [[r"^stem\.", "conv."], [r"^head\.", None]]}
    path = tmp_path / f"rules{suffix}"
    path.write_text(json.dumps(rules))  # JSON is valid YAML too
    model = SmallNet()
    before = model.fc.weight.detach().clone()
    report = tg.graft(source, model, rules=path, match="name")
    assert report.matched_by["conv.weight"] == "rule"
    assert report.missing == ["fc.weight", "fc.bias"]
    assert report.reasons["head.weight"] == "dropped by rule ('^head\\\\.' -> None)"
    assert torch.equal(model.conv.weight, trained.conv.weight)
    assert torch.equal(model.fc.weight, before)


class Renamed(nn.Module):
    """SmallNet's layers under other names, defined in another order than they are used."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Linear(8, 5)
        self.stem = nn.Conv2d(3, 8, 3)
        self.norm = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.relu(self.norm(self.stem(x))).mean((2, 3)))


def test_structure_with_forward_order(model: SmallNet) -> None:
    model.eval()
    target = Renamed().eval()
    x = torch.randn(2, 3, 8, 8)
    report = tg.graft(model, target, example_inputs=(x,), verify=True)
    assert report.ok and set(report.matched_by.values()) == {"structure"}
    assert report.mapping["classifier.weight"] == "fc.weight"
    assert report.max_abs_diff == 0.0
    assert torch.equal(target(x), model(x))


def test_sources_of_every_kind(tmp_path: Path, model: SmallNet) -> None:
    path = tmp_path / "m.safetensors"
    from safetensors.torch import save_file

    save_file(model.state_dict(), path)
    for source in (path, str(path), model.state_dict(), model, tg.open(path)):
        target = SmallNet()
        assert tg.graft(source, target).ok  # type: ignore[arg-type]
        assert_same_state(target.state_dict(), model.state_dict())


def test_report_text_and_json(tmp_path: Path) -> None:
    source = {"module.fc.weight": torch.randn(10, 4), "module.fc.bias": torch.randn(10),
              "module.old.weight": torch.randn(2)}
    model = nn.Sequential()
    model.fc = nn.Linear(4, 3)
    report = tg.graft(source, model, match="name", label_map=[0, 1, 2])
    text = str(report)
    assert text.splitlines()[0] == "graft ok: 2 loaded, 2 renamed, 2 adapted, 1 unused"
    assert "adapted   fc (2 keys)  <- module.fc.weight: rows 10->3: 3 kept chosen by label_map" \
        in text  # a module's keys in one line
    assert "unused    module.old.weight  not in the model" in text
    details = report.details()
    assert "adapted   fc.weight  <- module.fc.weight: rows 10->3: 3 kept chosen by label_map" \
        in details and "adapted   fc.bias  <- module.fc.bias" in details
    assert repr(report) == "GraftReport(verdict='ok', loaded=2, renamed=2, adapted=2, unused=1)"
    data = json.loads(report.to_json())
    assert data["ok"] is True and data["mapping"]["fc.bias"] == "module.fc.bias"


def test_bad_options() -> None:
    with pytest.raises(tg.TorchgraftError, match="match="):
        tg.graft({}, nn.Linear(1, 1), match="fuzzy")  # type: ignore[arg-type]
    with pytest.raises(tg.TorchgraftError, match="verify=True needs"):
        tg.graft({}, nn.Linear(1, 1), verify=True)
    with pytest.raises(tg.TorchgraftError, match="cannot graft from a int"):
        tg.graft(3, nn.Linear(1, 1))  # type: ignore[arg-type]
