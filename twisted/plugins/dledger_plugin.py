"""twistd dropin: ``twistd dledger`` runs one dledger member (see dledger.tap)."""

from twisted.application.service import ServiceMaker

dledger = ServiceMaker(
    "dledger",
    "dledger.tap",
    "Run one member of a dledger group (Raft-replicated commit log).",
    "dledger",
)
