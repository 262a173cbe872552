"""PEFT adapters written by PEFT's own ``save_pretrained``: a graft scoped to the adapter.

Into a ``PeftModel`` (or a base model given adapter layers by ``inject_adapter_in_model``) the
report is ok when every adapter tensor is loaded, the base weights listed as not part of an
adapter; the model then computes what PEFT's own ``PeftModel.from_pretrained`` gives. A plain
base model is refused with what to do (the advice is run here); an adapter of another rank, or
with a tensor missing, is not ok.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import torchgraft as tg
from torchgraft.cli.main import main
from torchgraft.graft.report.adapter_scope import NOT_IN_ADAPTER

peft = pytest.importorskip("peft")

MODELS = '''
import peft, torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.v, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)
    def forward(self, x):
        return self.head(torch.relu(self.q(x) + self.v(x)))
def base():
    torch.manual_seed(0)
    return Net()
def with_lora(r=4):
    return peft.get_peft_model(base(), peft.LoraConfig(r=r, target_modules=["q", "v"],
                                                       modules_to_save=["head"]))
'''


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    (tmp_path / "adaptermodels.py").write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import adaptermodels  # type: ignore[import-not-found]

    yield adaptermodels
    import sys

    sys.modules.pop("adaptermodels", None)


@pytest.fixture
def adapter(tmp_path: Path, models: object) -> Path:
    """A trained-looking LoRA adapter (non-zero B) with a saved head, by save_pretrained."""
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, target_modules=["q", "v"], modules_to_save=["head"],
                             init_lora_weights=False)
    trained = peft.get_peft_model(models.base(), config)  # type: ignore[attr-defined]
    with torch.no_grad():
        trained.base_model.model.head.modules_to_save["default"].weight.mul_(3)
    folder = tmp_path / "adapter"
    trained.save_pretrained(folder)
    assert (folder / "adapter_config.json").is_file()
    return folder


def _peft_loaded(models: object, folder: Path) -> nn.Module:
    return peft.PeftModel.from_pretrained(models.base(), folder).eval()  # type: ignore[attr-defined]


def test_an_adapter_grafts_into_a_peft_model_scoped_to_its_keys(adapter: Path,
                                                                 models: object) -> None:
    target = models.with_lora().eval()  # type: ignore[attr-defined]
    report = tg.graft(adapter, target)
    saved = load_file(adapter / "adapter_model.safetensors")
    assert report.ok and not report.missing and not report.unused
    assert len(report.loaded) == len(saved)
    base = [k for k in target.state_dict() if "base_layer" in k or "original_module" in k]
    assert sorted(report.not_in_adapter) == sorted(base) and base
    assert all(report.reasons[k] == NOT_IN_ADAPTER for k in base)
    assert "not in adapter" in report.headline() and "INCOMPLETE" not in report.headline()
    x = torch.randn(5, 8)
    assert torch.equal(target(x), _peft_loaded(models, adapter)(x))


def test_a_base_model_given_adapter_layers_takes_it(adapter: Path, models: object) -> None:
    config = peft.PeftConfig.from_pretrained(adapter)
    target = peft.inject_adapter_in_model(config, models.base())  # type: ignore[attr-defined]
    report = tg.graft(adapter, target)
    assert report.ok and report.not_in_adapter and not report.missing
    x = torch.randn(5, 8)
    assert torch.equal(target(x), _peft_loaded(models, adapter).base_model.model(x))


def test_a_plain_base_model_is_refused_with_advice_that_works(adapter: Path,
                                                              models: object) -> None:
    model = models.base()  # type: ignore[attr-defined]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tg.TorchgraftError, match=r"PEFT adapter \(LORA.*get_peft_model") as caught:
        tg.graft(adapter, model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    advice = str(caught.value).split("then graft: ")[1].split(" (or load")[0]
    namespace = {"peft": peft, "tg": tg, "model": model}
    exec(advice, namespace)  # the advice, as written
    x = torch.randn(5, 8)
    assert torch.equal(namespace["model"].eval()(x), _peft_loaded(models, adapter)(x))


def test_another_rank_or_a_missing_tensor_is_not_ok(adapter: Path, models: object) -> None:
    other = models.with_lora(r=8)  # type: ignore[attr-defined]
    report = tg.graft(adapter, other)
    assert not report.ok and any("lora_A" in k for k in report.missing)
    assert not report.reinitialised
    saved = load_file(adapter / "adapter_model.safetensors")
    dropped = next(k for k in saved if "lora_B" in k)
    save_file({k: v for k, v in saved.items() if k != dropped}, adapter /
              "adapter_model.safetensors", metadata={"format": "pt"})
    partial = tg.graft(adapter, models.with_lora())  # type: ignore[attr-defined]
    assert not partial.ok and len(partial.missing) == 1 and "lora_B" in partial.missing[0]
    with pytest.raises(tg.GraftError):
        tg.graft(adapter, models.with_lora(), strict=True)  # type: ignore[attr-defined]


def test_the_cli_grafts_an_adapter(adapter: Path, models: object, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grafted.safetensors"
    code = main(["graft", str(adapter), "--model", "adaptermodels:with_lora", "--out", str(out)])
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 0, printed
    assert printed.startswith("graft ok") and "not part of an adapter" in printed
    assert f"saved {out}" in printed
    assert out.is_file()
