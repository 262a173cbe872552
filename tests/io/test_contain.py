"""Containment: parts a checkpoint names stay inside it; the Hub cache's links are followed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torchgraft as tg
from tests import hub_cache
from tests.helpers import assert_same_state
from torchgraft.cli.main import main
from torchgraft.io.contain import check_regular, contained, open_regular, read_contained

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(64, 32) for i in range(4)}


def _hub_sharded(cache: Path, repo_id: str = "org/name") -> tuple[Path, dict[str, torch.Tensor]]:
    """A sharded model written by huggingface_hub, put in a Hub cache by huggingface_hub."""
    from huggingface_hub import save_torch_state_dict

    state = _state()
    written = cache.parent / f"written-{repo_id.replace('/', '-')}"
    written.mkdir(parents=True)
    save_torch_state_dict(state, written, max_shard_size=20_000)
    files = {p.name: p.read_bytes() for p in written.iterdir()}
    assert len([n for n in files if n.endswith(".safetensors")]) >= 2
    return hub_cache.download(files, cache, repo_id), state


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere" / "evil.safetensors"
    target.parent.mkdir(exist_ok=True)
    save_file({"layer0.weight": torch.zeros(64, 32)}, target)
    return target


def test_a_sharded_model_in_the_hub_cache_loads(tmp_path: Path) -> None:
    snapshot, state = _hub_sharded(tmp_path / "hub")
    assert (snapshot / "model.safetensors.index.json").is_symlink()
    assert_same_state(tg.load(snapshot), state, ordered=False)
    assert_same_state(tg.load(snapshot / "model.safetensors.index.json"), state, ordered=False)
    assert tg.inspect(snapshot).format == "sharded"


def test_a_pipeline_in_the_hub_cache_loads(tmp_path: Path) -> None:
    folder = FIXTURES / "diffusers" / "ldm"
    files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    snapshot = hub_cache.download(files, tmp_path / "hub")
    assert (snapshot / "unet" / "diffusion_pytorch_model.safetensors").is_symlink()
    assert_same_state(tg.load(snapshot), tg.load(folder))


@pytest.mark.slow
def test_a_link_into_another_repositorys_blobs_is_refused(tmp_path: Path) -> None:
    snapshot, _ = _hub_sharded(tmp_path / "hub")
    other, _ = _hub_sharded(tmp_path / "hub", "org/other")
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    (snapshot / shard).unlink()
    (snapshot / shard).symlink_to((other / shard).resolve())
    with pytest.raises(tg.OutsideCheckpointError, match=f"'{shard}'.*follow_links=True"):
        tg.load(snapshot)


def test_a_shard_linking_out_names_the_link_its_target_and_the_opt_in(tmp_path: Path) -> None:
    target = _outside(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a.safetensors").symlink_to(target)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"layer0.weight": "a.safetensors"}}))
    with pytest.raises(tg.OutsideCheckpointError) as caught:
        tg.open(folder)
    message = str(caught.value)
    assert str(folder / "a.safetensors") in message and str(target) in message
    assert "follow_links=True" in message and "--follow-links" in message
    loaded = tg.load(folder, follow_links=True)
    assert torch.equal(loaded["layer0.weight"], torch.zeros(64, 32))


def test_a_folders_only_file_linking_out_is_refused(tmp_path: Path) -> None:
    target = _outside(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(target)
    with pytest.raises(tg.OutsideCheckpointError, match="checkpoint file 'model.safetensors'"):
        tg.open(folder)
    assert tg.inspect(folder, follow_links=True).format == "safetensors"


def test_links_into_a_git_annex_repository_are_followed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    objects = repo / ".git" / "annex" / "objects" / "Xx" / "Yy" / "KEY"
    objects.mkdir(parents=True)
    save_file(_state(), objects / "KEY")
    (repo / "models").mkdir()
    (repo / "models" / "model.safetensors").symlink_to("../.git/annex/objects/Xx/Yy/KEY/KEY")
    assert_same_state(tg.load(repo / "models"), _state())


@pytest.mark.parametrize("part", ["dotdot", "absolute", "empty"])
def test_names_leading_out_are_refused_even_with_follow_links(tmp_path: Path, part: str) -> None:
    name = {"dotdot": "a/../../x", "absolute": "/etc/passwd", "empty": ""}[part]
    with pytest.raises(tg.OutsideCheckpointError, match="absolute path or '..'"):
        contained(tmp_path, name, named_by=tmp_path, what="shard", follow_links=True)


def test_a_name_inside_with_dots_is_kept_as_named(tmp_path: Path) -> None:
    assert contained(tmp_path, "a/../b", named_by=tmp_path, what="shard") == tmp_path / "a/../b"


def _dcp(tmp_path: Path) -> Path:
    folder = tmp_path / "dcp"
    tg.convert(FIXTURES / "lightning" / "reference.safetensors", folder, format="dcp")
    return folder


@pytest.mark.parametrize("which", [".metadata", "data"])
def test_dcp_files_linking_out_are_refused(tmp_path: Path, which: str) -> None:
    folder = _dcp(tmp_path)
    name = ".metadata" if which == ".metadata" else next(p.name for p in folder.glob("*.distcp"))
    moved = tmp_path / "moved"
    shutil.move(folder / name, moved)
    (folder / name).symlink_to(moved)
    with pytest.raises(tg.OutsideCheckpointError, match=name):
        tg.load(folder)
    assert tg.load(folder, follow_links=True).keys() == tg.load(
        FIXTURES / "lightning" / "reference.safetensors").keys()


@pytest.mark.parametrize("which", ["latest", "tag", "rank"])
def test_deepspeed_parts_linking_out_are_refused(tmp_path: Path, which: str) -> None:
    folder = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed" / "zero1", folder)
    expected = tg.load(folder)
    moved = tmp_path / "moved"
    link = {"latest": folder / "latest", "tag": folder / "step1",
            "rank": folder / "step1" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"}[which]
    shutil.move(link, moved)
    link.symlink_to(moved)
    with pytest.raises(tg.OutsideCheckpointError, match=str(link)):
        tg.load(folder)
    assert_same_state(tg.load(folder, follow_links=True), expected)


@pytest.mark.parametrize("which", ["part", "weights"])
def test_pipeline_parts_and_their_files_linking_out_are_refused(tmp_path: Path,
                                                                which: str) -> None:
    folder = tmp_path / "ldm"
    shutil.copytree(FIXTURES / "diffusers" / "ldm", folder)
    link = folder / "unet" if which == "part" else (
        folder / "unet" / "diffusion_pytorch_model.safetensors")
    moved = tmp_path / "moved"
    shutil.move(link, moved)
    link.symlink_to(moved)
    with pytest.raises(tg.OutsideCheckpointError, match=str(link)):
        tg.load(folder)
    with pytest.raises(tg.OutsideCheckpointError):
        tg.load(folder, component="unet")
    assert_same_state(tg.load(folder, follow_links=True), tg.load(FIXTURES / "diffusers" / "ldm"))


def test_sentence_transformers_weights_linking_out_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "st"
    shutil.copytree(FIXTURES / "sentence-transformers" / "st", folder)
    link = next((folder / "2_Dense").glob("model.*"))
    moved = tmp_path / "moved"
    shutil.move(link, moved)
    link.symlink_to(moved)
    with pytest.raises(tg.OutsideCheckpointError, match=str(link)):
        tg.load(folder)


def test_cli_refuses_with_exit_2_and_follows_with_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _outside(tmp_path)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(target)
    assert main(["inspect", str(folder)]) == 2
    assert "--follow-links" in capsys.readouterr().err
    assert main(["inspect", "--follow-links", "--json", str(folder)]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "safetensors"


def test_a_part_folder_linking_to_itself_is_a_clean_error(tmp_path: Path) -> None:
    folder = tmp_path / "ldm"
    shutil.copytree(FIXTURES / "diffusers" / "ldm", folder)
    assert_same_state(tg.load(folder), tg.load(FIXTURES / "diffusers" / "ldm"))  # the control
    shutil.rmtree(folder / "unet")
    (folder / "unet").symlink_to("unet")  # a loop: a raw RuntimeError('Symlink loop') before
    for follow_links in (False, True):
        with pytest.raises(tg.CorruptCheckpointError, match=r"unet.*link loop"):
            tg.load(folder, follow_links=follow_links)


def _sidecar(folder: Path, **options: object) -> bytes:
    return read_contained(folder, "config.json", named_by=folder, what="config.json",
                          limit=100, **options)  # type: ignore[arg-type]


def test_read_contained_reads_a_small_regular_file_inside(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert _sidecar(tmp_path) == b"{}"
    (tmp_path / "config.json").write_text("x" * 101)
    with pytest.raises(tg.CorruptCheckpointError, match="larger than the 100 bytes"):
        _sidecar(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(tg.CheckpointNotFoundError, match="config.json 'config.json' is missing"):
        _sidecar(tmp_path)


def test_read_contained_refuses_links_out_unless_followed(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret").write_text("{}")
    (folder / "config.json").symlink_to(tmp_path / "secret")
    with pytest.raises(tg.OutsideCheckpointError, match="follow_links=True"):
        _sidecar(folder)
    assert _sidecar(folder, follow_links=True) == b"{}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_special_files_are_refused_before_they_are_opened(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block until a writer comes
    elif kind == "device":
        path.symlink_to("/dev/zero")  # an endless file, followed (follow_links)
    else:
        path.mkdir()
    name = {"fifo": "a FIFO", "device": "a character device", "folder": "a folder"}[kind]
    with pytest.raises(tg.UnsupportedCheckpointError, match=f"not a regular file but {name}"):
        _sidecar(tmp_path, follow_links=True)
    with pytest.raises(tg.UnsupportedCheckpointError):
        check_regular(path)
    if kind != "folder":
        with pytest.raises(tg.UnsupportedCheckpointError):
            open_regular(path)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Hub cache written by huggingface_hub, as the one the library looks in: (repo, state)."""
    pytest.importorskip("huggingface_hub")
    snapshot, state = _hub_sharded(tmp_path / "hub")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_same_state(tg.load("org/name"), state, ordered=False)  # the control
    return snapshot.parent.parent, state


