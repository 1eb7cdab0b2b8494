"""`python -m bench <name> [options]`: run one benchmark; without a name, list them."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

HELPERS = {"server", "hold_handler"}
"""Modules of the package that are not benchmarks."""


def names() -> list[str]:
    """The benchmarks' names."""
    found = pkgutil.iter_modules([str(Path(__file__).parent)])
    return sorted(i.name for i in found if not i.name.startswith("_") and i.name not in HELPERS)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in {"-h", "--help"}:
        print("python -m bench <name> [options]: run one benchmark (--help: its options)\n")
        for name in names():
            doc = importlib.import_module(f"bench.{name}").__doc__ or ""
            print(f"  {name:<16} {doc.strip().splitlines()[0]}")
        return 0
    name = sys.argv[1]
    if name not in names():
        print(f"python -m bench: no benchmark {name!r} (see python -m bench)", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {name}", *sys.argv[2:]]
    result: int | None = importlib.import_module(f"bench.{name}").main()
    return result or 0


if __name__ == "__main__":
    sys.exit(main())
