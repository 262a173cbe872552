"""A diffusers folder's ``config.json`` (``_class_name``) builds the source's own model.

Looked up among diffusers' own model classes (never a module the file names, never remote
code), built on meta, and compared: a file stored sorted gets its order of use from it, and
its guesses are settled as a transformers folder's are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.graft.pairs.installed import skip_without_code_bases

skip_without_code_bases("diffusers")

import diffusers  # noqa: E402

import torchgraft as tg  # noqa: E402
from torchgraft.graft.check.source_model import from_folder, unbuilt  # noqa: E402

CONFIG = {"in_channels": 3, "out_channels": 3, "block_out_channels": [32, 32],
          "down_block_types": ["DownEncoderBlock2D"] * 2,
          "up_block_types": ["UpDecoderBlock2D"] * 2, "layers_per_block": 1,
          "latent_channels": 4, "norm_num_groups": 32, "sample_size": 16}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("vae")
    diffusers.AutoencoderKL(**CONFIG).save_pretrained(path)
    return path


def _shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(folder / "diffusion_pytorch_model.safetensors"), "pt") as file:
        return {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()}


def test_a_diffusers_config_builds_its_class_on_meta(folder: Path) -> None:
    described = from_folder(folder, shapes=_shapes(folder))
    assert described is not None and "(AutoencoderKL)" in described.origin
    model = described.build()
    assert type(model) is diffusers.AutoencoderKL
    assert all(p.is_meta for p in model.parameters())
    assert described.same_as(diffusers.AutoencoderKL(**CONFIG))
    assert not described.same_as(diffusers.AutoencoderKL(**{**CONFIG, "latent_channels": 8}))


@pytest.mark.parametrize(("name", "reason"), [
    ("os.system", "names 'os.system', which is no model class of diffusers"),
    ("DDPMScheduler", "names 'DDPMScheduler', which is no model class of diffusers"),
])
def test_a_diffusers_config_naming_no_model_class_builds_nothing(
        tmp_path: Path, name: str, reason: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": name}))
    assert from_folder(tmp_path, shapes={}) is None
    assert unbuilt(tmp_path) == (tmp_path / "config.json", f"it {reason}")


def test_the_folder_verifies_a_graft_into_the_same_class(folder: Path) -> None:
    model = diffusers.AutoencoderKL(**CONFIG)
    report = tg.graft(folder, model, verify=True)
    assert report.ok, report
    assert report.verified_with is not None and "AutoencoderKL" in report.verified_with
