"""A funnel's figures for one site over a range.

A visitor reaches step 1 with a visit started in the range that has step 1, and step n
when, in one such visit, they reached step n-1 and then did step n (a later event: by
time, then by storage order). `payment` is the exception: a succeeded charge, dated after
the visit reached the step before and within the range, of a customer linked to the
visit's visitor. Visitors are distinct visitor ids over the whole range.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import NamedTuple

from reports.funnels import queries
from reports.funnels.steps import Step
from reports.money.amounts import exact_decimals, ratio, round_money
from reports.money.queries import revenue_rows
from reports.segments.filters import Filter
from reports.segments.queries import Segment, resolve
from reports.shared.params import DAY_MS, DateRange
from storage.db import Database


class StepMatch(NamedTuple):
    """What does a step: an event of this name and, for a page step, one of these paths."""

    name: str
    paths: frozenset[str] | None = None


def step_matches(steps: Sequence[Step], stored_paths: Iterable[str]) -> list[StepMatch]:
    """Each step's match, its `*` pattern tested once against each stored path rather than
    against every event."""
    patterns = [s for s in steps if s.is_pattern]
    matching = {s: set() for s in patterns}
    for path in stored_paths if patterns else ():
        for s in patterns:
            if s.path_matches(path):
                matching[s].add(path)
    return [StepMatch(s.value) if s.kind == "goal" else
            StepMatch("pageview", frozenset(matching[s] if s.is_pattern else {s.value}))
            for s in steps]


def visit_progress(events: Iterable[queries.StepEvent], steps: Sequence[StepMatch]
                   ) -> dict[int, tuple[int, int, int]]:
    """Per visit: (visitor id, steps reached in order, time the last of them was reached),
    for the visits that reached step 1. `steps` holds no payment step."""
    progress: dict[int, tuple[int, int, int]] = {}
    last = len(steps)
    for e in events:
        visitor, reached, _ = progress.get(e.session_id, (e.visitor_id, 0, 0))
        if reached == last:
            continue
        step = steps[reached]
        if e.name == step.name and (step.paths is None or e.pathname in step.paths):
            progress[e.session_id] = (visitor, reached + 1, e.ts)
    return progress


def figures(steps: Sequence[Step], visitors_per_step: Sequence[int]) -> list[dict]:
    """Per step: its visitors, `conversion_rate` from step 1, and `dropoff` (visitors lost
    since the step before) with `dropoff_rate` (their share of the step before's)."""
    first = visitors_per_step[0] if visitors_per_step else 0
    rows = []
    for i, (step, visitors) in enumerate(zip(steps, visitors_per_step, strict=True)):
        before = visitors_per_step[i - 1] if i else visitors
        rows.append({"step": step.text(), "visitors": visitors,
                     "conversion_rate": ratio(visitors, first),
                     "dropoff": before - visitors,
                     "dropoff_rate": ratio(before - visitors, before)})
    return rows


def net_revenue(payments, customers: set[str]) -> dict[str, dict]:
    """Per currency, the net revenue (charges less refunds and chargebacks) of the
    customers and how many of them it counts."""
    totals: dict[str, dict] = {}
    with exact_decimals():
        per_customer: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for p in payments:
            if p.customer_id in customers:
                sign = 1 if p.kind == "charge" else -1
                per_customer[(p.currency, p.customer_id)] += sign * p.amount * p.count
        for (currency, _), amount in sorted(per_customer.items()):
            entry = totals.setdefault(currency, {"net": Decimal(0), "customers": 0})
            entry["net"] += amount
            entry["customers"] += 1
    return {currency: {"net": round_money(e["net"], currency), "customers": e["customers"]}
            for currency, e in sorted(totals.items())}


def funnel(db: Database, site_id: int, period: DateRange, steps: Sequence[Step],
           filters: tuple[Filter, ...] = ()) -> dict:
    """The funnel's `steps` figures and, when it ends in payment, `revenue` per currency."""
    conn = db.conn()
    start, end = period.start_ms, period.end_ms
    visit_steps = [s for s in steps if s.kind != "payment"]
    stored = (queries.pathnames(conn, site_id, start, end + DAY_MS)
              if any(s.is_pattern for s in visit_steps) else ())
    matches = step_matches(visit_steps, stored)
    paths = set().union(*(m.paths for m in matches if m.paths is not None))
    names = {m.name for m in matches if m.paths is None}
    segment = None
    if filters:
        segment = Segment(resolve(conn, site_id, filters, start, end + DAY_MS), None)
    progress = visit_progress(
        queries.step_events(conn, site_id, start, end, names, paths, segment, DAY_MS),
        matches)
    reached: list[set[int]] = [set() for _ in steps]
    for visitor, count, _ in progress.values():
        for i in range(count):
            reached[i].add(visitor)
    answer: dict = {}
    if steps[-1].kind == "payment":
        last = len(visit_steps)
        ready = {visit: (visitor, at) for visit, (visitor, count, at) in progress.items()
                 if count == last}
        linked = queries.visit_customers(conn, site_id, set(ready))
        paid_at: dict[str, list[int]] = defaultdict(list)
        for customer, at in queries.charges(conn, site_id, start, end,
                                            {c for _, c in linked}):
            paid_at[customer].append(at)
        paying: set[str] = set()
        for visit, customer in linked:
            visitor, at = ready[visit]
            if any(t > at for t in paid_at.get(customer, ())):
                reached[-1].add(visitor)
                paying.add(customer)
        answer["revenue"] = net_revenue(revenue_rows(conn, site_id, start, end), paying)
    return {"steps": figures(steps, [len(r) for r in reached]), **answer}
