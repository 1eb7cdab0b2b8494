"""Example applications of the outbox: runnable, tested, not part of the package."""
