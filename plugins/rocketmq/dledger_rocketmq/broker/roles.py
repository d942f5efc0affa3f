"""Master/slave switching driven by dledger's roles (seed 004, RocketMQ's DLedgerRoleChangeHandler).

* CANDIDATE -> slave, unless already a slave;
* FOLLOWER -> slave (again on every FOLLOWER change: the master may have
  changed, so the metadata sync restarts at once);
* LEADER -> master only after the log is complete and indexed: the term's
  first entry is committed (dledger's "leader ready" event, so every entry of
  earlier terms is committed), the committed index is at or past the end
  index, and the consume-queue dispatch has caught up; then the topic-queue
  table is rebuilt from the queues and the broker becomes master (broker id
  0, metadata sync stopped, delayed delivery started).

Unlike RocketMQ's loop (sleep 100 ms until ``ledgerEndIndex ==
committedIndex``, no timeout; openmessaging/dledger#316 shows a committed
index past the end index hanging it for good), the wait is event-driven,
uses ``>=``, gives up when leadership of that term is lost, and is bounded:
after ``rocketmq.masterWaitTimeout`` seconds it logs what it was waiting for
and hands leadership to the most caught-up peer, then waits again.

The decisions are the pure functions :func:`broker_id_for`,
:func:`role_action` and :func:`leader_step`; :class:`RoleManager` moves time
and calls back.  Role-change handlers never block the dledger chain: the
LEADER wait runs beside it (a blocking handler would also deadlock with
"leader ready", which dledger delivers after every handler saw LEADER).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from enum import Enum

from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger
from zope.interface import implementer

from dledger.codes import Role
from dledger.interfaces import ILeaderReadyListener, IRoleChangeHandler
from dledger.messages import LeadershipTransferRequest

log = Logger()

MASTER = "MASTER"
SLAVE = "SLAVE"
MASTER_ID = 0


def numbered_id(self_id: str) -> int | None:
    """``k`` of a DLedger selfId ``n<k>`` (one letter, then digits), else None."""
    m = re.fullmatch(r"[A-Za-z]([0-9]+)", self_id)
    return int(m.group(1)) if m else None


def broker_id_for(self_id: str, member_ids: list[str] | None = None) -> int:
    """A slave's broker id as RocketMQ derives it: DLedger selfId ``n<k>`` -> ``k + 1`` (0 is the master's).

    RocketMQ (DLedgerCommitLog) parses ``selfId.substring(1)`` and fails on
    any other id; we fall back to the id's position in the sorted member
    list + 1, so every member still has a distinct non-zero id.  ``member_ids``
    are the bootstrap ``--peers`` (they do not change when the configuration
    does, so neither does the id).
    """
    k = numbered_id(self_id)
    if k is not None:
        return k + 1
    ids = sorted(member_ids or [self_id])
    return ids.index(self_id) + 1 if self_id in ids else 1


#: Broker ids of members that joined with an id not of the form ``n<k>`` start here (RocketMQ's ids are longs).
JOINED_BASE = 1000
JOINED_SPAN = 1_000_000


def joined_broker_id(self_id: str) -> int:
    """The broker id of a member that joined a running group with an id not of the form ``n<k>``.

    Derived from the id alone (CRC32), so every start of the member agrees, and above the positions the
    bootstrap members take; two distinct ids collide with odds of about 1 in a million.
    """
    return JOINED_BASE + zlib.crc32(self_id.encode("utf-8")) % JOINED_SPAN


def member_broker_id(self_id: str, bootstrap_ids: list[str], *, joined: bool) -> int:
    """A member's slave broker id, stable for the member's life whatever the configuration becomes.

    ``bootstrap_ids`` are the ``--peers`` it was started with (never the configuration in force: that
    changes, and a position in it would move); ``joined``: started to join a running group
    (``joinExisting``; issue #23).
    """
    if numbered_id(self_id) is not None or not joined:
        return broker_id_for(self_id, bootstrap_ids)
    return joined_broker_id(self_id)


class RoleAction(Enum):
    NOTHING = "nothing"
    BECOME_SLAVE = "become slave"
    WAIT_FOR_MASTER = "wait, then become master"


def role_action(role: Role, broker_role: str) -> RoleAction:
    """What a dledger role change asks of the broker (DLedgerRoleChangeHandler.handle)."""
    if role is Role.CANDIDATE:
        return RoleAction.NOTHING if broker_role == SLAVE else RoleAction.BECOME_SLAVE
    if role is Role.FOLLOWER:
        return RoleAction.BECOME_SLAVE
    return RoleAction.WAIT_FOR_MASTER


class Step(Enum):
    WAIT = "wait"
    BECOME_MASTER = "become master"
    GIVE_UP = "give up (no longer leader of that term)"
    TIMED_OUT = "timed out"


def leader_step(*, leader_of_term: bool, leader_ready: bool, ledger_end: int, committed: int,
                dispatched: bool, elapsed: float, timeout: float) -> Step:
    """One decision of the LEADER wait: switch, keep waiting, give up, or time out.

    ``committed >= ledger_end`` (not ``==``): a committed index past the end
    (openmessaging/dledger#316) must not hang the switch.
    """
    if not leader_of_term:
        return Step.GIVE_UP
    if leader_ready and committed >= ledger_end and dispatched:
        return Step.BECOME_MASTER
    if elapsed >= timeout:
        return Step.TIMED_OUT
    return Step.WAIT


def waiting_for(*, leader_ready: bool, ledger_end: int, committed: int, dispatched: bool, lag: int) -> str:
    """The log line's reason: what the LEADER wait still lacks."""
    missing = []
    if not leader_ready:
        missing.append("the term's first entry to commit")
    if committed < ledger_end:
        missing.append(f"entries {committed + 1}..{ledger_end} to commit")
    if not dispatched:
        missing.append(f"the consume-queue dispatch ({lag} bytes behind)")
    return ", ".join(missing) or "nothing"


def bootstrap_ids(server) -> list[str]:
    """The member ids of the member's bootstrap ``--peers`` (its starting member set in older dledgers)."""
    members = getattr(getattr(server, "config", None), "members", None)
    if members:
        return list(members)
    return list(getattr(server.state, "member_set", ()) or [server.self_id])


def transfer_targets(server) -> list[str]:
    """The peers leadership may go to: the configuration's voters but this member (learners never lead)."""
    membership = getattr(server, "membership", None)
    peers = sorted(server.state.peers) if hasattr(server.state, "peers") else []
    if membership is None:
        return peers
    config = membership.configuration
    return sorted(v for v in config.voters if v != server.self_id)


@implementer(IRoleChangeHandler, ILeaderReadyListener)
class RoleManager:
    """The broker's role, driven by dledger's role changes and leader-ready events.

    ``dispatcher`` (a :class:`dledger_rocketmq.store.dispatch.Dispatcher`) says when
    the queues have caught up; ``rebuild`` rebuilds the topic-queue table;
    ``on_master`` / ``on_slave`` start and stop what belongs to each role
    (delayed delivery, metadata sync), called with the manager.
    """

    def __init__(self, server, dispatcher, *, rebuild: Callable[[], object] = lambda: None,
                 on_master: Callable[[RoleManager], object] = lambda m: None,
                 on_slave: Callable[[RoleManager], object] = lambda m: None,
                 timeout: float = 30.0):
        self.server = server
        self.dispatcher = dispatcher
        self.rebuild = rebuild
        self.on_master = on_master
        self.on_slave = on_slave
        self.timeout = timeout
        self.role = SLAVE
        self.slave_id = member_broker_id(server.self_id, bootstrap_ids(server),
                                         joined=bool(getattr(server.config, "join_existing", False)))
        self.broker_id = self.slave_id
        self.master_term = -1
        self.switches = 0
        self._term = -1  # the term whose LEADER wait runs (-1: none)
        self._ready = False
        self._started = 0.0
        self._timer = None
        self._dispatch_wait = None

    # -- IRoleChangeHandler -------------------------------------------------------------
    def role_changed(self, term: int, role) -> None:
        if role is not Role.LEADER and self._term != -1:
            log.info("{id}: leadership of term {t} lost while waiting to become master; staying slave",
                     id=self.server.self_id, t=self._term)
            self._stop_wait()
        action = role_action(role, self.role)
        if action is RoleAction.BECOME_SLAVE:
            self._become_slave(term)
        elif action is RoleAction.WAIT_FOR_MASTER:
            if self.role == MASTER:  # cannot happen in Raft (a new term passes through CANDIDATE); be safe
                self._become_slave(term)
            self._start_wait(term)

    # -- ILeaderReadyListener -----------------------------------------------------------------
    def leader_ready(self, term: int) -> None:
        if term != self._term:
            return
        self._ready = True
        self._wait_dispatch()
        self._check()

    # -- the LEADER wait ---------------------------------------------------------------------------
    def is_master(self) -> bool:
        st = self.server.state
        return self.role == MASTER and st.role is Role.LEADER and st.curr_term == self.master_term

    def _start_wait(self, term: int) -> None:
        self._stop_wait()
        self._term, self._ready, self._started = term, False, self.server.clock.seconds()
        self._timer = self.server.clock.callLater(self.timeout, self._check, True)
        log.info("{id}: leader of term {t}; waiting for the log to commit and be dispatched before becoming "
                 "master", id=self.server.self_id, t=term)
        if self.server.leader_ready.is_ready and self.server.leader_ready.ready_term == term:
            self.leader_ready(term)

    def _wait_dispatch(self) -> None:
        if self._dispatch_wait is not None and not self._dispatch_wait.called:
            self._dispatch_wait.cancel()
        d = self._dispatch_wait = self.dispatcher.wait_dispatched(self.server.store.committed_index)
        d.addCallbacks(lambda _: self._check(), lambda f: None)

    def _stop_wait(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._dispatch_wait is not None and not self._dispatch_wait.called:
            self._dispatch_wait.cancel()
        self._dispatch_wait = None
        self._term = -1
        self._ready = False

    def _check(self, deadline: bool = False) -> None:
        """Decide (``deadline``: called by the wait's timer, so the time is up whatever float sums say)."""
        term = self._term
        if term == -1:
            return
        server, store = self.server, self.server.store
        st = server.state
        dispatched = self.dispatcher.caught_up(store.committed_index)
        step = leader_step(leader_of_term=st.role is Role.LEADER and st.curr_term == term,
                           leader_ready=self._ready, ledger_end=store.ledger_end_index,
                           committed=store.committed_index, dispatched=dispatched,
                           elapsed=self.timeout if deadline else server.clock.seconds() - self._started,
                           timeout=self.timeout)
        if step is Step.WAIT:
            if self._ready and not dispatched and (self._dispatch_wait is None or self._dispatch_wait.called):
                self._wait_dispatch()
            return
        if step is Step.GIVE_UP:
            self._stop_wait()
            return
        if step is Step.TIMED_OUT:
            why = waiting_for(leader_ready=self._ready, ledger_end=store.ledger_end_index,
                              committed=store.committed_index, dispatched=dispatched, lag=self.dispatcher.lag())
            log.warn("{id}: not master after {s:.1f} s as leader of term {t}: still waiting for {why}; "
                     "handing leadership on", id=server.self_id, s=self.timeout, t=term, why=why)
            self._hand_over(term)
            self._started = server.clock.seconds()
            self._timer = server.clock.callLater(self.timeout, self._check, True)
            return
        self._stop_wait()
        self.rebuild()
        self.role, self.broker_id, self.master_term = MASTER, MASTER_ID, term
        self.switches += 1
        # The figures let an operator (and the process failover test) see that the switch waited for catch-up.
        log.info("{id}: became master (term {t}, broker id 0) after {s:.3f} s: log end {e}, committed {c}, "
                 "dispatch caught up: {u} (last dispatched entry {d}; NOOPs are not dispatched)",
                 id=server.self_id, t=term, s=server.clock.seconds() - self._started, e=store.ledger_end_index,
                 c=store.committed_index, u=self.dispatcher.caught_up(store.committed_index),
                 d=self.dispatcher.dispatched_index)
        self.on_master(self)

    def _hand_over(self, term: int) -> None:
        """Transfer leadership to the most caught-up peer (a failed transfer is logged; the wait goes on)."""
        server = self.server
        replicator = getattr(server, "replicator", None)
        peers = transfer_targets(server)
        if not peers or replicator is None:
            return
        target = max(peers, key=lambda p: (replicator.peer_watermark(p), p))
        req = LeadershipTransferRequest(group=server.config.group, term=term, transfer_id=server.self_id,
                                        transferee_id=target)
        d = maybeDeferred(server.handle_leadership_transfer, req)
        d.addErrback(lambda f: log.warn("{id}: leadership transfer to {to} failed: {e}", id=server.self_id,
                                        to=target, e=f.getErrorMessage()))

    def _become_slave(self, term: int) -> None:
        was = self.role
        self.role, self.broker_id, self.master_term = SLAVE, self.slave_id, -1
        if was == MASTER:
            log.info("{id}: master -> slave (term {t}, broker id {b})", id=self.server.self_id, t=term,
                     b=self.slave_id)
        self.on_slave(self)

    def stop(self) -> None:
        self._stop_wait()
