"""``python -m tools.measure.e2e``: the e2e session without the ``tools`` command dispatcher."""

from __future__ import annotations

import sys

from tools.measure.e2e.cli import main

sys.exit(main())
