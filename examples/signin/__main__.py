"""``python -m examples.signin``: the demo of `make demo`."""

from __future__ import annotations

import sys

from examples.signin.demo import main

sys.exit(main())
