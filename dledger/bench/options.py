"""What ``dledger bench cluster`` is asked to do (:class:`Options`), below the phase runners that read it.

Kept apart from :mod:`dledger.bench.cluster` so :mod:`.failover` and :mod:`.pysyncobj_bench` can name the
type without importing the module that imports them (issue #26: no import circles).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PHASES = ("batch", "pipeline", "latency", "failover", "rss", "pysyncobj")
#: The figures issue #6 asks for (2 cores, 3 members on loopback, 1 KiB, sync flush); printed next to results.
TARGETS = {"batch": 80_000, "pipeline": 25_000, "p99_ms": 5.0, "failover_fast_s": 1.0, "failover_default_s": 6.0,
           "rss_mb": 150}


@dataclass
class Options:
    peers: str | None = None
    group: str = "g0"
    store: str | None = None
    flush: str = "sync"
    preset: str = "default"
    size: int = 1024
    duration: float = 5.0
    warmup: float = 1.0
    batch: int = 256
    batch_in_flight: int = 4
    in_flight: int = 256
    rate: int = 10_000
    trials: int = 5
    presets: tuple[str, ...] = ("fast", "default")
    seed: int = 1
    pysyncobj_in_flight: int = 10000
    phases: tuple[str, ...] = PHASES
    directory: str | None = None
    keep: bool = False
    json: bool = False
    java_frames: bool = False
    tls: bool = False
    tls_rounds: int = 3
    java_peer: bool = False
    java_rounds: int = 3
    java_warmup: float = 5.0
    #: Config options of the members the load phases start (``--member-option NAME=VALUE``).
    member_options: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
