"""What runs on executors: read one planned index range of a group and hand it to Spark as Arrow batches.

Each Python worker keeps one :class:`dledger.blocking.BlockingClient` per group (its own connections,
its own reactor thread), so a task costs no connection set-up once the worker is warm.  GETs ask for
dledger's binary reply (entries raw, no Base64) and return up to 4 MiB each; every reply becomes one
``pyarrow.RecordBatch`` built column by column, so no row tuples pass through Python (for the ``raw``
format straight from the reply's bytes, :mod:`dledger_spark.columns`: no ``Entry`` object per row).
"""

from __future__ import annotations

import atexit
import logging
import threading  # allowed: Spark executor code (a lock around the per-process client cache), not the reactor core
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger_spark import columns
from dledger_spark.columns import Columns
from dledger_spark.options import Credentials
from dledger_spark.planning import data_loss_message
from dledger_spark.schema import arrow_batch, raw_batch

log = logging.getLogger("dledger_spark")

#: Entries asked for per GET (the member's 4 MiB reply budget usually stops it first).
GET_COUNT = 16384
#: How long a lagging follower is given to reach a range before the leader is asked instead.
FOLLOWER_GRACE = 2.0

try:  # pyspark is there on executors; the module also works (and is tested) without it
    from pyspark.sql.datasource import InputPartition
except ImportError:  # pragma: no cover
    InputPartition = object


#: A read without credentials (an open group).
NO_CREDENTIALS = Credentials()


class SourceError(RuntimeError):
    """A read cannot go on (data loss with failOnDataLoss, a group unreachable for ``timeout`` seconds)."""


@dataclass
class Partition(InputPartition):
    """One task: indexes ``[start, end)`` of ``group``.  Picklable (plain fields), planned on the driver.

    ``members`` is the order to ask in: followers first for ``readFrom=follower``/``any`` (spread over the
    followers by the planner), an empty tuple to ask the leader.
    """

    group: str
    peers: str
    start: int
    end: int
    members: tuple[str, ...] = ()
    read_from: str = "leader"
    format: str = "raw"
    fail_on_data_loss: bool = True
    timeout: float = 60.0
    credentials: Credentials = NO_CREDENTIALS

    def __post_init__(self):
        self.value = (self.group, self.start, self.end)  # what InputPartition's repr shows


_clients: dict[tuple[str, str, float, Credentials], object] = {}
_clients_lock = threading.Lock()


def client_for(peers: str, group: str, timeout: float, credentials: Credentials = NO_CREDENTIALS):
    """This process's blocking client of ``group`` with ``credentials`` (made on first use, closed at exit)."""
    from dledger.blocking import BlockingClient
    from dledger.errors import ConfigError

    key = (peers, group, timeout, credentials)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            try:
                built = credentials.build(group)
            except ConfigError as exc:  # readable on the driver, not here: an executor host without the files
                raise SourceError(f"dledger source: credentials on this executor: {exc}") from None
            client = _clients[key] = BlockingClient(peers, group, timeout=timeout, request_timeout=3.0,
                                                    credentials=built)
        return client


