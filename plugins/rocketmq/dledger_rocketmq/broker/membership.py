"""Broker members coming and going (issue #23 item 6): broker ids, when a new member registers, removal.

A dledger group's members change online (``dledger members add|promote|remove|replace``); the
configuration in force is ``server.membership`` (:class:`dledger.interfaces.IMembership`), which this
module observes.  What the broker layer does about it:

* **Broker ids** stay RocketMQ's (:func:`dledger_rocketmq.broker.roles.broker_id_for`): a member ``n<k>``
  is slave ``k + 1``, whenever it joined -- a member added later with a new id never takes an existing
  or a removed member's id (use a new id for a new machine: ``n3``, ``n4``...).  Ids of another form
  keep their position among the bootstrap ``--peers`` (as before); a member that *joins* with such an
  id (``joinExisting``) gets :func:`~dledger_rocketmq.broker.roles.joined_broker_id`, a number derived from
  its id alone, from 1000 up, so it is the same on every start.
* **Registration waits for catch-up.**  A new member joins as a learner; the leader promotes it to
  voter once its log is within ``learnerPromoteLag`` entries of the leader's (the leader compares the
  member's acknowledged index with its own: that is the "caught up" test, made where both indexes are
  known).  The broker registers with the name servers as a slave only once (1) it is a voter of the
  configuration in force, (2) the entry that made it one is committed here, and (3) its consume
  queues and metadata are dispatched up to that entry: every message committed before its promotion
  is readable from it.  Before that, consumers are never sent to it.  Once registered it stays
  registered (later configuration changes do not make it wait again) until it is removed.  A member
  of the bootstrap configuration (index 0) passes at once, as before.
* **Removal unregisters.**  When the configuration in force no longer names the member, its broker
  sends UNREGISTER_BROKER to every name server and stops the periodic registration (its heartbeat),
  so the name servers drop it from the route (``mqadmin clusterList`` no longer shows it) and clients
  stop routing to it.  A removed leader stays master until the change commits and it steps down, then
  withdraws.  A removal truncated away (it never committed) puts the member back: it registers again.
  A removed member that is dead has no connection to the name servers, which dropped it when its
  connection closed.  And the master, once a removal is committed, unregisters the removed member's
  broker id from every name server itself (the address the name server lists for that id): a removed
  member that never learns of its removal (cut off from the group) is dropped from the route too,
  until it registers again.

The decision is the pure function :func:`registration_step` (table tests); :class:`MemberRegistration`
moves events and calls :class:`~dledger_rocketmq.namesrv.registration.Registration`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.broker.port import SUCCESS
from dledger_rocketmq.broker.roles import MASTER, numbered_id
from dledger_rocketmq.common import fastjson

log = Logger(namespace="dledger_rocketmq.broker.membership")

GET_BROKER_CLUSTER_INFO = 106
UNREGISTER_BROKER = 104
#: Seconds between the master's checks whether a removal committed, and how many checks at most.
DEPARTED_CHECK = 1.0
DEPARTED_TRIES = 120
#: Seconds between checks of a voter waiting for catch-up (a configuration entry at the end of the log is
#: never delivered to the dispatcher, so no dispatch wait would fire for it).
CATCH_UP_CHECK = 0.5


class Action(Enum):
    REGISTER = "register"
    WAIT = "wait"
    WITHDRAW = "withdraw"


def departed_broker_ids(old, new, self_id: str) -> dict[str, int | None]:
    """Members ``old`` has and ``new`` does not (but this one) -> their broker id (None: not ``n<k>``, unknown)."""
    gone = [m for m in old.ids if new.get(m) is None and m != self_id]
    return {m: (k + 1 if (k := numbered_id(m)) is not None else None) for m in gone}


def listed_address(cluster_info: dict, broker_name: str, broker_id: int) -> str | None:
    """The address a name server's cluster info lists for ``broker_id`` of ``broker_name`` (None: none)."""
    data = (cluster_info.get("brokerAddrTable") or {}).get(broker_name) or {}
    addrs = data.get("brokerAddrs") or {}
    return addrs.get(str(broker_id)) or addrs.get(broker_id)


