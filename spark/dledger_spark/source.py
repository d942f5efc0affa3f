"""The PySpark data source ``dledger``: batch and micro-batch reads of the committed entries of dledger groups.

    spark.dataSource.register(DLedgerDataSource)       # or dledger_spark.register(spark)
    df = spark.read.format("dledger").option("peers", "n0-127.0.0.1:20911;...").option("group", "g0").load()
    stream = spark.readStream.format("dledger").option(...).load()

Planning (``partitions``, ``latestOffset``) runs in a Python process on the driver and asks each group's
leader for its committed index; ``read`` runs on executors (:mod:`dledger_spark.reader`).  Options and
their meaning: :mod:`dledger_spark.options`, README "Spark ingest".
"""

from __future__ import annotations

import time

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from dledger.config import parse_peers
from dledger.errors import ConfigError, DLedgerError
from dledger_spark.options import SourceOptions, parse_options
from dledger_spark.planning import (
    empty_by_options,
    entries_per_partition,
    foreign_groups,
    metadata_problem,
    no_leader_message,
    resolve_end,
    resolve_start,
    split,
)
from dledger_spark.reader import Partition, SourceError, read_partition
from dledger_spark.schema import ddl

#: Entry size assumed when a range cannot be measured.
DEFAULT_ENTRY_SIZE = 1024 + 48
#: Seconds each member is given to answer the first METADATA of a planner (Planner.probe).
PROBE_TIMEOUT = 5.0


class Planner:
    """Driver-side questions to the groups: leaders' committed indexes, entry sizes, followers."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._clients: dict[str, object] = {}
        self._closed_at_once: set[str] = set()  # groups whose members closed a plain connection at once

    def client(self, group: str):
        """The driver's client of ``group`` (with the read's credentials), checked once when made."""
        from dledger.blocking import BlockingClient

        client = self._clients.get(group)
        if client is None:
            try:
                credentials = self.opts.credentials.build(group)
            except ConfigError as exc:
                raise SourceError(f"dledger source: credentials: {exc}") from None
            client = BlockingClient(self.opts.groups[group], group, timeout=self.opts.timeout,
                                    credentials=credentials)
            try:
                self.probe(group, client)
            except BaseException:
                client.close()
                raise
            self._clients[group] = client
        return client

    def probe(self, group: str, client) -> None:
        """One METADATA to each member: a wrong group, wrong member ids or missing credentials fail at once.

        Without it each of them looks like a group with no leader, waited for until ``timeout``.  Members
        are asked one by one (a single attempt each), so a member that closes the connection at once --
        a TLS port reached in plain TCP -- is seen as such, not as a timeout.
        """
        for member in parse_peers(self.opts.groups[group]):
            try:
                meta, code, error = client.metadata(member, timeout=min(self.opts.timeout, PROBE_TIMEOUT)), None, ""
            except DLedgerError as exc:
                meta, code, error = None, exc.code, str(exc)
                self._note(group, exc)
            problem = metadata_problem(group, self.opts.groups[group], code or meta.response_code, meta, error)
            if problem is not None:
                raise SourceError(problem)

    def leader_meta(self, group: str):
        """The leader's detailed metadata; a one-line SourceError if the group has no leader for ``timeout`` s.

        An election (a leader killed while a query plans) is waited out: the client's own search gives up
        after ~13 s of pauses, so it is asked again until the option ``timeout`` has passed.
        """
        deadline = time.monotonic() + self.opts.timeout
        while True:
            try:
                meta = self.client(group).find_leader()
                problem = metadata_problem(group, self.opts.groups[group], meta.response_code, meta)
                if problem is not None:
                    raise SourceError(problem)
                return meta
            except DLedgerError as exc:
                if exc.code.name in ("NOT_AUTHORIZED", "UNKNOWN_GROUP", "UNKNOWN_MEMBER"):
                    raise SourceError(metadata_problem(group, self.opts.groups[group], exc.code)) from None
                self._note(group, exc)
                if time.monotonic() >= deadline:
                    raise SourceError(no_leader_message(group, self.opts.groups[group], self.opts.timeout, str(exc),
                                                        group in self._closed_at_once)) from None
                time.sleep(0.1)  # allowed: Spark-side blocking retry pause

    def _note(self, group: str, exc: DLedgerError) -> None:
        if not self.opts.credentials.tls_ca and "closed cleanly" in str(exc):
            self._closed_at_once.add(group)

    def metas(self) -> dict:
        return {g: self.leader_meta(g) for g in self.opts.groups}

    def latest(self) -> dict[str, int]:
        """``{group: committed index + 1}`` now: the end no batch may pass."""
        return {g: m.committed_index + 1 for g, m in self.metas().items()}

    def initial(self) -> dict[str, int]:
        return {g: resolve_start(self.opts.starting[g], m.ledger_begin_index, m.committed_index)
                for g, m in self.metas().items()}

    def entry_size(self, group: str, lo: int, hi: int) -> int:
        """Average bytes per index over ``[lo, hi)``: from the positions of its first and last entries.

        Positions are byte offsets in the log, the same on every member, so two one-entry GETs measure the
        whole range (blank padding at file ends included) whatever its entries' sizes.
        """
        client = self.client(group)
        try:
            [first] = client.get(lo, 1) or [None]
            [last] = client.get(max(hi - 1, lo), 1) or [None]
        except (DLedgerError, ValueError):
            return DEFAULT_ENTRY_SIZE  # deleted or moving: the read will tell; planning goes on
        if first is None or last is None:
            return DEFAULT_ENTRY_SIZE
        if last.index > first.index:
            return max(1, (last.pos + last.size - first.pos) // (last.index - first.index + 1))
        return first.size

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Partition]:
        """The tasks reading ``[start[g], end[g])`` of every group, each about ``partitionBytes``."""
        opts = self.opts
        out: list[Partition] = []
        for group in opts.groups:
            lo, hi = int(start.get(group, end.get(group, 0))), int(end.get(group, 0))
            if hi <= lo:
                continue
            per = entries_per_partition(opts.partition_bytes, self.entry_size(group, lo, hi))
            followers: list[str] = []
            if opts.read_from != "leader":
                leader = self.leader_meta(group).leader_id
                followers = [m for m in parse_peers(opts.groups[group]) if m != leader]
            for i, r in enumerate(split(group, lo, hi, per)):
                members = tuple(followers[i % len(followers):] + followers[:i % len(followers)]) if followers else ()
                out.append(task(opts, group, r.start, r.end, members))
        return out

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def task(opts: SourceOptions, group: str, start: int, end: int, members: tuple[str, ...] = ()) -> Partition:
    """The task reading ``[start, end)`` of ``group`` (asking ``members`` first) with the read's options."""
    return Partition(group, opts.groups[group], start, end, members, opts.read_from, opts.format,
                     opts.fail_on_data_loss, opts.timeout, opts.credentials)


