"""Deliberately broken builds: what shows a fault kind can fail the checker.

A mutation is installed into a member process by the nemesis only, through the
member's command line (``python -c "...mutations.install('stale-read')...twistd..."``):
no config option, environment variable or plugin can turn one on, so a
production member never runs one.

=================  ===========================================================================
stale-read         the leader answers a GET past its committed index with INDEX_OUT_OF_RANGE at
                   once, without the heartbeat round that confirms it still leads (no ReadIndex)
lonely-commit      the leader counts an entry committed once it holds it itself (a quorum of one)
vote-anything      a voter grants its vote whatever the candidate's log (no up-to-date check,
                   Raft §5.4.1): a member that missed entries can be elected and truncate them
follower-read      a member that does not lead answers every GET from its own committed prefix (as
                   if marked ``followerRead``) instead of redirecting to the leader, and says "not
                   there yet" (INDEX_OUT_OF_RANGE) past it: a read served without ReadIndex from a
                   log that may be behind
=================  ===========================================================================
"""

from __future__ import annotations

MUTATIONS = ("stale-read", "lonely-commit", "vote-anything", "follower-read")


def install(name: str) -> None:
    """Patch this process's dledger with mutation ``name`` (before the member is built)."""
    if name == "stale-read":
        from dledger import reads

        real = reads.read_decision

        def read_decision(leads, follower_read, begin, ledger_begin, committed, member):
            decision = real(leads, follower_read, begin, ledger_begin, committed, member)
            if decision.action is reads.ReadAction.CONFIRM:
                return reads._past_committed(begin, committed, member)
            return decision
        reads.read_decision = read_decision
    elif name == "lonely-commit":
        from dledger.replication import leader

        def leader_commit_index(current, own, peer_marks, members, term_start_index):
            return max(current, own) if own >= term_start_index >= 0 else current
        leader.leader_commit_index = leader_commit_index
    elif name == "vote-anything":
        from dledger.election import elector

        real_vote = elector.decide_vote

        def decide_vote(view, candidate, term, ledger_end_term, ledger_end_index, is_self):
            return real_vote(view, candidate, term, view.ledger_end_term, view.ledger_end_index, is_self)
        elector.decide_vote = decide_vote
    elif name == "follower-read":
        from dledger import reads

        real_read = reads.read_decision

        def read_decision(leads, follower_read, begin, ledger_begin, committed, member):
            return real_read(leads, True, begin, ledger_begin, committed, member)
        reads.read_decision = read_decision
    else:
        raise ValueError(f"unknown mutation {name!r}: one of {', '.join(MUTATIONS)}")


def bootstrap(name: str | None, twistd: str) -> str:
    """The ``python -c`` program of a member: install ``name`` (if any), then run ``twistd``."""
    if not name:
        return twistd
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}: one of {', '.join(MUTATIONS)}")
    return f"from dledger.testing.nemesis import mutations; mutations.install({name!r})\n{twistd}"
