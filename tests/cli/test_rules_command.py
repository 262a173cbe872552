"""Operation rules in the rules file the CLI takes, through the entry point."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from tests.graft.layouts.test_op_rules import TO_FAST
from tests.graft.pairs import references as ref
from tests.graft.pairs.codebases import ARCHS
from tests.graft.pairs.values import randomise

Run = Callable[..., subprocess.CompletedProcess[str]]
FACTORY = "tests/graft/pairs/codebases.py:gpt_fast_llama"


@pytest.mark.slow
def test_graft_with_a_yaml_file_of_operation_rules(run: Run, tmp_path: Path) -> None:
    hf = randomise(ARCHS["transformers Llama"].build(), seed=2)
    source = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(source))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"rules": TO_FAST}))
    out = tmp_path / "fast.safetensors"
    result = run("graft", str(source), "--model", FACTORY, "--rules", str(rules), "--out",
                 str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "graft ok" in result.stdout
    expected = ref.hf_llama_to_gpt_fast(hf.state_dict())
    saved = load_file(out)
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[k], v) for k, v in expected.items())


@pytest.mark.slow
def test_a_bad_operation_rule_exits_2_naming_it(run: Run, tmp_path: Path) -> None:
    hf = ARCHS["transformers Llama"].build()
    source = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(source))
    rules = tmp_path / "rules.yaml"
    bad = [dict(TO_FAST[2], sizes=[1, 2]), *TO_FAST[3:]]  # concatenate takes no sizes
    rules.write_text(yaml.safe_dump({"rules": bad}))
    result = run("graft", str(source), "--model", FACTORY, "--rules", str(rules), "--out",
                 str(tmp_path / "out.safetensors"))
    assert result.returncode == 2
    assert "rule 1: concatenate takes no field 'sizes'" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_graft_saves_in_the_layout_of_another_checkpoint(run: Run, tmp_path: Path) -> None:
    """A gpt-fast checkpoint, saved in transformers' Llama layout: q, k, v taken apart."""
    hf = randomise(ARCHS["transformers Llama"].build(), seed=5)
    layout = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(layout))
    fast = tmp_path / "fast.pt"
    torch.save(ref.hf_llama_to_gpt_fast(hf.state_dict()), fast)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(TO_FAST))
    out = tmp_path / "out.safetensors"
    args = ["graft", str(fast), "--model", FACTORY, "--out", str(out), "--layout-of",
            str(layout)]
    refused = run(*args)  # without the rules, the layout's rotary rows are read by a guess
    assert refused.returncode == 2 and not out.exists()  # (the file states no head count)
    assert "paired with the checkpoint's layout by a guess" in refused.stdout + refused.stderr
    result = run(*args, "--layout-rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    saved, expected = load_file(out), load_file(layout)
    assert list(saved) == list(expected)
    assert all(torch.equal(saved[k], v) for k, v in expected.items())


#: Nine levels of nine aliases each: 9^9 strings once expanded.
ALIAS_BOMB = "rules:\n" + "".join(
    f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))


@pytest.mark.slow
@pytest.mark.parametrize(("rules", "says"), [
    (ALIAS_BOMB, "a YAML alias bomb"),
    ("rules: [[" + "[" * 200 + "]" * 200 + "]]", "nest deeper than 100 levels"),
    (r"rules: [['^(\w+\.?)*$', '\g<0>']]", None),  # the control: real keys, no backtracking
], ids=["alias bomb", "nesting", "control"])
def test_a_hostile_rules_file_exits_2_in_one_line(run: Run, tmp_path: Path, rules: str,
                                                   says: str | None) -> None:
    source = tmp_path / "w.safetensors"
    save_file({"layer.weight": torch.ones(2, 2), "layer.bias": torch.ones(2)}, str(source))
    (tmp_path / "tiny.py").write_text("from torch import nn\n\n\nclass Tiny(nn.Module):\n"
                                      "    def __init__(self):\n        super().__init__()\n"
                                      "        self.layer = nn.Linear(2, 2)\n")
    (tmp_path / "rules.yaml").write_text(rules)
    result = run("graft", str(source), "--model", f"{tmp_path / 'tiny.py'}:Tiny", "--rules",
                 str(tmp_path / "rules.yaml"), "--dry-run")
    if says is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
