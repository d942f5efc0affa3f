"""The write load of the membership process tests and bench: what it counts as lost, doubled and an outage."""

from twisted.internet import task
from twisted.internet.defer import Deferred, fail, succeed

from dledger.bench.writeload import PREFIX, WriteLoad
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError


class FlakyClient:
    """Acknowledges after 0.1 s of virtual time, except while ``down`` (a refusal at once)."""

    def __init__(self, clock, state):
        self.clock, self.state = clock, state

    def append(self, body):
        if self.state["down"]:
            return fail(DLedgerError(ResponseCode.NOT_LEADER, "no leader"))
        d = Deferred()
        self.clock.callLater(0.1, d.callback, None)
        return d

    def close(self):
        return succeed(None)


def test_longest_gap_is_the_stretch_without_an_acknowledgement_and_check_finds_lost_and_doubled():
    clock, state = task.Clock(), {"down": False}
    load = WriteLoad(clock, lambda: FlakyClient(clock, state), writers=2, pause=0.05)
    load.start()
    for _ in range(20):
        clock.advance(0.1)
    state["down"] = True
    went_down = clock.seconds()
    for _ in range(30):  # 1.5 s of refusals
        clock.advance(0.05)
    state["down"] = False
    for _ in range(20):
        clock.advance(0.1)
    d = Deferred.fromCoroutine(load.stop())
    clock.advance(1)
    assert d.called and load.failed["NOT_LEADER"] > 0
    gap = load.longest_gap()
    assert 1.3 <= gap.seconds <= 1.8 and went_down - 0.2 <= gap.start <= went_down + 0.2  # in-flight acks land
    assert load.longest_gap(0, went_down - 0.5).seconds <= 0.15
    acked = sorted(load.acked)
    assert load.check(acked).ok
    lost, doubled = acked[0], acked[1]
    check = load.check([b for b in acked if b != lost] + [doubled, PREFIX + b"9:9:never"])
    assert check.missing == [lost] and check.doubled == [doubled] and check.unexpected == [PREFIX + b"9:9:never"]
    assert not check.ok and "1 lost, 1 doubled, 1 never sent" in check.describe()
