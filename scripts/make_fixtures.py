r"""Regenerate tests/fixtures: small checkpoints written by the real libraries' own save functions.

These libraries are too heavy for the test suite, so their files are made here and committed:
Lightning (``Trainer.save_checkpoint``; a network as ``self.net``, and one as ``self.model``),
mmengine (``Runner`` with its ``CheckpointHook``), DeepSpeed (``engine.save_checkpoint`` under
ZeRO stages 1, 2 and 3, two ranks on the CPU), diffusers (``DiffusionPipeline.save_pretrained``)
and sentence-transformers
(``SentenceTransformer.save``). Beside each, ``reference.safetensors`` holds what the library
itself loads back (its own loader, not torchgraft) and an input with the output the library's
model gives for it, so the tests compare torchgraft with the library bit for bit.
``MANIFEST.json`` records every library's version and what was written.

Run it in an environment with those libraries and torch::

    python -m venv /tmp/fixtures && /tmp/fixtures/bin/pip install torch==2.13.0 lightning \\
        mmengine-lite opencv-python-headless matplotlib diffusers sentence-transformers
    DS_BUILD_OPS=0 /tmp/fixtures/bin/pip install --no-build-isolation deepspeed
    /tmp/fixtures/bin/python scripts/make_fixtures.py

Random weights only; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import shutil
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

MANIFEST: dict[str, Any] = {}


def _reference(folder: Path, weights: dict[str, torch.Tensor], **io: torch.Tensor) -> None:
    tensors = {f"weights/{k}": v.detach().contiguous().clone() for k, v in weights.items()}
    tensors.update({f"io/{k}": v.detach().contiguous() for k, v in io.items()})
    save_file(tensors, folder / "reference.safetensors")


def _record(name: str, folder: Path, root: Path, how: str, *packages: str) -> None:
    MANIFEST[name] = {
        "versions": {p: version(p) for p in ("torch", *packages)},
        "how": how,
        "files": sorted(str(p.relative_to(root)) for p in folder.rglob("*") if p.is_file()),
    }


class Color(enum.Enum):
    """An Enum in the hyper-parameters: Lightning pickles it, and torchgraft must not run it."""

    RED = 1


def _fit_and_save(module: Any, path: Path) -> Any:
    """Train a LightningModule class for one epoch on random data, save and load it back."""
    import lightning as L

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, accelerator="cpu")
    trainer.fit(module(), torch.utils.data.DataLoader(data, batch_size=8))
    trainer.save_checkpoint(path)
    return module.load_from_checkpoint(path, weights_only=False).eval()


def lightning(root: Path) -> None:
    """A LightningModule with an Enum hyper-parameter, one epoch, its checkpoint."""
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self, color: Color = Color.RED, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                     nn.Linear(8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    folder = root / "lightning"
    loaded = _fit_and_save(Tiny, folder / "tiny.ckpt")
    x = torch.randn(3, 4)
    _reference(folder, loaded.state_dict(), x=x, y=loaded(x))
    _record("lightning", folder, root, "Trainer.fit for one epoch, then Trainer.save_checkpoint; "
            "an Enum in the hyper-parameters", "lightning")


def lightning_model(root: Path) -> None:
    """A LightningModule holding its network as ``self.model``: every key starts ``model.``."""
    import lightning as L

    class Wrapped(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    folder = root / "lightning-model"
    loaded = _fit_and_save(Wrapped, folder / "wrapped.ckpt")
    x = torch.randn(3, 4)
    _reference(folder, loaded.model.state_dict(), x=x, y=loaded(x))
    _record("lightning-model", folder, root, "Trainer.fit for one epoch, then "
            "Trainer.save_checkpoint of a LightningModule whose network is self.model; "
            "reference: the bare network's state dict", "lightning")


def mmengine(root: Path) -> None:
    """An mmengine Runner's epoch checkpoint (message hub, optimizer, meta)."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Tiny(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
            self.head = nn.Linear(4, 3)

        def forward(self, inputs: torch.Tensor, labels: Any = None, mode: str = "tensor") -> Any:
            x = self.head(self.backbone(inputs).mean((2, 3)))
            return {"loss": nn.functional.cross_entropy(x, labels)} if mode == "loss" else x

    class Data(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(i)
            return {"inputs": torch.randn(3, 6, 6, generator=g), "labels": i % 3}

    folder = root / "mmengine"
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "torchgraft-mmengine-work"
    shutil.rmtree(work, ignore_errors=True)
    torch.manual_seed(0)
    runner = Runner(
        model=Tiny(), work_dir=str(work),
        train_dataloader={"dataset": Data(), "batch_size": 4, "collate_fn": {
            "type": "default_collate"}, "sampler": {"type": "DefaultSampler", "shuffle": False}},
        optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.01, "momentum": 0.9}},
        train_cfg={"by_epoch": True, "max_epochs": 1},
        default_hooks={"checkpoint": {"type": "CheckpointHook", "interval": 1}},
        randomness={"seed": 0})
    runner.train()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / "epoch_1.pth", folder / "epoch_1.pth")
    model = Tiny().eval()
    # mmengine's load_checkpoint uses torch.load's default weights_only=True, which refuses the
    # message hub's pickled classes: the file is ours, so load it whole.
    saved = torch.load(folder / "epoch_1.pth", weights_only=False)
    model.load_state_dict(saved["state_dict"])
    x = torch.randn(2, 3, 6, 6)
    _reference(folder, model.state_dict(), x=x, y=model(x))
    _record("mmengine", folder, root, "Runner.train for one epoch; CheckpointHook wrote "
            "epoch_1.pth (message hub, optimizer, meta)", "mmengine-lite")


