"""Planning decisions of the data source, as pure functions (table-tested without Spark or a group).

Offsets are ``{group: next index}``: the first index a batch has *not* read.  A batch reads the
half-open ranges ``[start[g], end[g])``; every ``end[g]`` is at most the group's committed index + 1 as
a member reported it while planning, so no row ever carries an uncommitted entry.  Given the same
``(start, end)`` -- what Spark's offset log holds -- the same entries are read again after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass


def resolve_start(spec: str | int, begin: int, committed: int) -> int:
    """The first index to read for ``startingIndex`` ``spec``, given the log's ``begin`` and ``committed`` indexes.

    ``earliest``: the first entry the member still holds (0 for an empty log); ``latest``: the first entry
    not committed yet (only what is appended from now on); an index: itself (checked when read: below the
    log's begin it was deleted by retention).
    """
    if spec == "earliest":
        return max(begin, 0)
    if spec == "latest":
        return committed + 1
    return int(spec)


def resolve_end(spec: str | int, committed: int) -> int:
    """The exclusive end of a batch read for ``endingIndex`` ``spec``: never past the committed index + 1."""
    if spec == "latest":
        return committed + 1
    return min(int(spec), committed + 1)


def empty_by_options(starting: dict, ending: dict) -> bool:
    """True when the options alone make a batch read empty: every group's ``startingIndex`` and ``endingIndex``
    are indexes and the end is not past the start (the members need not be asked)."""
    return all(isinstance(starting.get(g), int) and isinstance(end, int) and end <= starting[g]
               for g, end in ending.items())


def admit(start: dict[str, int], latest: dict[str, int], limit: int | None) -> dict[str, int]:
    """The end offsets of the next micro-batch: ``latest`` capped so that at most ``limit`` indexes are read.

    Like Kafka's ``maxOffsetsPerTrigger`` the limit is shared out in proportion to what each group has
    waiting (floor), the remainder going to groups in name order, so a busy group cannot starve a quiet
    one and the result depends on the inputs only.  A group never moves backwards.
    """
    waiting = {g: max(latest.get(g, start[g]) - start[g], 0) for g in start}
    total = sum(waiting.values())
    if limit is None or total <= limit:
        return {g: start[g] + waiting[g] for g in start}
    share = {g: waiting[g] * limit // total for g in start}
    left = limit - sum(share.values())
    for g in sorted(start):
        if left <= 0:
            break
        if share[g] < waiting[g]:
            share[g] += 1
            left -= 1
    return {g: start[g] + share[g] for g in start}


#: At most this many indexes in the first micro-batch a query (or a restarted one) plans: its rows reach the
#: output within seconds of the start instead of after the whole backlog; the batches after it take what
#: the limit allows.
FIRST_BATCH_ENTRIES = 10_000


def first_batch_limit(limit: int | None, first: bool) -> int | None:
    """The admission limit of a micro-batch: ``limit``, and for the ``first`` one at most FIRST_BATCH_ENTRIES."""
    if not first:
        return limit
    return FIRST_BATCH_ENTRIES if limit is None else min(limit, FIRST_BATCH_ENTRIES)


def entries_per_partition(partition_bytes: int, entry_size: int) -> int:
    """How many entries of about ``entry_size`` bytes (header included) make ``partition_bytes`` (at least 1)."""
    return max(1, partition_bytes // max(entry_size, 1))


@dataclass(frozen=True)
class Range:
    """Indexes ``[start, end)`` of one group: what one Spark task reads."""

    group: str
    start: int
    end: int


def split(group: str, start: int, end: int, per_partition: int) -> list[Range]:
    """``[start, end)`` cut into consecutive ranges of ``per_partition`` indexes (the last one shorter)."""
    if per_partition < 1:
        raise ValueError(f"per_partition must be at least 1, got {per_partition}")
    return [Range(group, lo, min(lo + per_partition, end)) for lo in range(start, end, per_partition)]


def data_loss_message(group: str, wanted: int, begin: int) -> str:
    """The one line a read fails with when retention deleted entries it must read."""
    return (f"dledger source: entries {wanted}..{begin - 1} of group {group!r} were deleted by retention "
            f"(the log now begins at index {begin}); set failOnDataLoss=false to skip them, or start at "
            f"startingIndex >= {begin}")


def foreign_groups(recorded, configured) -> str | None:
    """Why a checkpoint whose offsets (or pinned start) name ``recorded`` groups cannot serve ``configured``.

    None if it can.  A checkpoint belongs to the groups it was started with: a group may be added later (it
    starts at its ``startingIndex``), but none dropped or renamed -- offsets of g0 are no position in g1's
    log, and a dropped group re-added later would be read again from its start.
    """
    missing = sorted(set(recorded) - set(configured))
    if not missing:
        return None
    return (f"the checkpoint holds offsets of group(s) {', '.join(missing)}, which this query does not read "
            f"(it reads {', '.join(sorted(configured))}): a checkpoint belongs to the groups it was started with; "
            "use a new checkpoint location (and output) for other groups")


#: What the client's TLS check or secret-mode login says when the member is not one of ``group`` as this
#: client knows it (another group's certificate or secret, a refused token): no retry changes that.
IDENTITY_MISMATCH = ("refused the login of", "does not know our secret", "is not a member certificate of group",
                     "the server's certificate names member", "presented no certificate")


def metadata_problem(group: str, peers: str, code, meta=None, error: str = "") -> str | None:
    """What a member's METADATA answer (its ``code``, ``meta`` if it answered, the ``error`` text if it did
    not) says is wrong with reading ``group`` at ``peers``; None if nothing that waiting could not cure.

    ``UNKNOWN_GROUP``: the members serve another group (a wrong ``group``); ``UNKNOWN_MEMBER``: the ids in
    ``peers`` are not the members' own.  A SUCCESS answer with no leader, no peer map, no role and no log
    range is what a member with authentication answers a client without the read role (docs/security.md):
    waiting for a leader would never end.  A login or certificate of the wrong group (secured groups know
    their name before any request: a wrong ``group`` shows here) ends it too.  Anything else (no leader
    yet, an election, a member down) is waited out.
    """
    if any(marker in error for marker in IDENTITY_MISMATCH):
        return (f"dledger source: group {group!r} at {peers}: {error}: check 'group' (dledger ingest --group) and "
                "the credentials (tlsCa/tlsCert/tlsKey, clientName/tokenFile) against the members' config")
    if code.name == "UNKNOWN_GROUP":
        return (f"dledger source: the members at {peers} do not serve group {group!r} (UNKNOWN_GROUP ({int(code)})): "
                "check 'group' (dledger ingest --group) against the members' config")
    if code.name == "UNKNOWN_MEMBER":
        return (f"dledger source: a member at {peers} is not the member its id names (UNKNOWN_MEMBER "
                f"({int(code)})): check 'peers'")
    redacted = (meta is not None and code.name == "SUCCESS" and meta.leader_id is None and meta.peers is None
                and meta.role is None and meta.ledger_begin_index is None)
    if code.name == "NOT_AUTHORIZED" or redacted:
        return (f"dledger source: group {group!r} at {peers} needs credentials with the read role: the members "
                "run with authentication and did not let this client read; pass tlsCa/tlsCert/tlsKey "
                "(authMode=tls) or clientName/tokenFile (authMode=secret) -- dledger ingest --tls-ca/--tls-cert/"
                "--tls-key or --client-name/--token-file -- and check the client's role in the members' clientsFile")
    return None


def no_leader_message(group: str, peers: str, timeout: float, error: str, closed_at_once: bool) -> str:
    """The line planning fails with when no leader answered for ``timeout`` seconds (``error``: the last one).

    ``closed_at_once``: a member closed a plain connection as soon as it was made -- what a TLS port
    (``authMode = tls`` or ``tlsCert``) does to a client without ``tlsCa``: the line says so.
    """
    line = f"dledger source: no leader of group {group!r} at {peers} answered within {timeout:g}s: {error}"
    if closed_at_once:
        line += ("; the members closed the connection at once: if they speak TLS, pass tlsCa (and tlsCert/tlsKey "
                 "for authMode=tls; dledger ingest --tls-ca/--tls-cert/--tls-key)")
    return line
