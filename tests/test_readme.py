"""README is the contract outside tests rely on: every command and variable must be in it."""

from __future__ import annotations

import re
from pathlib import Path

from cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _commands(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                has_children = any(a.__class__.__name__ == "_SubParsersAction" for a in sub._actions)
                if has_children:
                    yield from _commands(sub, prefix + (name,))
                else:
                    yield " ".join(prefix + (name,))


def test_every_cli_command_is_in_readme():
    commands = list(_commands(build_parser()))
    assert len(commands) >= 9
    for command in commands:
        assert f"`tally {command}" in README, f"README lacks `tally {command}`"


def test_every_tally_env_var_is_in_readme():
    names = set()
    for path in REPO.glob("*.py"):
        names |= set(re.findall(r"TALLY_[A-Z_]+", path.read_text()))
    assert "TALLY_DB" in names
    for name in names:
        assert f"`{name}`" in README, f"README lacks {name}"


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make run" in first_screen and "make test" in first_screen
