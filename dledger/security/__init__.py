"""Who may send which request to a member: authentication (mutual TLS or a group secret) and roles.

Why (issue #13): the DLedger protocol has no authentication, so anyone who can reach a member's port
can forge VOTE, HEART_BEAT and PUSH frames and erase or plant committed entries.  With ``authMode``
``tls`` or ``secret`` a member only accepts member-to-member requests from authenticated members whose
certificate (or secret-mode login) names the id the request claims, and clients need a role.

* :mod:`dledger.security.policy` -- the decisions (pure functions, table-tested);
* :mod:`dledger.security.secret` -- the group-secret handshake and per-frame HMAC (pure functions);
* :mod:`dledger.security.tls` -- TLS context options and the identity in a peer certificate;
* :mod:`dledger.security.certs` -- ``dledger certs init``: a CA and certificates for a local group;
* :mod:`dledger.security.guard` -- what a connection applies: loaded credentials plus the policy.

See docs/security.md.
"""
