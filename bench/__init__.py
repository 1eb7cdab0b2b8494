"""The benchmarks: `python -m bench <name> [options]` (see BENCHMARKS.md).

Each module is one benchmark with a ``main()``; every one takes
``--database-url`` (default: OUTBOX_BENCH_DATABASE_URL, else an embedded
PostgreSQL for the run), and those with rounds or a comparison ``--rounds``
and ``--baseline REV``. Not part of the wheel; imports nothing from tests/.
"""
