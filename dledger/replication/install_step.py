"""A leader's dispatcher in step INSTALL: when a follower's log does not reach into ours, stream a snapshot.

:class:`InstallStep` is a base of :class:`dledger.replication.leader.EntryDispatcher`, kept apart from its
PUSH path: :func:`~dledger.replication.snapshot_rules.after_compare_snapshot` decides, and
:class:`~dledger.replication.snapshot_send.SnapshotSend` moves the chunks.  It uses the dispatcher's own
state (``leader``, ``peer``, ``gen``, ``sending``) and its steps (``become``, ``matched``, ``pump``).
"""

from __future__ import annotations

from twisted.logger import Logger

from dledger.replication import snapshot_rules
from dledger.replication.rules import Step
from dledger.replication.snapshot_send import SnapshotSend

log = Logger(namespace="dledger.replication.leader")


class InstallStep:
    """The INSTALL step of one follower's dispatcher."""

    # -- InstallSnapshot ------------------------------------------------------------------------
    def _snapshot_instead(self, nxt, same: bool, follower_end: int) -> bool:
        """The follower's log does not reach into ours: stream the newest snapshot instead (True if started).

        :func:`~dledger.replication.snapshot_rules.after_compare_snapshot` decides; a Java member keeps the
        TRUNCATE (it cannot take a snapshot) and the leader says, once a minute, what would bring it back.
        """
        lead = self.leader
        store = lead.store
        newest = lead.snapshot_store.newest() if lead.snapshot_store is not None else None
        verdict = snapshot_rules.after_compare_snapshot(nxt, same, store.ledger_begin_index,
                                                        newest.index if newest is not None else None,
                                                        lead.peer_installs(self.peer))
        if verdict is snapshot_rules.Verdict.JAVA_BEHIND:
            lead.java_log.warn(("java behind", self.peer), "{id}: follower {peer} is a Java DLedger member and "
                               "needs entries below this leader's first index {begin} (it ends at {end}); Java "
                               "members cannot take a snapshot. Fix: copy a current member's store directory to it "
                               "while it is stopped (docs/snapshots.md, 'Mixed groups')", id=lead.self_id,
                               peer=self.peer, begin=store.ledger_begin_index, end=follower_end)
            return False
        if verdict is not snapshot_rules.Verdict.INSTALL:
            return False
        self.become(Step.INSTALL, newest.index)
        lead.follower_log.info(("install", self.peer), "{id}: follower {peer} needs entries below our first index "
                               "{begin} (it ends at {end}): sending it snapshot {name} ({size} bytes)",
                               id=lead.self_id, peer=self.peer, begin=store.ledger_begin_index, end=follower_end,
                               name=newest.dirname, size=newest.size)
        gen = self.gen

        def send(req, timeout):
            return lead.transport.send(self.peer, req, timeout=timeout)

        def base():
            return dict(group=lead.group, remote_id=self.peer, local_id=lead.self_id, leader_id=lead.self_id,
                        term=lead.term)

        self.sending = SnapshotSend(peer=self.peer, manifest=newest, snapshot_store=lead.snapshot_store, send=send,
                                    request_base=base, clock=lead.clock, timeout=lead.push_timeout,
                                    poll_interval=lead.heartbeat, chunk_size=lead.snapshot_chunk_size,
                                    window=lead.snapshot_window,
                                    on_done=lambda m: self._installed(gen, m),
                                    on_failed=lambda why, unsupported: self._install_failed(gen, why, unsupported))
        self.sending.start()
        return True

    def _installed(self, gen: int, manifest) -> None:
        """The follower's state is the snapshot: PUSH goes on from its index + 1."""
        if not self.accepts(gen):
            return
        sending, self.sending = self.sending, None
        lead = self.leader
        secs = max(lead.clock.seconds() - sending.started_at, 1e-9) if sending is not None else 0.0
        sent = sending.sent_bytes if sending is not None else 0
        log.info("{id}: follower {peer} installed snapshot {name} ({sent} bytes sent in {secs:.2f}s, "
                 "{rate:.1f} MB/s); replicating from index {next}", id=lead.self_id, peer=self.peer,
                 name=manifest.dirname, sent=sent, secs=secs, rate=sent / secs / 1e6 if secs else 0.0,
                 next=manifest.index + 1)
        self._answering()
        self.matched(manifest.index)
        self.become(Step.APPEND, manifest.index + 1)
        lead.watermark_changed(self)
        self.pump()

    def _install_failed(self, gen: int, why: str, unsupported: bool) -> None:
        if not self.accepts(gen):
            return
        self.sending = None
        if unsupported:
            self.leader.peer_unsupported(self.peer)
        self._retry_later(f"InstallSnapshot: {why}")
