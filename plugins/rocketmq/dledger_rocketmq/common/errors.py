"""Errors of the RocketMQ layer: one-line messages an operator can act on.

The codec errors subclass :class:`dledger.entry.CodecError` (dledger's public
codec error), so code that already guards against bad entry bytes also
catches bad message bytes, and the message ends with ``(at offset N)``.
"""

from __future__ import annotations

from dledger.entry import CodecError as _DLedgerCodecError


class CodecError(_DLedgerCodecError):
    """Bytes or values do not make a valid RocketMQ record, unit or batch.

    ``offset`` is where decoding started, or None for a value refused while encoding.
    """

    def __init__(self, message: str, offset: int | None = None):
        if offset is None:
            ValueError.__init__(self, message)
            self.offset = None
        else:
            super().__init__(message, offset)


class TruncatedRecordError(CodecError):
    """The buffer ends inside a record (a torn write or a short read)."""


class CorruptRecordError(CodecError):
    """The bytes are there but wrong: bad magic, inconsistent lengths, CRC mismatch, bad UTF-8."""


class RecordTooLargeError(CodecError):
    """A record, topic, body or property string exceeds what RocketMQ's layout or limits allow."""


class StoreLayoutError(ValueError):
    """A store directory does not look like RocketMQ's layout (missing, misnamed or overlapping files)."""


class ArgumentError(ValueError):
    """A request whose extFields lack a required field or carry a bad value (answered SYSTEM_ERROR)."""
