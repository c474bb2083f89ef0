"""CPU per visit of the source and channel lookup (attribution.classify_visit), in-process.

    .venv/bin/python -m bench.source_cost [--rounds 20] [--runs 5]

Classifies every referrer URL of tests/data/referrers.tsv (by its host, as the flush
does) and every entry of Google's list as utm_source, `--rounds` times per run, with no
memo (the flush memoizes per batch, so this is the cost of a batch's first sight of a
referrer or utm_source). Prints the fastest run per kind, in microseconds per visit.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from attribution import classify_visit
from attribution.build_sources import GOOGLE_LIST
from enrichment.urls import url_host

REFERRERS = Path(__file__).resolve().parent.parent / "tests" / "data" / "referrers.tsv"
SITE_HOSTS = ("example.com", "www.example.com")


def _inputs() -> dict[str, list[tuple[str | None, dict]]]:
    with open(REFERRERS, encoding="utf-8", newline="") as handle:
        lines = (line for line in handle if not line.startswith("#"))
        referrers = [row["referrer"] for row in csv.DictReader(lines, delimiter="\t")]
    with open(GOOGLE_LIST, encoding="utf-8", newline="") as handle:
        sources = [row["source"] for row in csv.DictReader(handle)]
    return {
        "referrer": [(url_host(url), {}) for url in referrers],
        "utm_source": [(None, {"utm_source": source}) for source in sources],
    }


def _run(visits: list[tuple[str | None, dict]], rounds: int) -> float:
    start = time.thread_time()
    for _ in range(rounds):
        for host, utm in visits:
            classify_visit(host, utm, (), SITE_HOSTS)
    return (time.thread_time() - start) / (rounds * len(visits)) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    classify_visit(None, {}, (), SITE_HOSTS)  # loads the source data once
    for kind, visits in _inputs().items():
        best = min(_run(visits, args.rounds) for _ in range(args.runs))
        print(f"{kind:>10}: {best:6.2f} us CPU per visit ({len(visits)} distinct visits)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
