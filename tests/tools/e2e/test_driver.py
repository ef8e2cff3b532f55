"""Pieces of the e2e driver that need no Airflow."""

from __future__ import annotations

import os
import threading

from tools.e2e import driver


def test_urgent_raises_the_calling_thread_only_and_restores_it() -> None:
    seen: dict[str, int] = {}

    def probe() -> None:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        with driver._urgent():
            seen["inside"] = os.getpriority(os.PRIO_PROCESS, 0)
            seen["main"] = os.getpriority(os.PRIO_PROCESS, main_tid)
        seen["before"], seen["after"] = before, os.getpriority(os.PRIO_PROCESS, 0)

    main_tid = threading.get_native_id()
    main_before = os.getpriority(os.PRIO_PROCESS, 0)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert seen["after"] == seen["before"]
    assert seen["main"] == main_before  # Linux nice is per thread: the rest of the driver is untouched
    if os.geteuid() == 0:
        assert seen["inside"] == -20
    else:  # not allowed to raise it: left as it was, and no error
        assert seen["inside"] == seen["before"]