def registration_step(*, is_master: bool, member: bool, voter: bool, config_index: int, committed: int,
                      dispatched: bool, latched: bool) -> tuple[Action, str]:
    """Whether the broker registers with the name servers now, waits, or withdraws; with the reason.

    ``member``/``voter``: this member in the configuration in force (index ``config_index``);
    ``committed``: this member's committed index; ``dispatched``: its consume queues and metadata reached
    ``config_index``; ``latched``: it registered as a caught-up member before (it does not wait again).
    """
    if is_master:
        return Action.REGISTER, "master"
    if not member:
        return Action.WITHDRAW, "removed from the group's configuration"
    if latched:
        return Action.REGISTER, "registered member"
    if not voter:
        return Action.WAIT, ("a learner: registers once the leader promoted it to voter (its log within "
                             "learnerPromoteLag of the leader's)")
    if config_index > 0 and committed < config_index:  # index 0: the bootstrap --peers, no entry to commit
        return Action.WAIT, f"the configuration entry {config_index} that made it a voter is not committed here yet"
    if not dispatched:
        return Action.WAIT, f"its consume queues are not dispatched up to entry {config_index} yet"
    return Action.REGISTER, "caught up"


class MemberRegistration:
    """Gates a member's :class:`~dledger_rocketmq.namesrv.registration.Registration` on the configuration in force.

    Without ``server.membership`` (a dledger without membership change) the gate is always open and
    nothing is observed: the broker registers as it always did.
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.server = broker.server
        self.registration: Any = None
        self.latched = False
        self.action, self.reason = Action.REGISTER, "no membership change in this dledger"
        self._waiting: Any = None  # the next catch-up check
        self._observed = False
        self.departed: dict[str, int | None] = {}  # removed members the master still has to unregister
        self._departed_timer: Any = None
        self._departed_tries = 0
        self.withdrawn_by_master: list[tuple[str, int, str]] = []  # (member, broker id, address): tests, logs
        self._log = RateLimitedLog(log, self.server.clock, interval=60.0)

    @property
    def membership(self) -> Any:
        return getattr(self.server, "membership", None)

    def attach(self, registration: Any) -> None:
        """Gate ``registration`` and follow the configuration (called once, when the member is built)."""
        self.registration = registration
        registration.gate = self.allows
        registration.on_stop = self.cancel
        membership = self.membership
        if membership is not None and not self._observed:
            self._observed = True
            membership.observe(self._changed)

    # -- the decision ---------------------------------------------------------------------------
    def decide(self) -> tuple[Action, str]:
        membership = self.membership
        if membership is None:
            return Action.REGISTER, "no membership change in this dledger"
        config = membership.configuration
        me = config.get(self.server.self_id)
        committed = self.server.store.committed_index
        index = config.index
        dispatched = index <= 0 or self.broker.progress.caught_up(index)
        action, reason = registration_step(is_master=self.broker.role == MASTER, member=me is not None,
                                           voter=me is not None and me.voter, config_index=index,
                                           committed=committed, dispatched=dispatched, latched=self.latched)
        if action is Action.REGISTER and me is not None:
            self.latched = True
        if action is Action.WAIT and me is not None and me.voter:
            self._recheck()  # until committed and dispatched here (a learner waits for its promotion instead)
        return action, reason

    def allows(self) -> bool:
        """The Registration's gate: True to register now (False: withdraw if registered, else wait)."""
        action, reason = self.decide()
        if action is not self.action or (action is Action.WAIT and reason != self.reason):
            log.info("{id}: name-server registration: {a} ({why})", id=self.server.self_id, a=action.value,
                     why=reason)
        self.action, self.reason = action, reason
        return action is Action.REGISTER

    # -- events ----------------------------------------------------------------------------------------
    def _changed(self, old: Any, new: Any) -> None:
        me = self.server.self_id
        if old.get(me) is not None and new.get(me) is None:
            self.latched = False  # put back (a truncated removal) it waits for catch-up again
            log.info("{id}: removed from the group's configuration (entry {i}): unregistering from the name "
                     "servers once no longer master", id=me, i=new.index)
        gone = departed_broker_ids(old, new, me)
        for m in list(self.departed):
            if new.get(m) is not None:  # back (a truncated removal): nothing to unregister
                del self.departed[m]
        if self.broker.role == MASTER:  # only the master cleans up after removed members
            self.departed.update(gone)
        if self.departed:
            self._departed_tries = 0
            self._schedule_departed()
        self.kick()

    # -- the master unregisters removed members ---------------------------------------------------------------
    def _schedule_departed(self) -> None:
        if self._departed_timer is None or not self._departed_timer.active():
            self._departed_timer = self.server.clock.callLater(DEPARTED_CHECK, self._check_departed)

    def _check_departed(self) -> None:
        """Once the removal is committed, the master unregisters the removed members' broker ids."""
        self._departed_timer = None
        reg, membership = self.registration, self.membership
        if not self.departed or reg is None or not reg.running or membership is None:
            return
        self._departed_tries += 1
        if self.broker.role != MASTER:
            self.departed.clear()  # no longer master: the new master's members unregister themselves
            return
        if not membership.committed():
            if self._departed_tries < DEPARTED_TRIES:
                self._schedule_departed()
            else:
                self.departed.clear()  # not committed in two minutes: leave it to the removed member
            return
        departed, self.departed = self.departed, {}
        for member, broker_id in departed.items():
            if broker_id is None:
                self._log.info(("unknown id", member), "{id}: removed member {m} has no broker id of the form n<k>: "
                               "it unregisters itself, or the name servers drop it 120 s after its last "
                               "registration", id=self.server.self_id, m=member)
                continue
            for addr in reg.namesrv_addrs:
                self._unregister_departed(addr, member, broker_id)

    def _unregister_departed(self, namesrv: str, member: str, broker_id: int) -> None:
        reg, b = self.registration, self.broker
        d = reg.namesrv_client(namesrv)
        d.addCallback(lambda c: c.request(GET_BROKER_CLUSTER_INFO, {}).addCallback(lambda reply: (c, reply)))

        def listed(result: Any) -> Any:
            c, (header, body) = result
            if header.code != SUCCESS:
                return None
            addr = listed_address(fastjson.loads(body), b.options.broker_name, broker_id)
            if addr is None or addr == b.options.store_host:
                return None
            self.withdrawn_by_master.append((member, broker_id, addr))
            log.info("{id}: unregistering removed member {m} (broker id {b}, {a}) from name server {n}",
                     id=self.server.self_id, m=member, b=broker_id, a=addr, n=namesrv)
            return c.request(UNREGISTER_BROKER, {"brokerId": str(broker_id), "clusterName": b.options.cluster_name,
                                                 "brokerAddr": addr, "brokerName": b.options.broker_name})

        def failed(f: Any) -> None:
            self._log.warn(("departed", namesrv), "{id}: could not unregister removed member {m} from name server "
                           "{n}: {e}", id=self.server.self_id, m=member, n=namesrv, e=f.getErrorMessage())
        d.addCallback(listed).addErrback(failed)

    def kick(self) -> None:
        """Re-decide now: register (at once) or withdraw."""
        reg = self.registration
        if reg is not None and reg.running:
            reg.register_all()

    def _recheck(self) -> None:
        if self._waiting is None or not self._waiting.active():
            self._waiting = self.server.clock.callLater(CATCH_UP_CHECK, self._rechecked)

    def _rechecked(self) -> None:
        self._waiting = None
        self.kick()

    def cancel(self) -> None:
        """Stop the timers (the catch-up checks, the departed-member checks)."""
        if self._waiting is not None and self._waiting.active():
            self._waiting.cancel()
        self._waiting = None
        if self._departed_timer is not None and self._departed_timer.active():
            self._departed_timer.cancel()
        self._departed_timer = None

    def status(self) -> dict[str, object]:
        """For ``dledger status`` / tests: the gate's last decision."""
        return {"registration": self.action.value, "reason": self.reason, "caughtUp": self.latched}
