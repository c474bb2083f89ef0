"""Report data as aligned text for people (`tally report ... ` without --json)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Table = Callable[[Sequence[dict], Sequence[str]], list[str]]
REVENUE_COLUMNS = ("gross", "refunds", "chargebacks", "fees", "net", "net_after_fees",
                   "payments", "customers")
MRR_COLUMNS = ("mrr", "subscriptions", "customers")
MOVEMENT_COLUMNS = ("month", "from", "to", "start_mrr", "new", "expansion", "contraction",
                    "churn", "reactivation", "end_mrr")
TRAFFIC_COLUMNS = ("visitors", "pageviews", "sessions", "events", "bounce_rate",
                   "avg_session_seconds")


def revenue_lines(data: dict, table: Table) -> list[str]:
    lines = [f"Revenue from {data['from']} to {data['to']} (succeeded payments, by paid_at)"]
    if not data["currencies"]:
        return lines + ["no revenue in this range"]
    for currency, figures in data["currencies"].items():
        rows = [*figures["by_channel"], {"channel": "Total", **figures}]
        lines += ["", currency, *table(rows, ("channel", *REVENUE_COLUMNS))]
    return lines


def mrr_lines(mrr: dict, movements: dict, table: Table) -> list[str]:
    lines = [f"MRR at the end of {mrr['at']} (UTC)"]
    if not mrr["currencies"]:
        lines.append("no counted subscription at that date")
    for currency, figures in mrr["currencies"].items():
        lines += ["", f"{currency}: mrr {figures['mrr']}, arr {figures['arr']}, "
                      f"{figures['subscriptions']} subscriptions, {figures['customers']} customers",
                  *table(figures["by_channel"], ("channel", *MRR_COLUMNS)),
                  "", *table(figures["by_plan"], ("plan", *MRR_COLUMNS))]
    lines += ["", f"MRR movements from {movements['from']} to {movements['to']}"]
    if not movements["currencies"]:
        lines.append("no MRR in this range")
    for currency, report in movements["currencies"].items():
        lines += ["", currency, *table(report["months"], MOVEMENT_COLUMNS)]
    return lines


def traffic_lines(aggregate: dict, breakdown: dict, table: Table) -> list[str]:
    return [f"Traffic from {aggregate['from']} to {aggregate['to']}",
            *table([aggregate], TRAFFIC_COLUMNS),
            "", f"By {breakdown['by']}",
            *table(breakdown["rows"], ("value", "visitors", "pageviews", "events"))]


def timeseries_lines(data: dict, table: Table) -> list[str]:
    columns = ["start", *TRAFFIC_COLUMNS]
    if "goal" in data:
        columns += ["conversions", "conversion_rate", "goal_events"]
    lines = [f"Traffic per {data['interval']} from {data['from']} to {data['to']} (UTC)",
             *table(data["rows"], columns)]
    currencies = sorted({c for r in data["rows"] for c in r["revenue"]})
    for currency in currencies:
        rows = [{"start": r["start"], **r["revenue"].get(currency, {})} for r in data["rows"]]
        lines += ["", currency, *table(rows, ("start", "net", "new_customers", "mrr"))]
    return lines


def goals_lines(data: dict, table: Table) -> list[str]:
    rows = [{**g, "revenue": ", ".join(f"{c} {v['net']}" for c, v in g["revenue"].items())}
            for g in data["goals"]]
    return [f"Goals from {data['from']} to {data['to']} ({data['visitors']} visitors)",
            *table(rows, ("name", "conversions", "events", "conversion_rate", "revenue"))]


def funnel_lines(data: dict, table: Table) -> list[str]:
    name = f" {data['funnel']!r}" if "funnel" in data else ""
    lines = [f"Funnel{name} from {data['from']} to {data['to']}",
             *table(data["steps"], ("step", "visitors", "conversion_rate", "dropoff"))]
    for currency, figures in data.get("revenue", {}).items():
        lines.append(f"{currency}: net {figures['net']} from {figures['customers']} customers")
    return lines


def realtime_lines(data: dict, table: Table) -> list[str]:
    return [f"At {data['at']}: {data['visitors']} visitors in the last 5 minutes "
            f"(events can be up to {data['max_delay_seconds']} s late)",
            "", *table(data["top_pages"], ("page", "visitors", "pageviews")),
            "", *table(data["top_sources"], ("source", "visitors"))]
