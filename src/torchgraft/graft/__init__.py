"""Grafting: plan on metadata (``build_plan``), then execute (``execute_plan``)."""

from __future__ import annotations

from .api import graft
from .plan import Plan, PlanStep, build_plan
from .report import GraftError, GraftReport
from .rules import Rule, parse_rules
from .sides import Side, TensorInfo, unwrap

__all__ = ["GraftError", "GraftReport", "Plan", "PlanStep", "Rule", "Side", "TensorInfo",
           "build_plan", "graft", "parse_rules", "unwrap"]
