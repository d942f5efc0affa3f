"""The client's side of membership change (issue #23): what a MEMBERS reply says, one change, a replacement.

A change is asked of the leader and answered once its configuration entry is committed.  What makes
the client's part more than one request:

* an outcome that may or may not have happened (a timeout, the leader lost; or a removed leader that
  stepped down before its answer arrived) is settled by asking the leader for the configuration, not
  by sending the change again blindly -- a second ``add`` of a member that was added is refused;
* the refusals the leader says are passing ("another configuration change ... retry once it is", "the new
  leader has not committed an entry of its own term yet; retry in a moment": :func:`dledger.membership.rules.refusal`)
  are retried after a pause, every other refusal is the caller's error with the leader's one-line reason;
* ``replace`` is three single-server changes in turn (add, promote, remove), each started once the one
  before is committed, and can be run again after an interruption: it picks up where the group is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.task import deferLater

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.membership.configuration import Configuration, ConfigurationError, check_member, from_json
from dledger.membership.rules import Change, Op, replacement_refusal
from dledger.membership.rules import change_done as done  # its name here before it moved to the rules
from dledger.messages import MembersRequest

#: Words of the leader's refusals that say "not now, retry" (dledger.membership.rules.refusal).
PASSING_REFUSALS = ("; retry",)


@dataclass(frozen=True)
class MembersView:
    """The configuration in force on the member that answered, and how far that member has committed."""

    configuration: Configuration
    committed_index: int
    member: str

    @property
    def committed(self) -> bool:
        """The configuration's entry is committed (0: the bootstrap ``--peers``, committed by definition)."""
        return self.configuration.index <= self.committed_index

    def role(self, member_id: str) -> str | None:
        m = self.configuration.get(member_id)
        return None if m is None else m.role.value

    @classmethod
    def from_response(cls, resp: Any, member: str) -> MembersView:
        try:
            config = from_json(resp.configuration, max(resp.config_index, 0))
        except ConfigurationError as exc:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{member} answered a bad configuration: {exc}") \
                from None
        return cls(config, resp.committed_index, member)

    def to_json(self) -> dict:
        return {"members": [m.to_json() for m in self.configuration.members], "configIndex": self.configuration.index,
                "committedIndex": self.committed_index, "committed": self.committed, "answeredBy": self.member}


def passing(exc: DLedgerError) -> bool:
    """A refusal the leader says to retry, or an answer that says nothing about the change (no leader yet)."""
    return any(word in exc.message for word in PASSING_REFUSALS) or exc.code in (
        ResponseCode.LEADER_NOT_READY, ResponseCode.LEADER_TRANSFERRING, ResponseCode.TERM_CHANGED)


async def pause(client: Any, attempt: int) -> None:
    await deferLater(client.clock, client.retry_delay * min(attempt + 1, 10), lambda: None)


async def leader_view(client: Any) -> MembersView:
    """The configuration as the leader has it (the members' copies may lag behind)."""
    meta = await client.find_leader()
    return await client.members(member=meta.leader_id)


async def change_call(client: Any, op: str, member_id: str, *, address: str | None = None,
                      learner: bool | None = None) -> MembersView:
    """Ask the leader for one change; the leader's MembersView once it is committed.

    DLedgerError with the leader's one-line reason when it refuses (bad id or address, not a member,
    no quorum for the new configuration, a Java member in the group) -- unless the configuration
    already is what was asked (a retried change that had been made).
    """
    try:
        change = Change(Op(op), member_id, address or "", bool(learner))
        if change.op is Op.ADD:
            check_member(member_id, change.address)
    except (ValueError, ConfigurationError) as exc:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, str(exc)) from None
    asked: list[str] = []

    def make(m: str) -> MembersRequest:
        asked.append(m)
        return MembersRequest(group=client.group, remote_id=m, op=op, member_id=member_id,
                              address=address if change.op is Op.ADD else None,
                              learner=bool(learner) if change.op is Op.ADD else None)

    # Was it already so before we asked?  Then a refusal is the answer ("n7 is not a member"), not a success.
    try:
        already = done((await leader_view(client)).configuration, change)
    except DLedgerError:
        already = False
    last: DLedgerError | None = None
    for attempt in range(client.max_attempts):
        try:
            resp = await client._call(make, retry_ambiguous=False)
        except DLedgerError as exc:
            last = exc
            try:
                view = await leader_view(client)
            except DLedgerError:
                view = None
            if view is not None and not already and done(view.configuration, change):
                return await settled(client, view)  # made, though its answer was lost or came as a refusal
            if passing(exc) or exc.code in (ResponseCode.TIMEOUT, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
                                            ResponseCode.NETWORK_ERROR):
                await pause(client, attempt)
                continue
            raise
        view = MembersView.from_response(resp, asked[-1] if asked else "?")
        client.learn(view.configuration)
        return view
    raise last or DLedgerError(ResponseCode.TIMEOUT, f"{op} {member_id}: no attempt made")


