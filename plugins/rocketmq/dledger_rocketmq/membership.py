"""Broker members coming and going (issue #23 item 6): broker ids, when a new member registers, removal.

A dledger group's members change online (``dledger members add|promote|remove|replace``); the
configuration in force is ``server.membership`` (:class:`dledger.interfaces.IMembership`), which this
module observes.  What the broker layer does about it:

* **Broker ids** stay RocketMQ's (:func:`dledger_rocketmq.roles.broker_id_for`): a member ``n<k>``
  is slave ``k + 1``, whenever it joined -- a member added later with a new id never takes an existing
  or a removed member's id (use a new id for a new machine: ``n3``, ``n4``...).  Ids of another form
  keep their position among the bootstrap ``--peers`` (as before); a member that *joins* with such an
  id (``joinExisting``) gets :func:`~dledger_rocketmq.roles.joined_broker_id`, a number derived from
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
  connection closed.

The decision is the pure function :func:`registration_step` (table tests); :class:`MemberRegistration`
moves events and calls :class:`~dledger_rocketmq.registration.Registration`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from twisted.logger import Logger

from dledger_rocketmq.roles import MASTER

log = Logger(namespace="dledger_rocketmq.membership")

class Action(Enum):
    REGISTER = "register"
    WAIT = "wait"
    WITHDRAW = "withdraw"


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
    if committed < config_index:
        return Action.WAIT, f"the configuration entry {config_index} that made it a voter is not committed here yet"
    if not dispatched:
        return Action.WAIT, f"its consume queues are not dispatched up to entry {config_index} yet"
    return Action.REGISTER, "caught up"


class MemberRegistration:
    """Gates a member's :class:`~dledger_rocketmq.registration.Registration` on the configuration in force.

    Without ``server.membership`` (a dledger without membership change) the gate is always open and
    nothing is observed: the broker registers as it always did.
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.server = broker.server
        self.registration: Any = None
        self.latched = False
        self.action, self.reason = Action.REGISTER, "no membership change in this dledger"
        self._waiting: Any = None  # the dispatch wait for the configuration entry
        self._waiting_for = -1
        self._observed = False

    @property
    def membership(self) -> Any:
        return getattr(self.server, "membership", None)

    def attach(self, registration: Any) -> None:
        """Gate ``registration`` and follow the configuration (called once, when the member is built)."""
        self.registration = registration
        registration.gate = self.allows
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
            self._wait_dispatch(index)  # the dispatch reaches the entry only once it is committed here
        return action, reason

    def allows(self) -> bool:
        """The Registration's gate: True to register now (False: withdraw if registered, else wait)."""
        action, reason = self.decide()
        if (action, reason) != (self.action, self.reason):
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
        self.kick()

    def kick(self) -> None:
        """Re-decide now: register (at once) or withdraw."""
        reg = self.registration
        if reg is not None and reg.running:
            reg.register_all()

    def _wait_dispatch(self, index: int) -> None:
        if self._waiting is not None and not self._waiting.called and self._waiting_for == index:
            return
        self.cancel()
        self._waiting_for = index
        d = self._waiting = self.broker.progress.wait_dispatched(index)
        d.addCallbacks(lambda _: self.kick(), lambda f: None)

    def cancel(self) -> None:
        if self._waiting is not None and not self._waiting.called:
            self._waiting.cancel()
        self._waiting = None
        self._waiting_for = -1

    def status(self) -> dict[str, object]:
        """For ``dledger status`` / tests: the gate's last decision."""
        return {"registration": self.action.value, "reason": self.reason, "caughtUp": self.latched}
