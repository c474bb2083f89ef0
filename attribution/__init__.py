"""Sources, channels, sessions and first-touch attribution."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from attribution.channels import classify_channel
from attribution.sources import resolve_source


@dataclass(frozen=True)
class Touch:
    """A session's source and channel, decided by its first event."""

    source: str | None
    channel: str


def classify_visit(
    referrer_host: str | None,
    utm: dict[str, str | None],
    click_ids: Iterable[str] = (),
    site_hosts: Collection[str] = (),
) -> Touch:
    clicks = tuple(click_ids)
    source = resolve_source(referrer_host, utm.get("utm_source"), clicks, site_hosts)
    channel = classify_channel(
        source.name if source else None,
        utm.get("utm_medium"),
        utm.get("utm_campaign"),
        clicks,
        source.category if source else None,
    )
    return Touch(source.name if source else None, channel)
