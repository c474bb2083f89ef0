"""The CPU seconds tests/cpu_profile.py recorded: the total, by module, and the dearest tests."""

from __future__ import annotations

import sys
from collections import Counter


def main(path: str, top: int = 40) -> None:
    tests, modules = Counter(), Counter()
    with open(path) as log:
        for line in log:
            seconds, nodeid = line.rstrip("\n").split(" ", 1)
            tests[nodeid] += float(seconds)
            modules[nodeid.split("::")[0]] += float(seconds)
    total = sum(tests.values())
    print(f"{total:.0f} CPU s over {len(tests)} tests: {total / 2:.0f} s on 2 cores at best")
    print("\nby module:")
    for name, seconds in modules.most_common(top):
        print(f"{seconds:8.1f}  {name}")
    print("\ndearest tests:")
    for name, seconds in tests.most_common(top):
        print(f"{seconds:8.1f}  {name}")


if __name__ == "__main__":
    main(*sys.argv[1:2], *[int(n) for n in sys.argv[2:3]])
