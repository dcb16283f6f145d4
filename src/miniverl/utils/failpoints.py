"""Named fault-injection points for crash-consistency tests.

A failpoint is a call ``failpoint("checkpoint:final:staged")`` placed before or after a write
or rename. In normal runs it is a dictionary lookup and nothing else. Three environment
variables arm it:

- ``MINIVERL_FAILPOINT=<name>`` (or ``<name>@<n>``, the n-th time that point is reached): the
  process dies on the spot with ``os._exit`` (no ``finally`` blocks, no flushes: the closest a
  test can get to ``kill -9`` at an exact line), so a test can kill a run at every failpoint
  and then check that ``--resume`` recovers;
- ``MINIVERL_FAILPOINT_ENOSPC=<name>[@<n>]``: an ``OSError(ENOSPC)`` is raised there instead,
  as a full disk would, to test that a full disk is a clean, resumable error;
- ``MINIVERL_FAILPOINT_TRACE=<file>``: every failpoint reached is appended to ``<file>``, one
  name per line, so a test can enumerate the points a run passes through.

Standard library only, so every layer may call it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

FAILPOINT_ENV = "MINIVERL_FAILPOINT"
FAILPOINT_ENOSPC_ENV = "MINIVERL_FAILPOINT_ENOSPC"
FAILPOINT_TRACE_ENV = "MINIVERL_FAILPOINT_TRACE"
FAILPOINT_EXIT_CODE = 86

_hits: dict[str, int] = {}


def _armed(spec: str | None, name: str, count: int) -> bool:
    if not spec:
        return False
    target, _, nth = spec.partition("@")
    return target == name and (not nth or int(nth) == count)


def failpoint(name: str, *, before_exit: Callable[[], None] | None = None) -> None:
    """Die with :data:`FAILPOINT_EXIT_CODE` (or raise ENOSPC) if this point is armed.

    ``before_exit`` runs just before dying: e.g. an append writes half its line first, so a
    test sees the torn line a real crash mid-write leaves.
    """
    kill = os.environ.get(FAILPOINT_ENV)
    enospc = os.environ.get(FAILPOINT_ENOSPC_ENV)
    trace = os.environ.get(FAILPOINT_TRACE_ENV)
    if not (kill or enospc or trace):
        return
    count = _hits[name] = _hits.get(name, 0) + 1
    if trace:
        with open(trace, "a", encoding="utf-8") as handle:
            handle.write(name + "\n")
    if _armed(kill, name, count):
        if before_exit is not None:
            before_exit()
        os._exit(FAILPOINT_EXIT_CODE)
    if _armed(enospc, name, count):
        if before_exit is not None:
            before_exit()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"<failpoint {name}>")
