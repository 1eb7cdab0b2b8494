"""``python -m outbox.service.cli``: the `outbox` command."""

from __future__ import annotations

import sys

from outbox.service.cli import main

sys.exit(main())
