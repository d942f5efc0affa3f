"""A broker group mixing dledger members with RocketMQ's Java brokers (issue #27: live migration).

Why: a Java broker in DLedger mode (RocketMQ 4.9.x, ``DLedgerCommitLog``)
parses **every** entry body of its log as a CommitLog record.  On a body
that is not one -- a dledger control entry (``RMQC``: offsets, topics,
groups, ACL) or an empty term-start NOOP -- its ReputMessageService logs
``[BUG]dispatch message to consume queue error`` and skips **the rest of
the buffer it read** (``reputFromOffset += result.getSize() - readSize``):
every message after that entry in the same read never reaches its consume
queues, so a Java slave that later becomes master never serves them
(checked live against the kit's 4.9.8 broker: 10 messages lost behind one
empty NOOP).  So while a Java broker may be in the group:

* the member writes **only plain CommitLog records**: offset commits, topic
  and subscription-group changes are applied to the master's own tables
  (as a Java master does) and reach slaves through RocketMQ's slave sync
  (GET_ALL_TOPIC_CONFIG / CONSUMER_OFFSET / DELAY_OFFSET /
  SUBSCRIPTIONGROUP_CONFIG), which Java slaves call already and dledger
  slaves call too (:mod:`~dledger_rocketmq.broker.sync`);
* a new leader's term-start NOOP carries one valid CommitLog record
  (:func:`term_start_record`, topic :data:`TERM_START_TOPIC`, queue offset
  0) that a Java broker indexes harmlessly instead of skipping messages;
  dledger members never dispatch NOOPs.

Once every peer answers as a dledger member the group is DLEDGER again:
control entries resume, and a master first writes its whole offset,
topic and group tables as control entries so every member holds them.
Each move is logged once.  The decisions are the pure functions at the
top (:func:`group_mode`, :func:`transition`); :class:`MixedGroup` only
watches ``server.peer_kinds`` on the member's clock.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.ratelog import RateLimitedLog
from dledger.replication.peerkind import PeerKind
from dledger_rocketmq.common.control import (
    KIND_ACL_CONFIG,
    KIND_GROUP_CONFIG,
    KIND_GROUP_DELETE,
    KIND_TOPIC_CONFIG,
    KIND_TOPIC_DELETE,
    METADATA_KINDS,
    acl_entry,
    decode_control,
    encode_metadata,
    encode_offset_commits,
)
from dledger_rocketmq.common.message import Address, MessageRecord, encode_record

log = Logger()

#: The file in the broker's store root holding the last decided mode (``dledger`` or ``mixed``).
MODE_FILE = "groupMode"
#: The file in the broker's store root holding the topics and groups deleted while the mode was not DLEDGER
#: (``{"topics": [...], "groups": [...]}``): the deletes the move back writes through the log.
GONE_FILE = "groupMode.deleted"
#: The tables whose deletes are carried, with the control kind deleting an entry and the bean field naming it.
GONE_TABLES = (("topics", KIND_TOPIC_DELETE, "topicName"), ("groups", KIND_GROUP_DELETE, "groupName"))


def read_mode(path: Path) -> Mode | None:
    """The mode kept in ``path`` (None: none kept, or unreadable: decided again from the peers)."""
    try:
        return Mode(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def read_gone(path: Path) -> dict[str, set[str]]:
    """The names kept in ``path`` (:data:`GONE_FILE`); empty sets when there is none or it is unreadable."""
    out: dict[str, set[str]] = {table: set() for table, _, _ in GONE_TABLES}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return out
    if isinstance(data, dict):
        for table in out:
            names = data.get(table)
            if isinstance(names, list):
                out[table] = {n for n in names if isinstance(n, str) and n}
    return out


def gone_after(gone: set[str], before: set[str], now: set[str]) -> set[str]:
    """The names deleted while the mode is not DLEDGER, once a table went from ``before`` to ``now``.

    Why: the log holds the puts made before the group went MIXED; a member replaying it (restarted, or
    catching up) would bring a topic or group back that was deleted meanwhile (by an admin on the master, or
    by the slave sync copying a master's table) unless the move back writes the delete too.  A name that is
    there again is no longer gone: the move back writes its config.
    """
    return (gone | (before - now)) - now


#: The topic of the record a term-start NOOP carries in a mixed group (never routed: no topic config has it).
TERM_START_TOPIC = "DLEDGER_TERM_START"
#: Seconds between looks at the peers' kinds.
CHECK_INTERVAL = 1.0
#: Seconds before an undecided member asks its unknown peers again before a control entry (see settle).
ASK_AGAIN = 10.0
#: Most commits / configs per control entry when the tables are written out on the move back to DLEDGER.
RESUME_CHUNK = 1000
#: Seconds a control entry applied while the mode is undecided waits for its acknowledgement (the mode decided
#: and the tables written through the log) before it is answered as not acknowledged.
UNDECIDED_ACK_TIMEOUT = 10.0


class Mode(enum.Enum):
    """What the member writes into the log."""

    #: Every peer is a dledger member: offsets, topics, groups and the ACL go through the log (control entries).
    DLEDGER = "dledger"
    #: A Java broker is (or may be) in the group: plain CommitLog records only, metadata by slave sync.
    MIXED = "mixed"


def group_mode(kinds: Mapping[str, PeerKind], peers: Sequence[str], *, probing: bool,
               keep_java_compatible: bool = False, previous: Mode | None = None) -> Mode | None:
    """The mode the member should be in, from what its peers answered (``server.peer_kinds``).

    * ``keep_java_compatible`` (``rocketmq.keepJavaCompatible``): MIXED, whatever the peers are, so a Java
      broker can still join later (the way back of a migration stays open);
    * not ``probing`` (a member without the core's state machines never asks its peers): DLEDGER, as before;
    * any peer known to be Java: MIXED;
    * every peer known to be dledger: DLEDGER;
    * otherwise (a peer that has not answered: down, or still starting) the mode stays ``previous`` (the
      last one decided, kept across restarts); None when nothing was ever decided -- the member then acts
      MIXED (:meth:`MixedGroup.current`): a control entry a Java peer later reads loses messages on it, so
      the master applies it to its own tables, but acknowledges it only once the mode is decided and the
      tables are in the log (:meth:`MixedGroup.apply_undecided`): until then only this member holds it, and
      it is gone if this member dies.
    """
    if keep_java_compatible:
        return Mode.MIXED
    if not probing:
        return Mode.DLEDGER
    known = [kinds.get(p, PeerKind.UNKNOWN) for p in peers]
    if PeerKind.JAVA in known:
        return Mode.MIXED
    if all(k is PeerKind.DLEDGER for k in known):
        return Mode.DLEDGER
    return previous


def transition(old: Mode | None, new: Mode | None, *, is_master: bool) -> str | None:
    """What a move from ``old`` to ``new`` asks for (None: nothing, the mode did not change or is undecided).

    ``"log-mixed"``: say the member writes plain records only now; ``"resume"``: a master writes its
    tables through the log (commits made while MIXED or undecided were local), then control entries
    resume; ``"log-dledger"``: a slave says control entries resume (its master writes the tables).
    """
    if new is None or old is new:
        return None
    if new is Mode.MIXED:
        return "log-mixed"
    return "resume" if is_master else "log-dledger"


def term_start_record(store_host: Address, now_ms: int) -> bytes:
    """The body of a term-start NOOP in a mixed group: one valid CommitLog record a Java broker indexes.

    Queue offset 0 and physical offset 0 every time: the first goes to the (never routed) queue
    ``TERM_START_TOPIC``/0, a Java broker logs later ones as "built repeatedly" and skips them, and
    physical offset 0 keeps them out of its message index.
    """
    return encode_record(MessageRecord(topic=TERM_START_TOPIC, body=b"dledger term start", born_timestamp=now_ms,
                                       born_host=store_host, store_timestamp=now_ms, store_host=store_host))


def apply_locally(machine, body: bytes) -> int:
    """Apply a control entry's content to this member's tables only (a mixed group's master, as Java's).

    Offsets never move backwards unless it is a reset; returns how many entries changed.  ValueError
    (ControlError) for a body that does not decode.
    """
    entry = decode_control(body)
    if entry is None:
        raise ValueError("not a control entry")
    meta = machine.meta
    if entry.kind in METADATA_KINDS:
        changed = meta.apply_change(entry)
        if changed and machine.on_applied is not None:
            machine.on_applied(-1, entry)
        return changed
    return meta.offsets.apply(entry.commits, from_log=False, reset=entry.is_reset)


def resume_bodies(meta, now_ms: int, gone: Mapping[str, set[str]] | None = None) -> list[bytes]:
    """The control entries a master writes on the move back to DLEDGER: the ACL in effect, every consumer
    offset, topic and subscription group it holds (slaves that learnt them by the slave sync get them in log
    order too), and a delete of every topic and group in ``gone`` it does not hold (deleted while the mode
    was not DLEDGER: see :func:`gone_after`).  The ACL first: a master that put its ``aclFile`` in effect
    while the mode was undecided applied it to its own table only, and slaves check requests against the ACL
    the log gave them."""
    out = []
    acl = meta.acl
    if acl.config is not None:
        out.append(encode_metadata(KIND_ACL_CONFIG, [acl_entry(acl.config, acl.source, acl.file_source)], now_ms))
    commits = meta.offsets.items()
    for i in range(0, len(commits), RESUME_CHUNK):
        out.append(encode_offset_commits(commits[i:i + RESUME_CHUNK]))
    for kind, table in ((KIND_TOPIC_CONFIG, meta.topics), (KIND_GROUP_CONFIG, meta.groups)):
        configs = [dict(v) for v in table.table.values()]
        for i in range(0, len(configs), RESUME_CHUNK):
            out.append(encode_metadata(kind, configs[i:i + RESUME_CHUNK], now_ms))
    for table_name, kind, name_key in GONE_TABLES:
        held = getattr(meta, table_name).table
        deletes = [{name_key: n} for n in sorted((gone or {}).get(table_name, ())) if n not in held]
        for i in range(0, len(deletes), RESUME_CHUNK):
            out.append(encode_metadata(kind, deletes[i:i + RESUME_CHUNK], now_ms))
    return out


class MixedGroup(Service):
    """The member's mode, kept up to date from ``server.peer_kinds`` every :data:`CHECK_INTERVAL` seconds.

    The broker's control entries ask :meth:`route_control`; the core's leader asks :meth:`noop_body` for its
    term-start NOOP (``server.noop_body``).
    """

    def __init__(self, broker, *, keep_java_compatible: bool = False, interval: float = CHECK_INTERVAL):
        self.broker = broker
        self.server = broker.server
        self.keep_java_compatible = keep_java_compatible
        self.interval = interval
        #: Where the last decided mode is kept (a restarted member whose peers have not answered yet keeps it).
        self.path = Path(broker.root) / MODE_FILE
        self.mode: Mode | None = read_mode(self.path)
        #: Topics and groups deleted while the mode was not DLEDGER (kept in :data:`GONE_FILE`), and the names
        #: the tables held at the last look (None: not looked yet).
        self.gone_path = Path(broker.root) / GONE_FILE
        self.gone = read_gone(self.gone_path)
        self._names: dict[str, set[str]] | None = None
        self._timer = None
        self._resuming: Deferred | None = None
        self._asked_at: float | None = None
        #: A control entry was applied to this member's tables only since the last move (see _moved).
        self.applied_locally = False
        #: (deadline, Deferred) of the control entries applied while undecided, not answered yet (apply_undecided).
        self._unacked: list[tuple[float, Deferred]] = []
        self._unacked_log = RateLimitedLog(log, self.server.clock)
        #: Moves made, oldest first ((seconds, mode)): what `dledger rocketmq migrate-check` and tests read.
        self.moves: list[tuple[float, Mode]] = []

    # -- what the broker and the core ask -------------------------------------------------------
    def current(self) -> Mode:
        return self.mode if self.mode is not None else Mode.MIXED

    def local_control(self) -> bool:
        """Control entries are applied locally instead of being written (MIXED, or not decided yet).

        While a master writes its tables on the move back to DLEDGER, new control entries are appended
        after them (the log keeps the order), not applied locally.
        """
        self.check()  # what the peers answered since the last tick counts at once
        return self.current() is Mode.MIXED

    def route_control(self, body: bytes) -> Deferred | None:
        """Where the master's control entry goes in this group: None: into the log (the caller appends it).

        Otherwise a Deferred of what the caller gets: -1 once applied to this member's tables (MIXED, or
        undecided: slaves get them by the slave sync), or, while no mode is decided, the same once the peers
        were asked (:meth:`settle`): applied locally, or appended (``broker.append_control(force=True)``).
        """
        if self.mode is None:  # peers not known yet: ask them first (issue #27)
            return self.settle().addCallback(lambda _: self._route_settled(body))
        return self.apply_locally(body) if self.local_control() else None

    def _route_settled(self, body: bytes) -> Deferred:
        if self.local_control():
            return self.apply_undecided(body) if self.mode is None else self.apply_locally(body)
        return self.broker.append_control(body, force=True)

    def settle(self) -> Deferred:
        """Fires once the mode is decided, or once the peers not known yet were asked again (at most every
        :data:`ASK_AGAIN` seconds: a member that is down stays unknown, and the mode then stays undecided)."""
        self.check()
        now = self.server.clock.seconds()
        kinds = getattr(self.server, "peer_kinds", None)
        if self.mode is not None or kinds is None or (self._asked_at is not None and now - self._asked_at < ASK_AGAIN):
            return succeed(self.mode)
        self._asked_at = now
        return kinds.probe(list(kinds.peers)).addCallback(lambda _: self.check())

    def noop_body(self) -> bytes:
        """``server.noop_body``: a record in a mixed group (or one not decided), empty otherwise."""
        self.check()
        if self.current() is Mode.DLEDGER:
            return b""
        return term_start_record(self.broker.store_host, int(self.server.clock.seconds() * 1000))

    def apply_locally(self, body: bytes) -> Deferred:
        try:
            apply_locally(self.broker.machine, body)
        except ValueError as exc:
            return fail(exc)
        self.applied_locally = True
        return succeed(-1)

    def apply_undecided(self, body: bytes) -> Deferred:
        """A control entry while no mode was ever decided: applied to this member's tables now, acknowledged later.

        Why: only this member holds it.  A consumer told its commit is stored
        would, after this master is killed, be given the older offset by the
        next master (the failover test's re-deliveries below an acknowledged
        commit: a fresh group's first master, or a master that never heard
        from a peer killed before it answered).  So the answer waits for the
        decision: DLEDGER -> once the tables went through the log
        (:meth:`_resume`), MIXED -> at once (a mixed group's rule: the slave
        sync), this member no longer master or :data:`UNDECIDED_ACK_TIMEOUT`
        passed -> not acknowledged (the client commits again later; the
        master's own table keeps the offset meanwhile).
        """
        try:
            apply_locally(self.broker.machine, body)
        except ValueError as exc:
            return fail(exc)
        self.applied_locally = True
        waiter: Deferred = Deferred()
        self._unacked.append((self.server.clock.seconds() + UNDECIDED_ACK_TIMEOUT, waiter))
        return waiter

    def _answer_unacked(self, why: str | None, waiting: list | None = None) -> None:
        """Answer control entries applied while undecided (all, or ``waiting``): -1 (``why`` None), else not
        acknowledged, saying ``why``."""
        if waiting is None:
            waiting, self._unacked = self._unacked, []
        for _, d in waiting:
            if why is None:
                d.callback(-1)
            else:
                d.errback(DLedgerError(ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, f"{self.server.self_id}: not "
                                       f"acknowledged: {why}; applied on this member only"))

    def _expire_unacked(self) -> None:
        now = self.server.clock.seconds()
        if not self._unacked or self._unacked[0][0] > now:
            return
        expired = [w for w in self._unacked if w[0] <= now]
        self._unacked = [w for w in self._unacked if w[0] > now]
        self._unacked_log.warn("undecided", "{id}: {n} control entries (offset commits, topic/group changes) not "
                               "acknowledged within {t:g} s: the broker group's mode is not decided (a peer has not "
                               "answered; peer kinds {k}); applied on this member only", id=self.server.self_id,
                               n=len(expired), t=UNDECIDED_ACK_TIMEOUT, k=self._peer_view()[0])
        self._answer_unacked(f"the broker group's mode is not decided within {UNDECIDED_ACK_TIMEOUT:g} s (a peer "
                             f"has not answered yet)", expired)

    # -- watching ---------------------------------------------------------------------------------
    def _peer_view(self) -> tuple[Mapping[str, PeerKind], list[str], bool]:
        kinds = getattr(self.server, "peer_kinds", None)
        machines = getattr(getattr(self.server, "snapshots", None), "machines", None)
        if kinds is None or not machines:  # the core probes its peers only when it runs state machines
            return {}, [], False
        return kinds.kinds, list(kinds.peers), True

    def check(self) -> Mode | None:
        kinds, peers, probing = self._peer_view()
        new = group_mode(kinds, peers, probing=probing, keep_java_compatible=self.keep_java_compatible,
                         previous=self.mode)
        old = self.mode
        what = transition(old, new, is_master=self.broker.roles.is_master())
        self.mode = new
        if what is not None:
            self.moves.append((self.server.clock.seconds(), new))
            self.broker.io.run(diskio.write_atomic, self.path, new.value.encode() + b"\n")
            self._moved(what, old, kinds)
        return new

    def _moved(self, what: str, old: Mode | None, kinds: Mapping[str, PeerKind]) -> None:
        sid = self.server.self_id
        if what == "log-mixed":
            self._answer_unacked(None)  # a mixed group's rule: the master's tables, the slave sync
            java = sorted(p for p, k in kinds.items() if k is PeerKind.JAVA)
            why = ("rocketmq.keepJavaCompatible" if self.keep_java_compatible else
                   f"Java broker(s) {', '.join(java)}" if java else "peers not known yet")
            log.warn("{id}: mixed broker group ({why}): writing plain CommitLog records only; offsets, topics and "
                     "groups go by the slave sync", id=sid, why=why)
            self.watch_deletes()  # the names the log gave: a delete from now on is this member's alone
            options = getattr(self.broker, "options", None)
            if java and options is not None and options.listen and not options.vip_listen:
                log.warn("{id}: no rocketmq.vipListen: a Java slave fetches its master's topic configs on the VIP "
                         "port (its listenPort - 2) only, so under this member as master it learns no new topic; "
                         "set rocketmq.vipListen to this member's listen port - 2", id=sid)
            return
        if old is None:
            log.info("{id}: every peer is a dledger member: offsets, topics and groups go through the log", id=sid)
            if what == "resume" and self.applied_locally:  # commits made while undecided go through the log too
                self._resume()  # answers the waiting ones once the tables are in the log
            else:
                self._answer_unacked("this member is no longer master")
            return
        log.warn("{id}: the last Java broker left the group: control entries resume{how}", id=sid,
                 how=" (writing this master's tables through the log first)" if what == "resume" else "")
        if what == "resume":
            self._resume()
        elif any(self.gone.values()):  # a slave: its master writes the tables (and the deletes it saw)
            self._keep_gone({table: set() for table in self.gone})

    def watch_deletes(self) -> None:
        """Note the topics and groups that left this member's tables since the last look while the mode was not
        DLEDGER (:func:`gone_after`), keeping them in :data:`GONE_FILE` across restarts.  Called on every change
        of the two tables (their listeners), at the move to MIXED and on each tick (a table replaced whole)."""
        if self.mode is Mode.DLEDGER:  # deletes go through the log: nothing to note (and no cost per change)
            self._names = None
            return
        meta = self.broker.meta
        names = {table: set(getattr(meta, table).table) for table, _, _ in GONE_TABLES}
        before, self._names = self._names, names
        if before is None:  # the first look since the mode left DLEDGER (or since the start)
            return
        gone = {table: gone_after(self.gone[table], before[table], names[table]) for table in names}
        if gone != self.gone:
            self._keep_gone(gone)

    def _keep_gone(self, gone: dict[str, set[str]]) -> None:
        self.gone = gone
        if any(gone.values()):
            data = json.dumps({t: sorted(n) for t, n in gone.items()}, sort_keys=True).encode() + b"\n"
            self.broker.io.run(diskio.write_atomic, self.gone_path, data)
        else:
            self.broker.io.run(diskio.remove_file, self.gone_path)

    def _resume(self) -> None:
        """Write the master's tables through the log, in order, before any later control entry."""
        self.watch_deletes()
        bodies = resume_bodies(self.broker.meta, int(self.server.clock.seconds() * 1000), self.gone)
        self.applied_locally = False
        d = self._resuming = Deferred()

        def next_one(_=None):
            if not bodies and self.mode is Mode.DLEDGER and any(self.gone.values()):
                self._keep_gone({table: set() for table in self.gone})  # the deletes are in the log now
            if not bodies or self.mode is not Mode.DLEDGER:
                return None
            body = bodies.pop(0)
            return self.broker.append_control(body, force=True).addCallback(next_one)

        def done(result):
            self._resuming = None
            if hasattr(result, "getErrorMessage"):
                log.warn("{id}: writing the tables through the log failed ({e}); offsets committed meanwhile "
                         "reach slaves by the slave sync", id=self.server.self_id, e=result.getErrorMessage())
                self._answer_unacked(f"writing the tables through the log failed ({result.getErrorMessage()})")
            else:  # every entry applied while undecided is in the log now (or the group turned mixed: its rule)
                self._answer_unacked(None)
            d.callback(None)
        succeed(None).addCallback(next_one).addBoth(done)

    def startService(self):
        super().startService()
        for table, _, _ in GONE_TABLES:
            getattr(self.broker.meta, table).listeners.append(self.watch_deletes)
        self._tick()

    def _tick(self):
        self._timer = None
        if not self.running:
            return
        try:
            self.check()
            self.watch_deletes()
            self._expire_unacked()
        finally:
            self._timer = self.server.clock.callLater(self.interval, self._tick)

    def stopService(self):
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._answer_unacked("the broker is stopping")
        for table, _, _ in GONE_TABLES:
            listeners = getattr(self.broker.meta, table).listeners
            if self.watch_deletes in listeners:
                listeners.remove(self.watch_deletes)
        return super().stopService()


__all__ = ["CHECK_INTERVAL", "GONE_FILE", "MODE_FILE", "MixedGroup", "Mode", "TERM_START_TOPIC", "apply_locally",
           "gone_after", "group_mode", "read_gone", "read_mode", "resume_bodies", "term_start_record", "transition"]