def _evil(tmp_path: Path) -> Path:
    evil = tmp_path / "evil"
    evil.mkdir()
    save_file({"layer0.weight": torch.zeros(64, 32)}, evil / "model.safetensors")
    return evil


@pytest.mark.parametrize("ref", ["../../../evil", "ABSOLUTE", "main", ""])
def test_a_hub_ref_naming_no_commit_is_refused(hub: tuple[Path, dict[str, torch.Tensor]],
                                               tmp_path: Path, ref: str) -> None:
    repo, _ = hub
    evil = _evil(tmp_path)
    (repo / "refs" / "main").write_text(str(evil) if ref == "ABSOLUTE" else ref)
    with pytest.raises(tg.CorruptCheckpointError, match="refs/main holds .* not a commit hash"):
        tg.load("org/name")


@pytest.mark.timeout(30)
def test_a_hub_ref_that_is_a_fifo_or_links_out_is_not_read(
        hub: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    repo, state = hub
    commit = (repo / "refs" / "main").read_text()
    (repo / "refs" / "main").unlink()
    os.mkfifo(repo / "refs" / "main")
    with pytest.raises(tg.UnsupportedCheckpointError, match="a FIFO"):
        tg.load("org/name")
    (repo / "refs" / "main").unlink()
    (tmp_path / "ref").write_text(commit)
    (repo / "refs" / "main").symlink_to(tmp_path / "ref")
    with pytest.raises(tg.OutsideCheckpointError, match="refs/main"):
        tg.load("org/name")
    assert_same_state(tg.load(f"org/name@{commit}"), state, ordered=False)


def test_a_hub_snapshot_that_links_out_is_refused(hub: tuple[Path, dict[str, torch.Tensor]],
                                                  tmp_path: Path) -> None:
    repo, _ = hub
    snapshot = repo / "snapshots" / hub_cache.COMMIT
    shutil.rmtree(snapshot)
    snapshot.symlink_to(_evil(tmp_path))
    for spelled in ("org/name", f"org/name@{hub_cache.COMMIT}"):
        with pytest.raises(tg.OutsideCheckpointError, match="Hub cache snapshot"):
            tg.load(spelled)
    loaded = tg.load("org/name", follow_links=True)  # the user trusts where it leads
    assert torch.equal(loaded["layer0.weight"], torch.zeros(64, 32))
