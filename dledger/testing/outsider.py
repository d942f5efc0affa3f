"""The simulator's "outsider" fault: frames from someone who can reach a member's port but holds no credential.

Why (issue #13): a well-formed forged VOTE, PUSH or LEADERSHIP_TRANSFER with plausible terms and
indexes passes every bounds check; only authentication stops it.  The outsider builds real
remoting frames -- forged from what it can observe (the current leader, term and log end) and, in
``bounds`` mode, with random out-of-range integers -- and feeds them to a member through the same
:class:`~dledger.transport.protocol.RemotingProtocol` (decode, bounds checks and the authorisation
guard) that serves a TCP port, over an in-memory transport.

Each injection is checked at once: the member's handler must not be reached, and the member's
term, vote, role, leader and log indexes must be what they were (the frame is handled synchronously,
so nothing else runs in between).  Anything else is recorded as an effect -- a safety failure.

* ``auth`` mode: the member guards its port with ``authMode=secret`` (the outsider does not log in);
  plausible forged frames and out-of-range ones must have 0 effect.
* ``bounds`` mode: no authentication (Java's behaviour); only out-of-range values are sent, and they
  must have 0 effect (the bounds checks of issue #9).
"""

from __future__ import annotations

import random
from typing import Any

from twisted.internet.testing import StringTransport
from zope.interface import implementer

from dledger import messages
from dledger.codes import PushType
from dledger.entry import Entry
from dledger.interfaces import IRequestHandler
from dledger.ratelog import RateLimitedLog
from dledger.security.guard import ServerGuard
from dledger.security.secret import key_id
from dledger.transport import remoting
from dledger.transport.protocol import RemotingProtocol

MODES = ("auth", "bounds")
OUT_OF_RANGE = (10 ** 30, 2 ** 63, 2 ** 63 - 1, 2 ** 64, -2, -(2 ** 63), -(10 ** 20))
_SIM_SECRET = b"simulated-group-secret-0123456789"


@implementer(IRequestHandler)
class _Watched:
    """The member's handler, counting what reaches it."""

    def __init__(self, server: Any):
        self.server = server
        self.reached: list[Any] = []

    def handle_request(self, request: Any) -> Any:
        self.reached.append(request)
        return self.server.handle_request(request)


def member_state(server: Any) -> tuple:
    """What a forged frame could change: term, vote, role, leader, log begin/end, committed index."""
    st, store = server.state, server.store
    return (st.curr_term, st.vote_for, st.role, st.leader_id, st.transferee, store.ledger_begin_index,
            store.ledger_end_index, store.committed_index)


class Outsider:
    """Injects forged frames into the members of a :class:`~dledger.testing.cluster.Cluster`."""

    def __init__(self, cluster: Any, rng: random.Random, mode: str = "auth"):
        if mode not in MODES:
            raise ValueError(f"outsider mode must be one of {MODES}")
        self.cluster = cluster
        self.rng = rng
        self.mode = mode
        self.injected = 0
        self.effects: list[str] = []
        self._opaque = 0
        self.group = next(iter(cluster.configs.values())).group

    def _guard(self) -> ServerGuard | None:
        if self.mode != "auth":
            return None
        c = self.cluster
        guard = ServerGuard("secret", self.group, frozenset(c.ids), secrets={key_id(_SIM_SECRET): _SIM_SECRET})
        guard.log = RateLimitedLog(ServerGuard._logger, c.clock, interval=3600.0)
        return guard

    def inject(self) -> None:
        """Send one burst of forged frames to one running member, checking each for effects."""
        running = [mid for mid in self.cluster.ids if mid in self.cluster.servers and mid not in self.cluster.down]
        if not running:
            return
        mid = self.rng.choice(running)
        server = self.cluster.servers[mid]
        watched = _Watched(server)
        proto = RemotingProtocol(self.cluster.clock, watched, guard=self._guard())
        proto.makeConnection(StringTransport())
        for what, data in self.frames(mid, server):
            before = member_state(server)
            reached = len(watched.reached)
            proto.dataReceived(data)
            self.injected += 1
            if len(watched.reached) != reached:
                self.effects.append(f"{mid}: forged {what} reached the member's handler ({self.mode} mode)")
            after = member_state(server)
            if after != before:
                self.effects.append(f"{mid}: forged {what} changed its state {before} -> {after}")
            if proto.lost or proto._closing:  # the member closed the connection: the outsider reconnects
                proto = RemotingProtocol(self.cluster.clock, watched, guard=self._guard())
                proto.makeConnection(StringTransport())

    def frames(self, mid: str, server: Any) -> list[tuple[str, bytes]]:
        """Forged frames for member ``mid``: plausible ones (auth mode) and out-of-range ones (both modes)."""
        rng, c = self.rng, self.cluster
        st, store = server.state, server.store
        term, end = st.curr_term, store.ledger_end_index
        leader = st.leader_id or rng.choice(c.ids)
        other = rng.choice([m for m in c.ids if m != mid] or [mid])
        base = dict(group=self.group, remote_id=mid, local_id=leader, leader_id=leader)
        out: list[tuple[str, Any, bool]] = []
        if self.mode == "auth":
            far = Entry(b"forged", end + rng.randint(1, 10 ** 6), term, rng.randint(0, 10 ** 9)).sealed()
            planted = Entry(b"planted", end + 1, term, 0).sealed()
            out += [
                ("PUSH TRUNCATE", messages.PushEntryRequest(**base, term=term, commit_index=end,
                                                            type=PushType.TRUNCATE, entry=far), rng.random() < 0.5),
                ("PUSH APPEND", messages.PushEntryRequest(**base, term=term, commit_index=end + 1,
                                                          type=PushType.APPEND, entry=planted), rng.random() < 0.5),
                ("PUSH COMMIT", messages.PushEntryRequest(**base, term=term, commit_index=end,
                                                          type=PushType.COMMIT), False),
                ("VOTE", messages.VoteRequest(**{**base, "local_id": other, "leader_id": other}, term=term + 1,
                                              ledger_end_index=end + 100, ledger_end_term=term), False),
                ("HEART_BEAT", messages.HeartBeatRequest(**base, term=term + rng.randint(0, 2)), False),
                ("LEADERSHIP_TRANSFER", messages.LeadershipTransferRequest(
                    **base, term=term, transfer_id=leader, transferee_id=mid), False),
                ("APPEND", messages.AppendEntryRequest(group=self.group, remote_id=mid, body=b"outsider"), False),
            ]
        bad = rng.choice(OUT_OF_RANGE)
        out += [
            ("VOTE with an out-of-range term", messages.VoteRequest(**base, term=bad, ledger_end_index=end,
                                                                    ledger_end_term=term), False),
            ("HEART_BEAT with an out-of-range term", messages.HeartBeatRequest(**base, term=bad), False),
            ("PUSH COMMIT with an out-of-range index", messages.PushEntryRequest(
                **base, term=term, commit_index=bad, type=PushType.COMMIT), False),
            ("GET with an out-of-range index", messages.GetEntriesRequest(group=self.group, remote_id=mid,
                                                                          begin_index=bad), False),
        ]
        frames = []
        for what, request, binary in out:
            self._opaque += 1
            try:
                frames.append((what, remoting.encode_request(request, self._opaque, binary=binary)))
            except (OverflowError, ValueError, TypeError):
                continue  # a value the binary form cannot even carry
        return frames
