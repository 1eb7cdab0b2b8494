"""The process: settings, the `outbox` command, probes, logs, the embedded PostgreSQL.

Everything here serves `outbox relay`, `outbox controller` and the operator
commands; the library (messages, stores, the relay) imports none of it.
"""
