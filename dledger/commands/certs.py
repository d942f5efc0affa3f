"""``dledger certs``: a CA, member and client certificates, a group secret and client tokens for a local group."""

from __future__ import annotations

import sys

from dledger.commands.argtypes import positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("certs", help="create a CA and certificates for TLS / authentication",
                              description="Create what authMode=tls and authMode=secret need (docs/security.md).")
    sub = p.add_subparsers(dest="certs_action", metavar="ACTION")
    sub.required = True
    i = sub.add_parser("init", help="a new CA, one certificate per member and client, a group secret",
                       description="Write DIR/ca.crt and ca.key, DIR/<member>.crt/.key per member, "
                                   "DIR/client-<name>.crt/.key per client, DIR/group.secret (groupSecretFile) "
                                   "and DIR/clients.txt (clientsFile: roles and tokens). Keys are mode 0600.")
    i.add_argument("dir", metavar="DIR", help="directory to write into (created if missing)")
    i.add_argument("--group", required=True, help="the group name (put in every certificate as O=)")
    i.add_argument("--members", required=True, help="member ids separated by commas, e.g. n0,n1,n2")
    i.add_argument("--clients", default="", help="client names separated by commas, each NAME or NAME:ROLE "
                                                 "(role read, write or admin; default write)")
    i.add_argument("--days", type=positive_int, default=365, help="validity in days (default 365)")
    i.add_argument("--force", action="store_true", help="replace an existing CA in DIR")
    i.set_defaults(func=cmd_init)
    s = sub.add_parser("issue", help="add or renew one certificate with the CA in DIR",
                       description="Sign a new certificate for a member or client with DIR/ca.key "
                                   "(adding a member, renewing before expiry).")
    s.add_argument("dir", metavar="DIR", help="directory holding ca.crt and ca.key")
    who = s.add_mutually_exclusive_group(required=True)
    who.add_argument("--member", help="a member id")
    who.add_argument("--client", help="a client name")
    s.add_argument("--days", type=positive_int, default=365, help="validity in days (default 365)")
    s.set_defaults(func=cmd_issue)


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def cmd_init(args) -> int:
    from dledger.security.certs import CertsError, init_group, parse_client_spec

    try:
        clients = [parse_client_spec(c) for c in _split(args.clients)]
        written = init_group(args.dir, args.group, _split(args.members), clients, days=args.days, force=args.force)
    except (CertsError, OSError) as exc:
        print(f"dledger certs init: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(written)} files to {args.dir}: " + ", ".join(p.name for p in written))
    return 0


def cmd_issue(args) -> int:
    from dledger.security.certs import CertsError, issue_into

    unit, name = ("member", args.member) if args.member else ("client", args.client)
    try:
        crt, key = issue_into(args.dir, unit, name, days=args.days)
    except (CertsError, OSError) as exc:
        print(f"dledger certs issue: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {crt} and {key}")
    return 0