def close_clients() -> None:
    """Close every cached client (their reactor threads stop)."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        try:
            client.close()
        except Exception:
            pass


atexit.register(close_clients)


def fetch(client, part: Partition, index: int, count: int, turn: int | None, *,
          raw: bool = False) -> tuple[list, str | None]:
    """One GET: ``(entries, member asked)``: follower ``members[turn]`` with followerRead, or (None) the leader.

    ``raw``: the reply as ``client.get_raw`` gives it (entries left as the reply's bytes).
    """
    get = client.get_raw if raw else client.get
    if turn is not None and part.members:
        member = part.members[turn % len(part.members)]
        return get(index, count, member=member), member
    return get(index, count), None


def fetch_columns(client, part: Partition, index: int, count: int, turn: int | None) -> tuple[Columns, str | None]:
    """:func:`fetch` with the reply decoded straight into :class:`~dledger_spark.columns.Columns` (no
    ``Entry`` per entry); a reply that fails the entry checks is a NETWORK_ERROR (asked again), as the
    plain client's ``get`` treats an undecodable reply."""
    reply, member = fetch(client, part, index, count, turn, raw=True)
    try:
        return columns.from_reply(reply), member
    except columns.CorruptReplyError as exc:
        raise DLedgerError(ResponseCode.NETWORK_ERROR, f"undecodable GET reply from {member or 'the leader'}: "
                                                       f"{exc}") from None


def _last_index(chunk) -> int:
    return chunk.last_index if isinstance(chunk, Columns) else chunk[-1].index


def _below(chunk, end: int):
    return chunk.below(end) if isinstance(chunk, Columns) else [e for e in chunk if e.index < end]


def read_entries(part: Partition, client=None, clock=time.monotonic, fetch=fetch) -> Iterator[list]:
    """The committed entries of ``part`` (NOOPs skipped), reply by reply: lists of ``dledger.entry.Entry``
    (with ``fetch=fetch_columns``: :class:`~dledger_spark.columns.Columns`).

    Retries what a group in motion answers (leader elections, a lagging follower, connections lost)
    for up to ``part.timeout`` seconds without progress, then raises :class:`SourceError`.  Entries
    deleted by retention raise :class:`SourceError` unless ``fail_on_data_loss`` is off: then the
    missing ones are skipped (a warning says which).
    """
    client = client or client_for(part.peers, part.group, part.timeout, part.credentials)
    index = part.start
    last_progress = clock()
    use_leader = part.read_from == "leader" or not part.members
    turn = 0  # which of part.members is asked next
    follower_since: float | None = None
    last_error: Exception | None = None
    while index < part.end:
        if clock() - last_progress > part.timeout:
            raise SourceError(f"dledger source: no progress reading group {part.group!r} at index {index} "
                              f"for {part.timeout:g}s (last error: {last_error})")
        try:
            entries, member = fetch(client, part, index, min(part.end - index, GET_COUNT),
                                    None if use_leader else turn)
        except DLedgerError as exc:
            last_error = exc
            if exc.code is ResponseCode.NOT_AUTHORIZED:  # no retry cures a missing role
                raise SourceError(f"dledger source: reading group {part.group!r} was refused: {exc}; the source "
                                  "needs credentials with the read role (tlsCa/tlsCert/tlsKey or "
                                  "clientName/tokenFile)") from None
            if exc.code is ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                if not use_leader:  # a follower's own retention: the leader may still hold them
                    use_leader = True
                    continue
                try:
                    begin = client.find_leader().ledger_begin_index
                except DLedgerError as again:  # an election: ask again (bounded by the timeout)
                    last_error = again
                    time.sleep(0.05)  # allowed: Spark-side blocking retry pause
                    continue
                if begin <= index:  # the leader changed and the new one holds it: ask again
                    time.sleep(0.02)  # allowed: Spark-side blocking retry pause
                    continue
                if part.fail_on_data_loss:
                    raise SourceError(data_loss_message(part.group, index, begin)) from None
                log.warning("dledger source: skipping entries %d..%d of group %r: deleted by retention "
                            "(failOnDataLoss=false)", index, min(begin, part.end) - 1, part.group)
                index = begin
                last_progress = clock()
                continue
            if not use_leader and exc.code in (ResponseCode.INDEX_OUT_OF_RANGE, ResponseCode.NETWORK_ERROR,
                                               ResponseCode.TIMEOUT, ResponseCode.UNKNOWN_MEMBER):
                # A follower behind the planned range, or down: "any" asks the leader at once,
                # "follower" gives the followers FOLLOWER_GRACE seconds first.
                now = clock()
                turn += 1
                follower_since = follower_since if follower_since is not None else now
                if part.read_from == "any" or now - follower_since > FOLLOWER_GRACE:
                    use_leader = True
                else:
                    time.sleep(0.02)  # allowed: Spark-side blocking retry pause
                continue
            time.sleep(0.05)  # allowed: Spark-side retry pause (elections, connections)
            continue
        if not len(entries) and member is not None:
            use_leader = True  # a follower whose committed prefix ends in NOOPs: ask the leader
            continue
        follower_since = None
        if not len(entries):
            break  # everything left in [index, end) is a NOOP
        if _last_index(entries) >= part.end:
            entries = _below(entries, part.end)
            if not len(entries):
                break
        last_progress = clock()  # (once the leader was asked, it stays asked: the followers lag this range)
        yield entries
        index = _last_index(entries) + 1


def read_partition(part: Partition, client=None) -> Iterator:
    """``read()`` of the data source: the entries of ``part`` as Arrow record batches of the read's schema.

    The ``raw`` format builds each batch from the GET reply's bytes (:mod:`dledger_spark.columns`); the
    ``rocketmq`` format decodes each entry's record, so it reads ``Entry`` objects.
    """
    if part.format == "rocketmq":
        for entries in read_entries(part, client):
            batch = arrow_batch(part.format, part.group, entries, time.time())
            if batch.num_rows:
                yield batch
        return
    for cols in read_entries(part, client, fetch=fetch_columns):
        yield raw_batch(part.group, cols, time.time())
