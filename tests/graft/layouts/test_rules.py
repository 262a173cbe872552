"""Rules files and a user's patterns: bounded as files are, each hostile case with its control."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchgraft as tg
import torchgraft.patterns
from torchgraft.graft.layouts.rules import MAX_RULES_BYTES, read_rules

CATASTROPHIC = r"^(\w+\.?)*$"  # exponential over a key it does not match


def _bomb() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(["rules:", *(f"  {line}" for line in lines)]) + "\n"


def _refused(path: Path, match: str) -> str:
    start = time.process_time()
    with pytest.raises(tg.TorchgraftError, match=match) as caught:
        read_rules(path)
    assert time.process_time() - start < 1.0
    assert type(caught.value) is tg.TorchgraftError  # a rules file is no corrupt checkpoint
    assert str(caught.value).startswith(str(path)) and len(str(caught.value)) < 400
    return str(caught.value)


@pytest.mark.parametrize(("name", "text", "match"), [
    ("bomb.yaml", _bomb(), "alias bomb"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nest deeper than 100"),
    ("deep.yaml", "".join(f"{'  ' * i}- \n" for i in range(500)) + "  " * 500 + "x\n",
     "nest deeper than 100"),
    ("bad.json", "[[1, 2]", "not valid JSON"),
    ("big.json", " " * (MAX_RULES_BYTES + 1), f"larger than the {MAX_RULES_BYTES} bytes"),
    ("reshape.json", json.dumps([{"op": "reshape", "from": "w", "shape": [-1, -4]}]),
     r"rule 1: reshape: shape must be whole numbers from 0, not \[-1, -4\]"),
])
def test_a_hostile_rules_file_is_refused_fast_naming_it(tmp_path: Path, name: str, text: str,
                                                        match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    _refused(path, match)


def test_the_same_rules_as_plain_yaml_and_json_are_read(tmp_path: Path) -> None:  # controls
    rules = [[r"^module\.", ""], [r"^head\.", None]]
    (tmp_path / "r.json").write_text(json.dumps({"rules": rules}))
    (tmp_path / "r.yaml").write_text("drop: &drop null\nrules:\n  - ['^module\\.', '']\n"
                                     "  - ['^head\\.', *drop]\n")
    assert read_rules(tmp_path / "r.json") == read_rules(tmp_path / "r.yaml") == read_rules(rules)


def test_a_fifo_rules_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.json"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            read_rules(fifo)
        except tg.TorchgraftError as exc:
            caught.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(10)
    assert caught and "FIFO" in str(caught[0])


def test_a_rule_that_is_no_pair_is_shown_in_part() -> None:
    """10^9 leaves (an alias bomb, built in Python): the message renders a few of them."""
    bomb: list[Any] = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9
    start = time.process_time()
    with pytest.raises(tg.TorchgraftError, match=r"rule 1 \[\[\[\[\.\.\.\], .* is not a") as caught:
        read_rules([[bomb, bomb, bomb]])
    assert time.process_time() - start < 0.5 and len(str(caught.value)) < 400


def test_a_rule_that_is_no_pair_is_shown_whole_when_short() -> None:  # the control
    with pytest.raises(tg.TorchgraftError, match=r"rule 1 \['\^a', 1\] is not a"):
        read_rules([["^a", 1]])


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)


def _long_key_checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.pt"
    state: dict[str, Any] = {f"layer.{p}": t for p, t in _Net().state_dict().items()}
    state["a" * 40 + "!"] = torch.zeros(1)  # a key the user's pattern backtracks over
    torch.save(state, path)
    return path


@pytest.mark.parametrize("rule", [
    [CATASTROPHIC, "x"],
    {"op": "transpose", "from": CATASTROPHIC},
], ids=["rename", "operation"])
def test_a_users_pattern_that_backtracks_is_cut_at_its_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: Any) -> None:
    monkeypatch.setattr(torchgraft.patterns, "BUDGET_SECONDS", 0.3)
    start = time.monotonic()
    with pytest.raises(tg.TorchgraftError, match=r"took over 0.3 s matching key 'aaaa"):
        tg.graft(_long_key_checkpoint(tmp_path), _Net(), rules=[rule])
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("rule", [
    [CATASTROPHIC, "x"],
    {"op": "transpose", "from": CATASTROPHIC},
], ids=["rename", "operation"])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_backtracking_pattern_of_a_rules_file_names_the_file_and_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: Any, suffix: str) -> None:
    """The error comes while keys are matched, long after the file was read: it still names
    the file, the rule's place in it and the pattern (the pattern alone, before)."""
    monkeypatch.setattr(torchgraft.patterns, "BUDGET_SECONDS", 0.3)
    rules = tmp_path / f"rules{suffix}"
    rules.write_text(json.dumps([["^never", "x"], rule]))  # JSON is YAML too
    with pytest.raises(tg.TorchgraftError) as caught:
        tg.graft(_long_key_checkpoint(tmp_path), _Net(), rules=rules)
    message = str(caught.value)
    assert message.startswith(f"{rules}: rule 2") and "took over 0.3 s" in message, message
    with pytest.raises(tg.TorchgraftError) as given:  # given as a list: no file to name
        tg.graft(_long_key_checkpoint(tmp_path), _Net(), rules=[["^never", "x"], rule])
    assert str(given.value).startswith("rule 2"), given.value


def test_the_same_pattern_over_real_keys_grafts(tmp_path: Path) -> None:  # the control
    path = tmp_path / "ckpt.pt"
    torch.save({f"layer.{p}": t for p, t in _Net().state_dict().items()}, path)
    report = tg.graft(path, _Net(), rules=[[CATASTROPHIC + "|^never", r"\g<0>"]])
    assert report.ok


def test_operation_rules_are_linear_in_the_keys() -> None:
    from tests.helpers import assert_scales_linearly, cpu_seconds
    from torchgraft.graft import Side, TensorInfo
    from torchgraft.graft.layouts.op_rules import apply_op_rules
    from torchgraft.meta import TensorMeta, TensorRef

    rules = read_rules([{"op": "concatenate", "dim": 0, "to": r"\1.qkv.weight",
                         "from": [rf"(.*)\.{p}\.weight" for p in "qkv"]}]).ops

    def seconds(blocks: int) -> float:
        names = [f"layers.{i}.{p}.weight" for i in range(blocks) for p in "qkv"]
        side = Side({n: TensorInfo(n, (4, 4), torch.float32, "linear") for n in names})
        refs = {n: TensorRef(TensorMeta.of((4, 4), torch.float32), lambda: torch.zeros(4, 4))
                for n in names}
        return cpu_seconds(lambda: apply_op_rules(rules, side, dict(refs)))

    assert_scales_linearly(seconds, 1000)