def _deepspeed_rank(rank: int, stage: int, bf16: bool, out: str) -> None:
    import deepspeed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29700 + stage + 10 * bf16),
                      RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = _deepspeed_model()
    config = {"train_batch_size": 8, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
              "bf16": {"enabled": bf16}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    torch.manual_seed(rank)
    x = torch.randn(4, 8)
    engine.backward(engine(x.bfloat16() if bf16 else x).float().sum())
    engine.step()
    engine.save_checkpoint(out, tag="step1")


def _deepspeed_model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 15), nn.ReLU(), nn.Linear(15, 3))


def deepspeed(root: Path) -> None:
    """DeepSpeed ZeRO 1 (fp32), 2 and 3 (bf16) checkpoints of two CPU ranks."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for stage, bf16 in ((1, False), (2, True), (3, True)):
        folder = root / "deepspeed" / f"zero{stage}{'_bf16' if bf16 else ''}"
        shutil.rmtree(folder, ignore_errors=True)
        torch.multiprocessing.spawn(_deepspeed_rank, args=(stage, bf16, str(folder)), nprocs=2)
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # copies of deepspeed's tools
            (folder / script).unlink(missing_ok=True)
        merged = get_fp32_state_dict_from_zero_checkpoint(str(folder))
        weights = {k: (v.contiguous() if hasattr(v, "contiguous") else v)
                   for k, v in merged.items()}
        model = _deepspeed_model()
        model.load_state_dict(weights)
        x = torch.randn(2, 8)
        _reference(folder, weights, x=x, y=model(x))
        _record(f"deepspeed/{folder.name}", folder, root,
                f"deepspeed.initialize with ZeRO stage {stage}{', bf16' if bf16 else ''}, two "
                "ranks (gloo), one step, engine.save_checkpoint(tag='step1'); reference: "
                "deepspeed's own zero_to_fp32", "deepspeed")


def diffusers(root: Path) -> None:
    """A diffusers pipeline folder: a UNet and a VQ-VAE, and a scheduler."""
    from diffusers import DDIMScheduler, LDMPipeline, UNet2DModel, VQModel

    folder = root / "diffusers"
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(8, 16), down_block_types=("DownBlock2D",) * 2,
                       up_block_types=("UpBlock2D",) * 2, norm_num_groups=4)
    vqvae = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                    up_block_types=("UpDecoderBlock2D",), block_out_channels=(8,),
                    layers_per_block=1, latent_channels=3, norm_num_groups=4,
                    num_vq_embeddings=16, vq_embed_dim=3)
    shutil.rmtree(folder / "ldm", ignore_errors=True)
    LDMPipeline(vqvae=vqvae, unet=unet, scheduler=DDIMScheduler()).save_pretrained(folder / "ldm")
    pipe = LDMPipeline.from_pretrained(folder / "ldm")
    x = torch.randn(1, 3, 8, 8)
    t = torch.tensor([10])
    with torch.no_grad():
        y_unet = pipe.unet(x, t).sample
        y_vqvae = pipe.vqvae(x).sample
    weights = {**{f"unet.{k}": v for k, v in pipe.unet.state_dict().items()},
               **{f"vqvae.{k}": v for k, v in pipe.vqvae.state_dict().items()}}
    _reference(folder, weights, x=x, t=t, y_unet=y_unet, y_vqvae=y_vqvae)
    _record("diffusers", folder, root, "LDMPipeline(vqvae, unet, scheduler).save_pretrained: "
            "model_index.json and one folder per part", "diffusers")


def sentence_transformers(root: Path) -> None:
    """A sentence-transformers folder: BERT at the root, pooling, 2_Dense, normalize."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = root / "sentence-transformers"
    base = Path(os.environ.get("TMPDIR", "/tmp")) / "torchgraft-tiny-bert"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (base / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(base / "vocab.txt")).save_pretrained(base)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32,
                         max_position_embeddings=16)).save_pretrained(base)
    model = SentenceTransformer(modules=[
        models.Transformer(str(base), max_seq_length=16), models.Pooling(16, "mean"),
        models.Dense(16, 8, activation_function=nn.Tanh()), models.Normalize()], device="cpu")
    shutil.rmtree(folder / "st", ignore_errors=True)
    model.save(str(folder / "st"))
    loaded = SentenceTransformer(str(folder / "st"), device="cpu").eval()
    features = loaded.tokenize(["w1 w2 w3", "w4 w5"])
    with torch.no_grad():
        embedding = loaded(dict(features))["sentence_embedding"]
    _reference(folder, loaded.state_dict(), input_ids=features["input_ids"],
               attention_mask=features["attention_mask"], embedding=embedding)
    _record("sentence-transformers", folder, root, "SentenceTransformer(Transformer, Pooling, "
            "Dense, Normalize).save: modules.json, the model at the root, 2_Dense/",
            "sentence-transformers", "transformers")


WRITERS = {"lightning": lightning, "lightning-model": lightning_model, "mmengine": mmengine,
           "deepspeed": deepspeed, "diffusers": diffusers,
           "sentence-transformers": sentence_transformers}


def main() -> None:
    """Write the fixtures of the libraries named (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "tests" /
                        "fixtures")
    parser.add_argument("libraries", nargs="*", choices=[*WRITERS, []], default=[])
    args = parser.parse_args()
    manifest_path = args.out / "MANIFEST.json"
    if manifest_path.exists():
        MANIFEST.update(json.loads(manifest_path.read_text()))
    for name in args.libraries or WRITERS:
        print(f"writing {name} fixtures", file=sys.stderr)
        WRITERS[name](args.out)
    manifest_path.write_text(json.dumps(MANIFEST, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
