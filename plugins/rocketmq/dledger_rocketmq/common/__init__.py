"""RocketMQ's ``common`` (and its ``remoting`` bodies): what every other sub-package builds on.

CommitLog record and property codec (:mod:`.message`), SEND_BATCH_MESSAGE bodies (:mod:`.batch`), fastjson's
dialect of JSON (:mod:`.fastjson`), the broker's control entries (:mod:`.control`), the plain_acl.yml model and
its decisions (:mod:`.acl`), the HeartbeatData body (:mod:`.heartbeat`) and the error types (:mod:`.errors`).
Imports nothing else of the plugin.
"""
