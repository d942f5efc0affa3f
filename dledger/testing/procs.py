"""Child processes for process tests: a ``ProcessProtocol`` that writes the child's output to a log file.

Process tests start Java peers, name servers and members with ``reactor.spawnProcess``; each test used to
carry its own copy of this class.
"""

from __future__ import annotations

from pathlib import Path

from twisted.internet import protocol
from twisted.internet.defer import Deferred


class LogFile(protocol.ProcessProtocol):
    """A child whose stdout and stderr go to ``log`` (appended); :attr:`ended` fires when it has exited."""

    def __init__(self, log: Path):
        self.log = log.open("ab")
        self.ended: Deferred = Deferred()

    def outReceived(self, data):
        self.log.write(data)

    errReceived = outReceived

    def processEnded(self, reason):
        self.log.close()
        self.ended.callback(None)
