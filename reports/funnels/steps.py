"""The steps of a funnel and its name, checked without SQL.

A step is `page:/PATH` (a pageview of that pathname; `*` matches any run of characters,
none included), `goal:NAME` (a custom event of that name) or `payment` (a succeeded charge
of a customer linked to the visitor; only as the last step). `steps=` lists 2 to 8 of
them separated by commas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reports.shared.params import InvalidReportParameter

MIN_STEPS = 2
MAX_STEPS = 8
MAX_STEP_LENGTH = 500
_NAME = re.compile(r"[^\x00-\x1f/\ud800-\udfff]{1,100}")
_GOAL = re.compile(r"[^\x00-\x1f\ud800-\udfff]{1,64}")
_PATH = re.compile(r"/[^\x00-\x1f\ud800-\udfff]*")
HOW = "write page:/PATH (* matches any characters), goal:NAME or payment"


@dataclass(frozen=True)
class Step:
    kind: str  # "page", "goal" or "payment"
    value: str = ""  # the path pattern or the event name

    def text(self) -> str:
        return "payment" if self.kind == "payment" else f"{self.kind}:{self.value}"

    @property
    def is_pattern(self) -> bool:
        return self.kind == "page" and "*" in self.value

    def path_matches(self, path: str) -> bool:
        """Whether a pageview's pathname is this page step's (exact, or by its pattern)."""
        if not self.is_pattern:
            return path == self.value
        return _pattern(self.value).fullmatch(path) is not None


def _pattern(value: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.S)


def parse_step(raw: str) -> Step:
    text = raw.strip()
    if text == "payment":
        return Step("payment")
    kind, colon, value = text.partition(":")
    if not colon or kind not in ("page", "goal"):
        raise InvalidReportParameter(f"steps: {raw!r} is not a step; {HOW}")
    if len(value) > MAX_STEP_LENGTH:
        raise InvalidReportParameter(
            f"steps: {kind}: takes at most {MAX_STEP_LENGTH} characters")
    if kind == "page" and not _PATH.fullmatch(value):
        raise InvalidReportParameter(
            f"steps: {text!r} must name a path starting with / (no control characters)")
    if kind == "goal" and (not _GOAL.fullmatch(value) or value in ("pageview", "$identify")):
        raise InvalidReportParameter(
            f"steps: {text!r} must name a custom event (1 to 64 characters)")
    return Step(kind, value)


def check_steps(raw: Sequence[str]) -> tuple[Step, ...]:
    """The steps of a list (a stored funnel's, or `steps=` split on commas)."""
    if not MIN_STEPS <= len(raw) <= MAX_STEPS:
        raise InvalidReportParameter(
            f"steps: a funnel has {MIN_STEPS} to {MAX_STEPS} steps, not {len(raw)}")
    steps = tuple(parse_step(str(r)) for r in raw)
    if any(s.kind == "payment" for s in steps[:-1]):
        raise InvalidReportParameter("steps: payment can only be the last step")
    return steps


def parse_steps(params: Mapping[str, object]) -> tuple[Step, ...] | None:
    """`steps=` split on commas; None when absent."""
    raw = params.get("steps")
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        raise InvalidReportParameter("steps: give it once, the steps separated by commas")
    return check_steps(str(raw).split(","))


def check_name(raw: object) -> str:
    name = str(raw).strip() if isinstance(raw, str) else ""
    if not _NAME.fullmatch(name):
        raise InvalidReportParameter(
            "name: a funnel's name has 1 to 100 characters, no / and no control characters")
    return name
