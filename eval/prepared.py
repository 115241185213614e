"""What a snippet becomes before it runs: the files of its program, the command, what was adapted,
or a reason not to run it (`eval/programs.py` builds one per snippet kind)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DRIVERS = Path(__file__).resolve().parent / "drivers"


@dataclass
class Prepared:
    files: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    adaptations: list[str] = field(default_factory=list)
    skip: str = ""  # a reason not to run
    expect_unknown_keys: list[str] = field(default_factory=list)  # fail the run naming these


def driver(name: str) -> str:
    """The text of one of our driver programs (`eval/drivers/`), written into the run's folder."""
    return (DRIVERS / name).read_text(encoding="utf-8")
