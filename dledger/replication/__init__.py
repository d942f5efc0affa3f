"""Log replication (SPEC §4): the leader's dispatchers and quorum check, the follower's entry handler."""
