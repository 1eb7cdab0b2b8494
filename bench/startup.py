"""How long an `outbox` command and an application's `import outbox` take to start.

Each round runs, in fresh interpreters and alternately for a baseline (its src/
exported from git) and the working tree: `outbox --help` (the command table
every `outbox` command imports first), `outbox buried list --help`, and
`import outbox` followed by one `new_message` (what a producer pays once).
Reported: the median wall time of ``--runs`` runs of each, in milliseconds,
and current over baseline.

    python -m bench startup [--baseline REF] [--rounds 3] [--runs 5]

Figures and the command that made them live in BENCHMARKS.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.pipeline import REPO, export
from bench.server import arguments

CASES = {
    "outbox --help": ["-m", "outbox.service.cli", "--help"],
    "outbox buried list --help": ["-m", "outbox.service.cli", "buried", "list", "--help"],
    "import outbox": ["-c", "import outbox; outbox.new_message('orders.placed', {})"],
}


def timed(src: Path, args: list[str], runs: int) -> float:
    """Median milliseconds of ``runs`` runs of ``python args`` importing from ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def main() -> int:
    parser = arguments(__doc__, rounds=3, baseline=True)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="outbox-baseline-") as tmp:
        trees = {"baseline": export(args.baseline, Path(tmp)), "current": REPO / "src"}
        print(f"baseline {args.baseline}; current: the working tree; median of {args.runs} runs")
        print("| round | case | baseline ms | current ms | current / baseline |")
        print("| ---: | --- | ---: | ---: | ---: |")
        for r in range(args.rounds):
            for case, argv in CASES.items():
                got = {name: timed(src, argv, args.runs) for name, src in trees.items()}
                print(
                    f"| {r + 1} | `{case}` | {got['baseline']:.0f} | {got['current']:.0f}"
                    f" | {got['current'] / got['baseline']:.2f}x |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
