"""The soak's faults: a schedule drawn from a seed alone, so every stage of a run meets the same one.

Each kind is its own Poisson process at a rate per minute (``Rates``), drawn from a generator
seeded with ``"<seed>:<kind>"`` (a string seed is hashed with SHA-512 by ``random``, the same on
every machine and Python): changing one kind's rate leaves the others' times where they were.
A fault carries ``pick``, a number fixed by the seed that chooses its target among the live
candidates at the moment it lands (``choose``: the candidates sorted by pid, ``pick`` modulo their
count), and for ``pause-api`` how long the api-server stays stopped, for ``restart-db`` how long
PostgreSQL stays down.

Which process is live when a fault lands is up to the stack, not the seed: the schedule (times,
kinds, picks, pauses) is exact on replay, the pid it hits is the ``pick``-th of what is there.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

KILL_WORKER = "kill-worker"  # SIGKILL a LocalExecutor worker (a busy one if any is busy)
KILL_TASK = "kill-task"  # SIGKILL a task process (a worker's child)
RESTART_SCHEDULER = "restart-scheduler"  # SIGTERM the scheduler, wait for it, start it again
PAUSE_API = "pause-api"  # SIGSTOP the api-server's process group, SIGCONT it after ``pause_s``
RESTART_DB = "restart-db"  # stop PostgreSQL (fast shutdown), start it again ``pause_s`` later
KINDS = (KILL_WORKER, KILL_TASK, RESTART_SCHEDULER, PAUSE_API, RESTART_DB)

# Faults per minute of each kind when --fault-rate is not given: 11/min, so a 10-minute soak
# meets about 110. A scheduler restart costs the machine a scheduler start-up (~10 s of one core
# here), so it is the rarest; killing a task or a worker costs a retry.
# A database restart is asked for by name (``--fault-rate restart-db=0.5``): at 0 by default, so a
# bare total spreads as it did before the kind existed and an old seed replays the same schedule.
DEFAULT_RATES: dict[str, float] = {
    KILL_WORKER: 4.0,
    KILL_TASK: 4.0,
    PAUSE_API: 2.0,
    RESTART_SCHEDULER: 1.0,
    RESTART_DB: 0.0,
}
PAUSE_RANGE_S = (2.0, 6.0)  # how long a pause-api keeps the api-server stopped (uniform)
DB_DOWN_RANGE_S = (2.0, 10.0)  # how long a restart-db keeps PostgreSQL down (uniform)
WARMUP_S = 10.0  # no fault before this many seconds into the soak: the first runs get going


class FaultRateError(ValueError):
    """A --fault-rate the schedule cannot use; the message says which part and why."""


@dataclass(frozen=True)
class Fault:
    t: float  # seconds after the soak's start
    kind: str
    pick: int  # chooses the target among the live candidates (``choose``)
    pause_s: float = 0.0  # pause-api: the api-server stopped; restart-db: the database down

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_rates(items: Sequence[str]) -> dict[str, float]:
    """``--fault-rate`` values: ``KIND=PER_MIN`` (repeatable; kinds not named keep their default),
    or one bare number, the total per minute spread over the kinds in the defaults' proportions."""
    rates = dict(DEFAULT_RATES)
    for item in items:
        kind, sep, value = item.partition("=")
        text = value if sep else kind
        try:
            rate = float(text)
        except ValueError:
            raise FaultRateError(
                f"--fault-rate {item!r}: {text!r} is not a number of faults per minute"
            ) from None
        if rate < 0:
            raise FaultRateError(f"--fault-rate {item!r}: a rate is at least 0")
        if not sep:
            total = sum(DEFAULT_RATES.values())
            rates = {k: rate * v / total for k, v in DEFAULT_RATES.items()}
        elif kind not in KINDS:
            raise FaultRateError(f"--fault-rate {item!r}: no fault kind {kind!r} (kinds: {', '.join(KINDS)})")
        else:
            rates[kind] = rate
    return rates


def schedule(seed: int, duration: float, rates: Mapping[str, float], warmup: float = WARMUP_S) -> list[Fault]:
    """Every fault of a soak of ``duration`` seconds, in time order (ties: in ``KINDS`` order)."""
    out: list[Fault] = []
    for kind in KINDS:
        per_min = rates.get(kind, 0.0)
        if per_min <= 0:
            continue
        rng = random.Random(f"{seed}:{kind}")
        t = warmup
        while True:
            t += rng.expovariate(per_min / 60.0)
            if t >= duration:
                break
            pick = rng.getrandbits(32)
            pause = 0.0
            if kind == PAUSE_API:
                pause = round(rng.uniform(*PAUSE_RANGE_S), 2)
            elif kind == RESTART_DB:
                pause = round(rng.uniform(*DB_DOWN_RANGE_S), 2)
            out.append(Fault(round(t, 3), kind, pick, pause))
    return sorted(out, key=lambda f: (f.t, KINDS.index(f.kind)))


def counts(faults: Sequence[Fault]) -> dict[str, int]:
    """How many of each kind, every kind named."""
    return {k: sum(1 for f in faults if f.kind == k) for k in KINDS}


T = TypeVar("T")


def choose(pick: int, candidates: Sequence[T], key: Any = None) -> T | None:
    """The ``pick``-th candidate (modulo their number) in a stable order; None when there is none."""
    if not candidates:
        return None
    ordered = sorted(candidates, key=key) if key is not None else sorted(candidates)  # type: ignore[type-var]
    return ordered[pick % len(ordered)]
