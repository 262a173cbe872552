"""A user's patterns are matched within a time budget: catastrophic backtracking ends fast."""

from __future__ import annotations

import re
import signal
import threading

import pytest

import torchgraft.patterns
from tests.helpers import assert_scales_linearly, calls
from torchgraft.errors import TorchgraftError
from torchgraft.patterns import TimedPattern
from torchgraft.renames import Rule, rename

#: Exponential over a key it does not match: 2^40 ways to split 40 characters.
CATASTROPHIC = r"^(\w+\.?)*$"
KEY = "a" * 40 + "!"


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(torchgraft.patterns, "BUDGET_SECONDS", 0.3)
    return 0.3


def test_catastrophic_backtracking_is_cut_at_the_budget(budget: float) -> None:
    pattern = TimedPattern(re.compile(CATASTROPHIC), what="rule pattern")
    with pytest.raises(TorchgraftError, match="took over 0.3 s matching key 'aaaa") as caught:
        pattern.search(KEY)  # without the budget: longer than the universe
    assert "backtracks" in str(caught.value) and len(str(caught.value)) < 400
    with pytest.raises(TorchgraftError):  # spent: refused at once from then on
        pattern.search("a")


def test_the_same_pattern_matches_real_keys(budget: float) -> None:  # the control
    pattern = TimedPattern(re.compile(CATASTROPHIC))
    assert all(pattern.fullmatch(f"layer{i}.weight") for i in range(10_000))
    assert pattern.sub("x", "a.b") == "x" and pattern.search("a!") is None


def test_a_long_key_does_not_make_a_simple_pattern_quadratic_for_long(budget: float) -> None:
    pattern = TimedPattern(re.compile(r"(.*)\.weight"))  # quadratic in the key's length
    with pytest.raises(TorchgraftError, match=r"\(1000000 characters\)"):
        pattern.search("a" * 1_000_000)


def test_someone_elses_alarm_is_kept(budget: float) -> None:
    handler = signal.getsignal(signal.SIGALRM)
    delay, _ = signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        TimedPattern(re.compile(r"^module\.")).sub("", "module.x")
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 99.0 < left <= 100.0 and signal.getsignal(signal.SIGALRM) == handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, delay)


def test_off_the_main_thread_the_pattern_is_refused_after_the_match(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchgraft.patterns, "BUDGET_SECONDS", 0.05)
    pattern = TimedPattern(re.compile(CATASTROPHIC))
    caught: list[BaseException] = []

    def match() -> None:
        try:
            pattern.search("a" * 24 + "!")  # about a second here: no timer on this thread
        except TorchgraftError as exc:
            caught.append(exc)

    thread = threading.Thread(target=match)
    thread.start()
    thread.join(60)
    assert caught and "took over 0.05 s" in str(caught[0])


def test_a_users_rule_is_timed_and_the_librarys_are_not(budget: float) -> None:
    library = Rule(CATASTROPHIC, "x")
    assert library.matcher is library.regex
    user = library.timed()
    assert isinstance(user.matcher, TimedPattern) and user == library
    with pytest.raises(TorchgraftError, match="rule pattern"):
        rename(KEY, [user])


def test_timed_renames_are_linear_in_the_keys() -> None:
    rules = [Rule(r"^module\.", "").timed(), Rule(r"(.*)\.gamma$", r"\1.weight").timed()]

    def cost(count: int) -> int:
        keys = [f"module.layer{i}.norm.gamma" for i in range(count)]
        return calls(lambda: [rename(k, rules) for k in keys])

    assert_scales_linearly(cost, 5000)
