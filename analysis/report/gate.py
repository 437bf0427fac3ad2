"""Comparing a run with a baseline, metric by metric, and the `--fail-if METRIC:LIMIT` rules of the CI gate.

A rule is `METRIC:+10%` (relative to the baseline), `METRIC:+2` (absolute, in the metric's unit) or the
same with `-`. The sign says which way is a regression: `+` fails when the new value is above the
baseline by more than the limit, `-` when it is below by more. Without a sign, the metric's bad direction
is taken: up for times, down for overlap_pct. The metric is everything before the last colon, so per
collective kind metrics (`comm_ms:all_reduce`) take rules too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

HIGHER_IS_BETTER = frozenset({"overlap_pct"})
LIMIT = re.compile(r"^(?P<sign>[+-]?)(?P<value>\d+(?:\.\d*)?|\.\d+)(?P<pct>%?)$")


@dataclass(frozen=True)
class Rule:
    """Fail when `metric` moved `direction` (+1 up, -1 down) by more than `limit` (a fraction when relative)."""

    metric: str
    limit: float
    relative: bool
    direction: int
    text: str


def parse_rule(text: str) -> Rule:
    """A Rule from `METRIC:[+|-]N[%]`; ValueError naming what is wrong."""
    metric, sep, limit = text.rpartition(":")
    m = LIMIT.match(limit.strip())
    if not sep or not metric or m is None:
        raise ValueError(f"--fail-if {text!r}: expected METRIC:LIMIT, e.g. exposed_comm_ms:+10% or step_ms:+5")
    sign = m.group("sign") or ("-" if metric in HIGHER_IS_BETTER else "+")
    value = float(m.group("value"))
    relative = bool(m.group("pct"))
    return Rule(metric, value / 100 if relative else value, relative, 1 if sign == "+" else -1, text)


def change(new: float, base: float) -> tuple[float, float]:
    """(new - base, (new - base) / base); the relative change is NaN when the baseline is 0 or missing."""
    delta = new - base
    return delta, delta / base if base and not math.isnan(base) else math.nan


def breached(rule: Rule, new: float, base: float) -> bool:
    """Whether the move from base to new goes past the rule's limit in its direction (a missing value never does)."""
    if math.isnan(new) or math.isnan(base):
        return False
    moved = (new - base) * rule.direction
    if rule.relative:
        return moved > rule.limit * abs(base) if base else moved > 0
    return moved > rule.limit


def unknown_metrics(rules: list[Rule], known: Mapping[str, float]) -> list[str]:
    return [r.metric for r in rules if r.metric not in known]
