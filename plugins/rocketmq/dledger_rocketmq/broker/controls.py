"""Control entries through the log: what the broker facade's offset and metadata changes write.

A consumer offset commit, a topic / subscription-group change or an ACL becomes one control entry
(:mod:`~dledger_rocketmq.common.control`) appended by the master; the caller's Deferred fires with the
entry's index once it is committed *and* applied by this member's metadata machine, so a following read
sees it.  Apart from the :class:`~dledger_rocketmq.broker.broker.Broker` because it is its own concern (the
way into the log and its failures), not the facade's.  In a group mixed with Java brokers
:meth:`~dledger_rocketmq.broker.mixed.MixedGroup.route_control` decides where an entry goes instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred, fail, maybeDeferred
from twisted.python.failure import Failure

from dledger.codes import ResponseCode, Role
from dledger.errors import DLedgerError
from dledger.messages import AppendEntryRequest
from dledger_rocketmq.common.control import (
    KIND_ACL_CONFIG,
    KIND_GROUP_CONFIG,
    KIND_TOPIC_CONFIG,
    OffsetCommit,
    acl_entry,
    encode_metadata,
    encode_offset_commits,
)


class ControlWriter:
    """The broker's control entries: appended by the master, waited for until applied here.

    ``broker`` gives the member (``server``), its roles (``roles.is_master``), the metadata machine
    (``machine.wait_applied``), the mixed-group router (``mixed.route_control``) and the metadata
    (``meta.acl``).
    """

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        #: Topic/group creations in flight: (control kind, name) -> waiters (one log entry per name at a time).
        self._creating: dict[tuple[int, str], list[Deferred]] = {}

    def commit_offsets(self, commits: Sequence[OffsetCommit], *, reset: bool = False) -> Deferred:
        try:
            body = encode_offset_commits(list(commits), reset=reset)
        except ValueError as exc:
            return fail(exc)
        return self.append(body)

    def change_metadata(self, kind: int, configs: Sequence[dict]) -> Deferred:
        try:
            body = encode_metadata(kind, list(configs), int(self.broker.server.clock.seconds() * 1000))
        except ValueError as exc:
            return fail(exc)
        return self.append(body)

    def change_acl(self, config, source: str, file_source: str | None = None) -> Deferred:
        file_source = self.broker.meta.acl.file_source if file_source is None else file_source
        return self.change_metadata(KIND_ACL_CONFIG, [acl_entry(config, source, file_source)])

    def create_topic(self, config: dict) -> Deferred:
        return self._create_once(KIND_TOPIC_CONFIG, config["topicName"], config)

    def create_group(self, config: dict) -> Deferred:
        return self._create_once(KIND_GROUP_CONFIG, config["groupName"], config)

    def _create_once(self, kind: int, name: str, config: dict) -> Deferred:
        key = (kind, name)
        d: Deferred = Deferred()
        waiters = self._creating.get(key)
        if waiters is not None:
            waiters.append(d)
            return d
        self._creating[key] = [d]

        def done(result):
            for waiter in self._creating.pop(key, []):
                if isinstance(result, Failure):
                    waiter.errback(result)
                else:
                    waiter.callback(result)
        self.change_metadata(kind, [config]).addBoth(done)
        return d

    def append(self, body: bytes, *, force: bool = False) -> Deferred:
        """Append one control entry (master only); fires with its index once committed and applied here.

        Unless ``force``, the mixed group routes it first (it may apply it locally: fires with -1).
        """
        broker = self.broker
        server = broker.server
        if server.state.role is not Role.LEADER or not broker.roles.is_master():
            return fail(DLedgerError(ResponseCode.NOT_LEADER, f"{server.self_id} is not the master",
                                     leader_id=server.state.leader_id))
        if not force:
            routed = broker.mixed.route_control(body)
            if routed is not None:
                return routed
        d = maybeDeferred(server.handle_append, AppendEntryRequest(group=server.config.group, body=body))

        def appended(resp):
            code = getattr(resp, "code", ResponseCode.SUCCESS)
            if int(code) != int(ResponseCode.SUCCESS):
                raise DLedgerError(ResponseCode(int(code)), f"control entry append answered {code}")
            index = resp.index
            return broker.machine.wait_applied(index).addCallback(lambda _: index)
        return d.addCallback(appended)
