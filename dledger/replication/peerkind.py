"""What each peer is: a dledger member, a Java DLedger member, or not known yet.

Why: Java DLedger 0.3.2 has no InstallSnapshot.  A Java member whose log a
leader compacted could never be brought back, so a mixed group must not
compact (``peers_take_snapshots``, taken by ``server.snapshots``) and a leader
never sends a Java member a snapshot.  A member learns a peer's kind from
what the peer answers:

* a METADATA request with ``detail`` (a dledger extension Java ignores): a
  dledger member answers with its ``role``, a Java member without it;
* an InstallSnapshot answered UNSUPPORTED (a Java member answers a code it
  does not know with RocketMQ's REQUEST_CODE_NOT_SUPPORTED);
* any InstallSnapshot answer of SUCCESS: only dledger answers the code.

The decisions are the pure functions at the top; :class:`PeerKinds` only asks
and remembers; a member probes only if it runs state machines (without them it
never snapshots or compacts, and no plain-log group pays for the probes).  A
peer not known yet is treated as "may be Java" by ``all_take_snapshots``
(compaction waits) but is still sent a snapshot when it needs one (the answer
tells).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from twisted.internet.defer import Deferred, DeferredList
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import MetadataRequest, MetadataResponse

log = Logger()

#: Seconds between probes of a peer whose kind is not known (or which was Java: it may have been upgraded).
PROBE_INTERVAL = 1.0
JAVA_REPROBE_INTERVAL = 60.0


class PeerKind(enum.Enum):
    UNKNOWN = "unknown"
    DLEDGER = "dledger"
    JAVA = "java"


def kind_from_metadata(resp: MetadataResponse) -> PeerKind:
    """A METADATA reply to a ``detail`` request: dledger fills ``role`` (its extension), Java leaves it out."""
    if resp.response_code is not ResponseCode.SUCCESS:
        return PeerKind.UNKNOWN
    return PeerKind.DLEDGER if resp.role is not None else PeerKind.JAVA


def kind_from_failure(exc: BaseException) -> PeerKind:
    """A request failed: UNSUPPORTED (Java's REQUEST_CODE_NOT_SUPPORTED) says Java; anything else says nothing."""
    if isinstance(exc, DLedgerError) and exc.code is ResponseCode.UNSUPPORTED:
        return PeerKind.JAVA
    return PeerKind.UNKNOWN


def merged(old: PeerKind, new: PeerKind) -> PeerKind:
    """What is known after learning ``new``: an answer that says nothing keeps what was known."""
    return old if new is PeerKind.UNKNOWN else new


def all_take_snapshots(kinds: Mapping[str, PeerKind], peers: Sequence[str]) -> bool:
    """Every peer is known to be a dledger member (so a compacted log can always be caught up with)."""
    return all(kinds.get(p, PeerKind.UNKNOWN) is PeerKind.DLEDGER for p in peers)


class PeerKinds:
    """The kind of each peer of ``self_id``, learnt by probing (METADATA detail) and from InstallSnapshot answers."""

    def __init__(self, self_id: str, group: str, peers: Sequence[str], transport, clock, *,
                 timeout: float = 3.0, probe_interval: float = PROBE_INTERVAL, on_all_dledger=None):
        self.self_id = self_id
        self.group = group
        self.peers = [p for p in peers if p != self_id]
        self.transport = transport
        self.clock = clock
        self.timeout = timeout
        self.probe_interval = probe_interval
        self.kinds: dict[str, PeerKind] = {p: PeerKind.UNKNOWN for p in self.peers}
        self._timer = None
        self._asking: set[str] = set()
        self._java_next: dict[str, float] = {}  # when a Java peer is asked again (it may have been upgraded)
        self.running = False
        #: Called once every peer is known to be dledger (a snapshot taken before may compact the log now).
        self.on_all_dledger = on_all_dledger

    # -- what the rest of the member asks -----------------------------------------------------
    def kind(self, peer: str) -> PeerKind:
        return self.kinds.get(peer, PeerKind.UNKNOWN)

    def may_install(self, peer: str) -> bool:
        """A snapshot may be sent to ``peer``: it is not known to be a Java member."""
        return self.kind(peer) is not PeerKind.JAVA

    def all_take_snapshots(self) -> bool:
        """``peers_take_snapshots`` for ``server.snapshots``: compaction waits while a peer may be Java."""
        return all_take_snapshots(self.kinds, self.peers)

    def set_peers(self, members: Sequence[str]) -> None:
        """The configuration in force changed (issue #23): new peers are probed, removed ones forgotten."""
        peers = [p for p in members if p != self.self_id]
        self.kinds = {p: self.kinds.get(p, PeerKind.UNKNOWN) for p in peers}
        added = [p for p in peers if p not in self.peers]
        self.peers = peers
        if added and self.running and self._timer is None:
            self._tick()

    def java_members(self) -> frozenset[str]:
        """Peers known to run Java DLedger (they cannot read a configuration entry)."""
        return frozenset(p for p, k in self.kinds.items() if k is PeerKind.JAVA)

    # -- learning -----------------------------------------------------------------------------
    def learn(self, peer: str, kind: PeerKind) -> None:
        if peer not in self.kinds:
            return
        old = self.kinds[peer]
        new = merged(old, kind)
        if new is not old:
            before = self.all_take_snapshots()
            self.kinds[peer] = new
            level = log.warn if new is PeerKind.JAVA else log.info
            level("{id}: peer {peer} is a {what} member{more}", id=self.self_id, peer=peer,
                  what="Java DLedger" if new is PeerKind.JAVA else "dledger",
                  more=" (it never gets a snapshot, and this member keeps its whole log: see 'Mixed groups' "
                       "in docs/snapshots.md)" if new is PeerKind.JAVA else "")
            if not before and self.all_take_snapshots() and self.on_all_dledger is not None:
                self.on_all_dledger()

    def saw_unsupported(self, peer: str) -> None:
        """``peer`` answered InstallSnapshot with UNSUPPORTED."""
        self.learn(peer, PeerKind.JAVA)

    def saw_dledger(self, peer: str) -> None:
        self.learn(peer, PeerKind.DLEDGER)

    # -- probing ------------------------------------------------------------------------------
    def start(self) -> None:
        self.running = True
        self._tick()

    def stop(self) -> None:
        self.running = False
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _tick(self) -> None:
        self._timer = None
        if not self.running:
            return
        now = self.clock.seconds()
        for peer in self.peers:
            kind = self.kinds[peer]
            if kind is PeerKind.DLEDGER or peer in self._asking:
                continue
            if kind is PeerKind.JAVA and now < self._java_next.get(peer, 0.0):
                continue
            self._probe(peer)
        if any(k is not PeerKind.DLEDGER for k in self.kinds.values()):
            self._timer = self.clock.callLater(self.probe_interval, self._tick)

    def probe(self, peers: Sequence[str]) -> Deferred:
        """Ask those of ``peers`` whose kind is not known, now; fires once every answer (or failure) is in.

        A leader asks before it proposes a configuration change (issue #23): a Java member cannot read
        the entry.  Members that do not answer stay UNKNOWN.
        """
        asks = [self._probe(p) for p in peers
                if p in self.kinds and self.kinds[p] is PeerKind.UNKNOWN and p not in self._asking]
        return DeferredList(asks, consumeErrors=True)

    def _probe(self, peer: str) -> Deferred:
        self._asking.add(peer)
        req = MetadataRequest(group=self.group, remote_id=peer, detail=True)
        d = self.transport.send(peer, req, timeout=self.timeout)

        def answered(resp):
            self._asking.discard(peer)
            if peer not in self.kinds:  # removed from the configuration meanwhile
                return
            kind = kind_from_metadata(resp)
            if kind is PeerKind.JAVA:
                self._java_next[peer] = self.clock.seconds() + JAVA_REPROBE_INTERVAL
                if self.kinds[peer] is PeerKind.JAVA:
                    return
            if kind is PeerKind.DLEDGER and self.kinds[peer] is PeerKind.JAVA:
                self.kinds[peer] = PeerKind.UNKNOWN  # upgraded: forget, then learn
            self.learn(peer, kind)

        def failed(f):
            self._asking.discard(peer)
            self.learn(peer, kind_from_failure(f.value))

        return d.addCallbacks(answered, failed)
