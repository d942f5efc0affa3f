"""Every numbered or named constant of the protocol, in one place.

The numbers are Java DLedger's (``DLedgerResponseCode``,
``DLedgerRequestCode``) so that frames and logs read the same on both sides;
enum *names* are what travels in JSON bodies (``"ACCEPT"``, ``"COMMIT"``).
"""

from __future__ import annotations

import enum


class ResponseCode(enum.IntEnum):
    """Result of a request; carried in every response body as ``code``."""

    UNKNOWN = -1
    SUCCESS = 200
    TIMEOUT = 300
    METADATA_ERROR = 301
    NETWORK_ERROR = 302
    UNSUPPORTED = 303
    UNKNOWN_GROUP = 400
    UNKNOWN_MEMBER = 401
    UNEXPECTED_MEMBER = 402
    EXPIRED_TERM = 403
    NOT_LEADER = 404
    NOT_FOLLOWER = 405
    INCONSISTENT_STATE = 406
    INCONSISTENT_TERM = 407
    INCONSISTENT_INDEX = 408
    INCONSISTENT_LEADER = 409
    INDEX_OUT_OF_RANGE = 410
    UNEXPECTED_ARGUMENT = 411
    REPEATED_REQUEST = 412
    REPEATED_PUSH = 413
    DISK_ERROR = 414
    DISK_FULL = 415
    TERM_NOT_READY = 416
    FALL_BEHIND_TOO_MUCH = 417
    TAKE_LEADERSHIP_FAILED = 418
    INDEX_LESS_THAN_LOCAL_BEGIN = 419
    REQUEST_WITH_EMPTY_BODYS = 420
    PUSH_REQUEST_IS_FULL = 421
    NOT_AUTHORIZED = 430  # dledger: authentication is on and this connection may not send this request
    APPEND_REFUSED = 431  # dledger: an append hook (a plugin) refused the entry; the reply's remark says why
    CONFIG_CHANGE_REFUSED = 432  # dledger: a membership change cannot proceed now (issue #23); the remark says why
    INTERNAL_ERROR = 500
    TERM_CHANGED = 501
    WAIT_QUORUM_ACK_TIMEOUT = 502
    LEADER_PENDING_FULL = 503
    ILLEGAL_MEMBER_STATE = 504
    LEADER_NOT_READY = 505
    LEADER_TRANSFERRING = 506

    @classmethod
    def of(cls, value: int) -> ResponseCode:
        """Map any integer to a code; numbers we do not know become UNKNOWN."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class RequestCode(enum.IntEnum):
    """Request code in the remoting frame header."""

    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005
    INSTALL_SNAPSHOT = 51006
    SNAPSHOT = 50100  # dledger: an admin asks a member to take a snapshot now (``dledger snapshot``)
    MEMBERS = 50101  # dledger: list or change the group's configuration (``dledger members``, issue #23)


#: Request codes reserved for plugins (dledger extension): a plugin serves the ones it declares with the
#: ``dledger_request_handlers`` hook (:class:`dledger.plugin_types.RequestHandler`); the frames carry a
#: :class:`dledger.messages.PluginRequest`.  Java DLedger uses none of them.
PLUGIN_REQUEST_CODES = range(55000, 56000)


class Role(enum.Enum):
    """A member's role. Every member starts as CANDIDATE."""

    CANDIDATE = "CANDIDATE"
    FOLLOWER = "FOLLOWER"
    LEADER = "LEADER"


class VoteResult(enum.Enum):
    """A member's answer to a VoteRequest (SPEC §3 "Handling a vote")."""

    UNKNOWN = "UNKNOWN"
    ACCEPT = "ACCEPT"
    REJECT_UNKNOWN_LEADER = "REJECT_UNKNOWN_LEADER"
    REJECT_UNEXPECTED_LEADER = "REJECT_UNEXPECTED_LEADER"
    REJECT_EXPIRED_VOTE_TERM = "REJECT_EXPIRED_VOTE_TERM"
    REJECT_ALREADY_VOTED = "REJECT_ALREADY_VOTED"
    REJECT_ALREADY_HAS_LEADER = "REJECT_ALREADY_HAS_LEADER"
    REJECT_TERM_NOT_READY = "REJECT_TERM_NOT_READY"
    REJECT_TERM_SMALL_THAN_LEDGER = "REJECT_TERM_SMALL_THAN_LEDGER"
    REJECT_EXPIRED_LEDGER_TERM = "REJECT_EXPIRED_LEDGER_TERM"
    REJECT_SMALL_LEDGER_END_INDEX = "REJECT_SMALL_LEDGER_END_INDEX"
    REJECT_TAKING_LEADERSHIP = "REJECT_TAKING_LEADERSHIP"


class VoteParseResult(enum.Enum):
    """What a candidate decides after counting one round of votes (SPEC §3 table)."""

    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"
    PASSED = "PASSED"
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"


class PushType(enum.Enum):
    """Kind of a PUSH request from a leader's dispatcher to a follower."""

    APPEND = "APPEND"
    COMMIT = "COMMIT"
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"


class EntryType(enum.IntEnum):
    """An entry's ``magic``: what kind of entry it is."""

    NORMAL = 1
    NOOP = 2
    CONFIG_CHANGE = 3
