"""Membership change (issue #23): the group's configuration lives in the log.

* :mod:`.configuration` -- what a configuration is (members with id, address and role) and its
  entry body (magic ``CONFIG_CHANGE``, SPEC §5);
* :mod:`.rules` -- the decisions, as pure functions with table tests: which configuration applies,
  the quorum of a configuration, whether a change may be proposed now, the configuration a change
  produces, when a learner is promoted and what a member does once it is removed.

The design (single-server changes, the configuration effective on append, the Ongaro fix) is in
docs/architecture.md "Membership change".
"""
