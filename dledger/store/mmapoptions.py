"""The options of an mmap store (:class:`dledger.store.mmapfile.MmapLogStore`), checked once, as one value.

A store used to take them as a dozen keyword arguments next to its
collaborators (clock, blocking I/O, disk-usage probe); grouping them keeps
the store's constructor about what it is wired to, and gives the config
mapping one place (:meth:`MmapStoreOptions.from_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dledger.config import FLUSH_POLICIES, GiB, MiB
from dledger.entry import HEADER_SIZE, INDEX_UNIT_SIZE, MIN_BLANK_LEN
from dledger.store.retention import RetentionPolicy


@dataclass(frozen=True)
class MmapStoreOptions:
    """How an mmap store lays out and looks after its files (defaults: Java DLedger's).

    ``full_verify`` makes start-up verify every entry instead of starting at
    the checkpoint; ``release_flushed_pages`` unmaps flushed pages so RSS does
    not grow with the log; ``truncate_damaged`` is the operator's permission
    to cut a damaged log (see :mod:`dledger.store.recovery`).  ``flush_rounds`` is how many group-commit
    rounds may run at once (2: the next round's fdatasync is issued while the previous one runs, rounds
    still complete in order; 1: one at a time, as before issue #28's round 2b).  ``retention``
    None means the default policy.  Bad sizes or an unknown flush policy
    raise ValueError when the options are built.
    """

    data_file_size: int = 1 * GiB
    index_file_size: int = 160 * MiB
    max_entry_size: int = 4 * MiB
    flush_policy: str = "sync"
    flush_interval_ms: int = 10
    checkpoint_interval_ms: int = 3000
    clean_interval_ms: int = 1000
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    accept_zero_crc: bool = False
    full_verify: bool = False
    release_flushed_pages: bool = True
    truncate_damaged: bool = False
    flush_rounds: int = 2

    def __post_init__(self) -> None:
        if self.index_file_size <= 0 or self.index_file_size % INDEX_UNIT_SIZE:
            raise ValueError(f"index file size {self.index_file_size} is not a positive multiple of "
                             f"{INDEX_UNIT_SIZE}")
        if self.data_file_size < HEADER_SIZE + MIN_BLANK_LEN:
            raise ValueError(f"data file size {self.data_file_size} cannot hold an entry")
        if self.flush_policy not in FLUSH_POLICIES:
            raise ValueError(f"flush policy {self.flush_policy!r} is not one of {FLUSH_POLICIES}")
        if self.flush_rounds not in (1, 2):
            raise ValueError(f"flush rounds {self.flush_rounds} is not 1 or 2")
        if self.retention is None:
            object.__setattr__(self, "retention", RetentionPolicy())

    @classmethod
    def from_config(cls, config) -> MmapStoreOptions:
        """The options a member's :class:`dledger.config.DLedgerConfig` asks for."""
        return cls(data_file_size=config.mapped_file_size_for_entry_data,
                   index_file_size=config.mapped_file_size_for_entry_index,
                   max_entry_size=config.max_entry_size, flush_policy=config.flush_policy,
                   flush_interval_ms=config.flush_file_interval, checkpoint_interval_ms=config.check_point_interval,
                   retention=RetentionPolicy.from_config(config), accept_zero_crc=config.accept_java_zero_crc,
                   truncate_damaged=config.truncate_damaged)
