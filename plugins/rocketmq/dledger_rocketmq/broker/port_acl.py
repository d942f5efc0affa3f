"""Access control on the broker port: RocketMQ ACL (``rocketmq.aclEnable``) and client-certificate roles.

:class:`PortAccess` is what :meth:`dledger_rocketmq.broker.port.BrokerPort.process`
asks before any handler runs, so every request code is covered, including
codes added later (a code without a row in :func:`dledger_rocketmq.common.acl.needs`
needs a valid signature; the admin codes need an admin account).

Where the accounts come from: ``rocketmq.aclFile`` (a RocketMQ 4.x
``plain_acl.yml``) is read when the member starts (a bad file stops the start
with one line).  The master puts it in effect on every member through the log
(control kind 7) when it becomes master and the group has not applied that
file yet; mqadmin's ``updateAclConfig`` (50), ``deleteAccessConfig`` (51) and
``updateGlobalWhiteAddr`` (53) change it the same way.  Until the log carried
an ACL, a member enforces its own file.

With ``rocketmq.tlsClientAuth`` the port speaks TLS with the member's
certificate and asks for client certificates signed by the group CA
(``authMode = "tls"``): a connection with one is judged by the certificate's
role (:func:`dledger_rocketmq.common.acl.decide_role`), one without by the ACL (or
refused when the ACL is off).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.broker.port import SUCCESS, SYSTEM_ERROR, Reply, Request
from dledger_rocketmq.common import acl

log = Logger()

UPDATE_AND_CREATE_ACL_CONFIG = acl.UPDATE_AND_CREATE_ACL_CONFIG
DELETE_ACL_CONFIG = acl.DELETE_ACL_CONFIG
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = acl.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG
#: CreateAccessConfigRequestHeader's fields (perm lists are comma-separated in the header).
ACCOUNT_FIELDS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                  "topicPerms", "groupPerms")


def account_from_header(ext: dict[str, str], existing: dict | None) -> dict:
    """The account an UPDATE_AND_CREATE_ACL_CONFIG asks for: the existing one with the fields given replaced."""
    raw = dict(existing or {})
    for key in ACCOUNT_FIELDS:
        value = ext.get(key)
        if value is None:
            continue
        if key in ("topicPerms", "groupPerms"):
            raw[key] = [item.strip() for item in value.split(",") if item.strip()]
        elif key == "admin":
            raw[key] = value.lower() == "true"
        else:
            raw[key] = value
    return raw


class PortAccess:
    """The broker port's check (see the module docstring); ``refuse(request)`` -> Reply or None."""

    def __init__(self, broker: Any, *, acl_file: str = "", enabled: bool = False, identify: Any = None,
                 clock: Any = None):
        self.broker = broker
        self.enabled = enabled
        self.acl_file = acl_file
        #: The file's ACL (read now: a bad file raises AclConfigError, one line) and its source tag in the log.
        self.file_config = acl.load_acl_file(acl_file) if enabled and acl_file else None
        self.file_source = f"file:{self.file_config.digest()}" if self.file_config is not None else ""
        #: ``identify(conn) -> role | None`` for connections with a client certificate (tlsClientAuth), or None.
        self.identify = identify
        self._log = RateLimitedLog(log, clock or broker.server.clock)
        self.refused = 0

    def config(self) -> acl.AclConfig | None:
        """The ACL in effect here: the last one the log carried, else this member's file."""
        return self.broker.meta.acl.config or self.file_config

    def refuse(self, request: Request) -> Reply | None:
        conn = request.conn
        host = conn.born_host.host if conn is not None else None
        role = self.identify(conn) if self.identify is not None and conn is not None else None
        if role is not None:
            refusal = acl.decide_role(role, request.code, request.ext, request.body)
        elif self.enabled:
            refusal = acl.decide(self.config() or acl.AclConfig({}), request.code, request.ext, request.body, host)
        else:
            refusal = acl.decide_role(None, request.code, request.ext, request.body)
        if refusal is None:
            return None
        self.refused += 1
        self._log.warn(("refused", host, request.code), "{id}: rocketmq port refused request {code} from {host}: "
                       "{why}", id=self.broker.server.self_id, code=request.code, host=host, why=refusal.message)
        return Reply(SYSTEM_ERROR, refusal.remark)

    # -- the master puts its file in effect -----------------------------------------------------------
    def on_master(self, broker: Any) -> Deferred | None:
        """Append this member's file as the group's ACL unless the group already applied that file."""
        if self.file_config is None or broker.meta.acl.file_source == self.file_source:
            return None
        log.info("{id}: putting the ACL of {f} in effect on the group ({n} accounts)", id=broker.server.self_id,
                 f=self.acl_file, n=len(self.file_config.accounts))
        d = broker.change_acl(self.file_config, self.file_source, self.file_source)
        d.addErrback(lambda f: log.warn("{id}: the ACL of {f} was not put in effect: {e}",
                                        id=broker.server.self_id, f=self.acl_file, e=f.getErrorMessage()))
        return d

    # -- mqadmin's ACL codes ------------------------------------------------------------------------------------
    def _change(self, build) -> Reply | Deferred:
        if not self.enabled:
            return Reply(SYSTEM_ERROR, "The broker does not enable acl")
        try:
            config = build(self.config() or acl.AclConfig({}))
        except acl.AclConfigError as exc:
            return Reply(SYSTEM_ERROR, str(exc))
        d = self.broker.change_acl(config, "admin")
        d.addCallback(lambda _: Reply(SUCCESS, None))
        d.addErrback(lambda f: Reply(SYSTEM_ERROR, f.getErrorMessage()))
        return d

    def update_account(self, req: Request) -> Reply | Deferred:
        ak = req.ext.get("accessKey")
        if not ak:
            return Reply(SYSTEM_ERROR, "accessKey is required")

        def build(config: acl.AclConfig) -> acl.AclConfig:
            existing = config.accounts.get(ak)
            return config.with_account(account_from_header(req.ext, dict(existing.raw) if existing else None))
        return self._change(build)

    def delete_account(self, req: Request) -> Reply | Deferred:
        ak = req.ext.get("accessKey")
        if not ak:
            return Reply(SYSTEM_ERROR, "accessKey is required")
        return self._change(lambda config: config.without_account(ak))

    def update_global_white(self, req: Request) -> Reply | Deferred:
        addrs = req.ext.get("globalWhiteAddrs") or ""
        return self._change(lambda config: config.with_global_white(a.strip() for a in addrs.split(",") if a.strip()))


def install(port: Any) -> None:
    """Add mqadmin's ACL codes (answered only when the port has an ACL)."""
    access = getattr(port, "access", None)

    def handler(name: str):
        def run(req: Request) -> Reply | Deferred:
            if access is None or not access.enabled:
                return Reply(SYSTEM_ERROR, "The broker does not enable acl")
            return getattr(access, name)(req)
        return run
    port.handlers[UPDATE_AND_CREATE_ACL_CONFIG] = handler("update_account")
    port.handlers[DELETE_ACL_CONFIG] = handler("delete_account")
    port.handlers[UPDATE_GLOBAL_WHITE_ADDRS_CONFIG] = handler("update_global_white")