class _Planned:
    """A reader that plans with a :class:`Planner` on the driver but pickles (to executors) without it."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._planner: Planner | None = None

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.opts)
        return self._planner

    def __getstate__(self):
        return {"opts": self.opts, "_planner": None}

    def read(self, partition: Partition):
        return read_partition(partition)


class DLedgerBatchReader(_Planned, DataSourceReader):
    """``spark.read.format("dledger")``: ``startingIndex`` (default earliest) to ``endingIndex`` (default latest)."""

    def partitions(self):
        parts = [] if empty_by_options(self.opts.starting, self.opts.ending) else self._planned()
        if not parts:  # nothing to read: one empty task, so Spark gets a (empty) scan
            # with the read's options: its worker builds the client a read of this group uses (prestart.py)
            parts = [task(self.opts, next(iter(self.opts.groups)), 0, 0)]
        return parts

    def _planned(self) -> list:
        """The tasks of the read, planned with the leaders' committed indexes."""
        planner = self.planner
        try:
            metas = planner.metas()
            start = {g: resolve_start(self.opts.starting[g], m.ledger_begin_index, m.committed_index)
                     for g, m in metas.items()}
            end = {g: resolve_end(self.opts.ending[g], m.committed_index) for g, m in metas.items()}
            return planner.partitions(start, end)
        finally:
            planner.close()
            self._planner = None


class DLedgerStreamReader(_Planned, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("dledger")``: offsets ``{group: next index}``, admission control, AvailableNow."""

    def __init__(self, opts: SourceOptions):
        super().__init__(opts)
        self._target: dict[str, int] | None = None
        self._first = True  # no micro-batch admitted yet by this reader (the query's start, or its restart)

    def __getstate__(self):
        return {"opts": self.opts, "_planner": None, "_target": None, "_first": True}

    def initialOffset(self) -> dict:
        return self.planner.initial()

    def _start(self, start: dict) -> dict[str, int]:
        """``start`` with every configured group (a group added since the checkpoint starts per startingIndex).

        Offsets of a group this query does not read come from a checkpoint of other groups: refused.
        """
        problem = foreign_groups(start, self.opts.groups)
        if problem is not None:
            raise SourceError(f"dledger source: {problem}")
        missing = [g for g in self.opts.groups if g not in start]
        fresh = self.planner.initial() if missing else {}
        return {g: int(start[g]) if g in start else fresh[g] for g in self.opts.groups}

    def latestOffset(self, start: dict, limit) -> dict:
        begin = self._start(start)
        latest = self.planner.latest()
        if self._target is not None:
            latest = {g: min(latest[g], self._target.get(g, latest[g])) for g in latest}
        cap = None
        if isinstance(limit, ReadMaxRows):
            cap = int(limit.max_rows)
        elif not isinstance(limit, ReadAllAvailable) and limit is not None:
            cap = self.opts.max_entries_per_trigger
        from dledger_spark.planning import admit, first_batch_limit

        end = admit(begin, {g: max(latest[g], begin[g]) for g in begin}, first_batch_limit(cap, self._first))
        if end != begin:
            self._first = False
        return end

    def getDefaultReadLimit(self):
        if self.opts.max_entries_per_trigger:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.latest()

    def partitions(self, start: dict, end: dict):
        return self.planner.partitions(self._start(start), {g: int(v) for g, v in end.items()})

    def commit(self, end: dict) -> None:
        """Nothing to release: a dledger log is read by index, the member keeps no reader state."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None


class DLedgerDataSource(DataSource):
    """The data source named ``dledger`` (register it with ``spark.dataSource.register``)."""

    def __init__(self, options):
        super().__init__(options)
        self.opts = parse_options(options)  # a bad option fails here, at planning, in one line

    @classmethod
    def name(cls) -> str:
        return "dledger"

    def schema(self) -> str:
        return ddl(self.opts.format)

    def reader(self, schema):
        return DLedgerBatchReader(self.opts)

    def streamReader(self, schema):
        return DLedgerStreamReader(self.opts)
