"""State machines, snapshots and what they let the log forget (issue #22, docs/snapshots.md).

:mod:`.manifest` says what a snapshot holds, :mod:`.rules` decides (pure),
:mod:`.store` keeps the files, :mod:`.machines` feeds the state machines and
takes and restores snapshots.
"""
