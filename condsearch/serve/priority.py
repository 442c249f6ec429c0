"""CPU priorities of the server's threads: a stranger's heavy work takes the CPU that quick queries leave.

Linux niceness is per thread, and a thread's workers (torch's OpenMP team, a thread pool it starts)
inherit it when they are made. The server runs builds on demand and the heavy lane of its batcher
(:class:`condsearch.serve.batching.Lanes`: embeddings, queries of many parts) on threads niced by
``BACKGROUND_NICE``, and light requests (a known query of a few words) at the server's own priority,
so a flood of heavy requests leaves a known query's latency close to what it was (issue 58). Where
the system forbids it (a sandbox, another OS), every thread runs at the server's priority.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: how much lower (in nice values) heavy work runs than light requests: at 10 a busy light thread gets
#: about 90% of a core both want (Linux's weights for nice 0 and 10, 1024 and 110)
BACKGROUND_NICE = 10


def lower_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Lower the calling thread's CPU priority by ``nice`` (where the system allows it; elsewhere nothing)."""
    if not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:  # a sandbox that forbids it: the thread runs at the queries' priority
        log.debug("cannot lower a thread's priority (%s)", exc)
