"""Plans and their monthly event allowances (spec: Limits, Monthly event quota)."""

from __future__ import annotations

from dataclasses import dataclass

from vocabulary import PLAN_NAMES


@dataclass(frozen=True)
class Plan:
    name: str
    allowance: int
    cap: int

    def anonymous_limit(self, keyed_reserve_percent: int) -> int:
        """The monthly count past which anonymous events (POST /api/v1/collect) are refused:
        the cap minus a reserve of `keyed_reserve_percent` of the allowance, which only
        keyed traffic (POST /api/v1/events) can spend."""
        return self.cap - self.allowance * keyed_reserve_percent // 100


PLANS: dict[str, Plan] = {
    "free": Plan("free", 10_000, 11_000),
    "starter": Plan("starter", 100_000, 200_000),
    "growth": Plan("growth", 1_000_000, 2_000_000),
    "scale": Plan("scale", 10_000_000, 20_000_000),
}
assert tuple(PLANS) == PLAN_NAMES, "quota.plans.PLANS and vocabulary.PLAN_NAMES differ"
