"""Named fault-injection points for crash-consistency tests.

A failpoint is a call ``failpoint("checkpoint.before_rename")`` placed before or after a write
or rename. In normal runs it is a dictionary lookup and nothing else. When the environment
variable ``MINIVERL_FAILPOINT`` names it, the process dies on the spot with ``os._exit`` (no
``finally`` blocks, no flushes: the closest a test can get to ``kill -9`` at an exact line), so a
test can kill a run at every failpoint and then check that ``--resume`` recovers.

Standard library only, so every layer may call it.
"""

from __future__ import annotations

import os

FAILPOINT_ENV = "MINIVERL_FAILPOINT"
FAILPOINT_EXIT_CODE = 86


def failpoint(name: str) -> None:
    """Die with exit code :data:`FAILPOINT_EXIT_CODE` if ``$MINIVERL_FAILPOINT == name``."""
    if os.environ.get(FAILPOINT_ENV) == name:
        os._exit(FAILPOINT_EXIT_CODE)
