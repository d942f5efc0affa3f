"""Exceptions raised by dledger.

Every failure a peer or client can observe carries a :class:`ResponseCode`,
so the same exception can be turned into a reply without a lookup table.
"""

from __future__ import annotations

from dledger.codes import ResponseCode


class DLedgerError(Exception):
    """A request failed with a protocol-level ``code``.

    ``leader_id`` is filled for NOT_LEADER so that clients can redirect.
    """

    def __init__(self, code: ResponseCode, message: str = "", *, leader_id: str | None = None):
        self.code = ResponseCode(code)
        self.leader_id = leader_id
        self.message = message
        super().__init__(f"{self.code.name}({int(self.code)}): {message}" if message else self.code.name)


class OutcomeUnknown(DLedgerError):
    """The request was written to a connection that was lost before its answer came (the transport's fail_pending).

    The peer may have read and executed it, so it is not safe to resend a request that changes something (an
    append: the body could be stored twice). Its code stays NETWORK_ERROR for those who only look at codes; the
    client (``dledger.client``) tells it apart from a connection that never carried the request.
    """


class ConfigError(ValueError):
    """The configuration is invalid; the message names the option and the fix."""


class StoreError(Exception):
    """A store cannot be opened or used (bad layout, unreadable files)."""


class DamagedStoreError(StoreError):
    """Start-up found damage that recovery may not cut on its own; ``str()`` is the one line an operator reads.

    Raised (instead of deleting anything) when the damage lies at or below the
    checkpoint's committed index or verified entries follow it: cutting there
    would drop entries this member may have acknowledged.  The line names the
    file, the byte offset and the entry index where known, and the way out
    (restore the files, or ``--truncate-damaged``).  ``finding`` is the
    :class:`dledger.store.recovery.Damage` it was raised for.
    """

    def __init__(self, line: str, finding=None):
        super().__init__(line)
        self.finding = finding


class BatchAppendError(DLedgerError):
    """A batch append stopped at one entry: ``stored`` were appended before it, nothing after.

    Carries the code, message and leader of ``cause`` (the error the failing
    entry raised, as a one-entry append would have), so callers that only
    look at the code need not know it came from a batch.
    """

    def __init__(self, cause: DLedgerError, stored: list):
        super().__init__(cause.code, cause.message, leader_id=cause.leader_id)
        self.cause = cause
        self.stored = stored


class AppendHookError(DLedgerError):
    """An append hook raised on a leader append: that entry (and its request) fails, the leader goes on.

    The code is APPEND_REFUSED (431, dledger's own: no Java DLedger code means
    "a plugin refused this"), so a client can tell a plugin's refusal from the
    member's own checks; the reply carries the message as its remark, and
    ``dledger append`` prints it.  ``hook_code`` is what the hook raised: its
    own code if it raised a :class:`DLedgerError` (a hook may refuse a body
    with UNEXPECTED_ARGUMENT, say), INTERNAL_ERROR for any other exception (a
    plugin bug).  The message names the hook, the entry and the error.
    """

    def __init__(self, hook_code: ResponseCode, message: str = "", *, leader_id: str | None = None):
        super().__init__(ResponseCode.APPEND_REFUSED, message, leader_id=leader_id)
        self.hook_code = ResponseCode(hook_code)


class StoreInUseError(StoreError):
    """Another process holds the store directory's lock: its message is the one line an operator reads."""


class StoreOwnerError(StoreError):
    """The store belongs to another group or member (its identity record says which); ``--adopt-store`` overrides."""


class TermVoteLostError(StoreError):
    """The term/vote record of a store that holds a log is missing or damaged; the message names the repair."""

