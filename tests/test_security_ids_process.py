"""Issue #21 item 3 against a live ``twistd dledger`` group: a member cannot move leadership in another's name.

Before, with n2's valid member certificate, a LEADERSHIP_TRANSFER whose ``leaderId``/``transferId`` said n1 was
answered 200 and leadership moved n1 -> n0: the claim check did not cover code 51005.  Now every id of every
request is checked against the authenticated identity (``dledger.security.policy.ID_RULES``): such a transfer
is refused (NOT_AUTHORIZED) in both modes, the leader and term stay, and the real path -- an admin client asking
the leader, the leader asking the transferee in its own name -- still moves leadership.
"""

import pytest
import pytest_twisted
from test_security_process import attackers, secured_group

from dledger import messages
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.launcher import durable_store

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]


@pytest.mark.parametrize("mode", ["tls", "secret"])
@pytest_twisted.ensureDeferred
async def test_a_member_cannot_move_leadership_in_another_members_name(tmp_path, reactor, mode):
    """Transfers sent with a follower's member credential are refused; an admin's transfer still works."""
    group, d = secured_group(tmp_path, reactor, mode)
    admin = group.client(request_timeout=2.0)
    impostor_client = None
    try:
        leader = (await group.start_and_wait(30)).leader_id
        await admin.append(b"before")
        metas = await group.wait_converged(admin, 20)
        term = metas[0].term
        victim, impostor = [mid for mid in group.ids if mid != leader]
        impostor_client = attackers(reactor, d, mode, impostor)["impostor member"]
        addr = {mid: f"127.0.0.1:{group.members[mid].port}" for mid in group.ids}
        T = messages.LeadershipTransferRequest
        forged = {
            # the attack: to the leader, every id naming the leader
            "as the leader, to the leader": (leader, T(group="g0", remote_id=leader, leader_id=leader, local_id=leader,
                                                       transfer_id=leader, transferee_id=victim, term=term)),
            # the leader's second step, forged: "take leadership" to the transferee
            "as the leader, to the transferee": (victim, T(group="g0", remote_id=victim, leader_id=leader,
                                                           local_id=leader, transfer_id=leader, transferee_id=victim,
                                                           term=term, take_leadership_ledger_index=0)),
            # in its own name, but it is not the leader
            "in its own name": (victim, T(group="g0", remote_id=victim, leader_id=impostor, local_id=impostor,
                                          transfer_id=impostor, transferee_id=victim, term=term)),
            "as a client would": (leader, T(group="g0", remote_id=leader, transfer_id=leader, transferee_id=victim,
                                            term=term)),
        }
        answers = {}
        for what, (target, request) in forged.items():
            resp = await impostor_client.send(addr[target], request)
            answers[what] = ResponseCode.of(resp.code).name
        assert answers == {what: "NOT_AUTHORIZED" for what in forged}, answers
        after = await group.wait_converged(admin, 10)
        assert (after[0].term, after[0].leader_id) == (term, leader), "a forged transfer moved leadership"
        lines = [x for mid in group.ids for x in group.log_lines(mid, "refused a request from")]
        assert any("request code 51005 refused" in x for x in lines), lines  # rate-limited: one per address and code

        # admin -> leader -> transferee (the leader speaking for itself).  A transfer may fail on a loaded machine
        # (the transferee's vote round, the catch-up wait): a few bounded attempts, but never NOT_AUTHORIZED.
        failures = []
        for _ in range(3):
            try:
                resp = await admin.transfer(victim)
                assert resp.response_code is ResponseCode.SUCCESS
                break
            except DLedgerError as exc:
                assert exc.code is not ResponseCode.NOT_AUTHORIZED, exc
                failures.append(exc)
                await group.wait_for_leader(admin, 15)
        else:
            raise AssertionError(f"the admin's transfer failed three times: {failures}")
        moved = await group.wait_for_leader(admin, 15)
        assert moved.leader_id == victim
        await impostor_client.close()
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
    finally:
        if impostor_client is not None:
            await impostor_client.close()
        await admin.close()
        group.close()