async def settled(client: Any, view: MembersView, timeout: float = 30.0) -> MembersView:
    """``view`` once its configuration is committed on the leader (asked again until it is, within ``timeout``)."""
    deadline = client.clock.seconds() + timeout
    attempt = 0
    while not view.committed:
        if client.clock.seconds() >= deadline:
            raise DLedgerError(ResponseCode.TIMEOUT, f"configuration entry {view.configuration.index} not committed "
                                                     f"within {timeout:g}s")
        await pause(client, attempt)
        attempt += 1
        view = await leader_view(client)
    client.learn(view.configuration)
    return view


class Replacement:
    """``replace OLD NEW=HOST:PORT``: add NEW, wait until it is a voter, remove OLD; each step reported.

    The leader promotes a learner added without ``--learner`` by itself once it is within
    ``learnerPromoteLag`` entries; if it has not (the group runs with ``learnerPromoteLag = -1``) once
    the new member holds everything the leader had committed when the wait began, this asks for the
    promotion.  Run again after an interruption, it skips the steps the configuration shows done.
    """

    def __init__(self, client: Any, *, progress: Callable[[str], None] | None = None,
                 catch_up_timeout: float = 600.0, poll: float = 0.2):
        self.client = client
        self.progress = progress or (lambda line: None)
        self.catch_up_timeout = catch_up_timeout
        self.poll = poll

    async def run(self, old: str, new_id: str, new_address: str) -> MembersView:
        client, say = self.client, self.progress
        if (why := replacement_refusal(old, new_id, new_address)) is not None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, why)
        view = await settled(client, await leader_view(client))
        config = view.configuration
        if (why := replacement_refusal(old, new_id, new_address, config)) is not None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, why)
        existing = config.get(new_id)
        if existing is None:
            say(f"adding {new_id}={new_address} as a learner (members: {', '.join(config.ids)})")
            view = await client.add_member(new_id, new_address)
            say(f"added {new_id}: configuration entry {view.configuration.index} committed")
        else:
            say(f"{new_id} is already a {existing.role.value}: not added again")
        if not view.configuration.is_voter(new_id):
            view = await self.until_voter(new_id)
        if view.configuration.get(old) is not None:
            say(f"removing {old}" + (" (the leader: it hands leadership over)" if self.leader_was(old) else ""))
            view = await client.remove_member(old)
            say(f"removed {old}: configuration entry {view.configuration.index} committed")
        else:
            say(f"{old} is no longer a member: nothing to remove")
        say(f"replaced {old} by {new_id}: {view.configuration.describe()}")
        return view

    def leader_was(self, member_id: str) -> bool:
        return self.client.leader == member_id

    async def until_voter(self, new_id: str) -> MembersView:
        """Poll until ``new_id`` is a voter (promoted by the leader, else by us once caught up)."""
        client, say = self.client, self.progress
        start = client.clock.seconds()
        leader_meta = await client.find_leader()
        target = leader_meta.committed_index
        say(f"waiting for {new_id} to catch up to index {target} and become a voter")
        caught_up_polls = 0
        last_said = start
        while True:
            view = await leader_view(client)
            if view.configuration.is_voter(new_id):
                view = await settled(client, view)
                say(f"{new_id} is a voter (configuration entry {view.configuration.index}), "
                    f"{client.clock.seconds() - start:.1f}s after it was added")
                return view
            if view.configuration.get(new_id) is None:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"{new_id} was removed while it caught up")
            end = await self.end_index(new_id)
            now = client.clock.seconds()
            if end is not None and end >= target:
                caught_up_polls += 1
                if caught_up_polls >= 3:  # the leader had three polls' time to promote it by itself
                    say(f"{new_id} caught up (index {end}); promoting it")
                    try:
                        return await client.promote_member(new_id)
                    except DLedgerError as exc:
                        if "already a voter" not in exc.message:
                            raise
            elif now - last_said >= 5.0:
                say(f"{new_id} holds up to index {end if end is not None else '?'} of {target}")
                last_said = now
            if now - start > self.catch_up_timeout:
                raise DLedgerError(ResponseCode.TIMEOUT, f"{new_id} did not become a voter within "
                                                         f"{self.catch_up_timeout:g}s (it holds up to index "
                                                         f"{end}); is it running with --join?")
            await deferLater(client.clock, self.poll, lambda: None)

    async def end_index(self, member_id: str) -> int | None:
        try:
            meta = await self.client.metadata(member_id)
        except DLedgerError:
            return None
        return getattr(meta, "ledger_end_index", None)
