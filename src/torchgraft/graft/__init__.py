"""Grafting: plan on metadata (``build_plan``), then execute (``execute_plan``)."""

from __future__ import annotations

from ..renames import Rule
from .api import graft
from .layouts.rules import parse_rules
from .plan.build import build_plan
from .plan.steps import Plan, PlanStep
from .report.report import GraftError, GraftReport
from .sides.model import unwrap
from .tensors import Side, TensorInfo

__all__ = ["GraftError", "GraftReport", "Plan", "PlanStep", "Rule", "Side", "TensorInfo",
           "build_plan", "graft", "parse_rules", "unwrap"]
