"""The replication simulator's "outsider" fault (issue #13): forged frames without credentials."""

import pytest

from dledger.testing import outsider as outsider_mod
from dledger.testing.replication_sim import run_replication_seed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_forged_frames_without_credentials_have_no_effect_with_auth_on(seed):
    """With authMode=secret, plausible forged VOTE/PUSH/TRANSFER/APPEND and out-of-range frames change nothing."""
    r = run_replication_seed(seed, duration=3.0, outsider="auth")
    assert r.forged > 50
    assert r.outsider_effects == [] and r.ok, r.problems()


@pytest.mark.parametrize("seed", [4, 5])
def test_out_of_range_values_have_no_effect_without_auth(seed):
    """Without authentication, out-of-range terms and indexes are refused by the bounds checks: no state change."""
    r = run_replication_seed(seed, duration=3.0, outsider="bounds")
    assert r.forged > 20
    assert r.outsider_effects == [] and r.ok, r.problems()


def test_the_outsider_detects_frames_that_get_through(monkeypatch):
    """The check can fail: with the guard removed, forged frames reach the members and are reported."""
    monkeypatch.setattr(outsider_mod.Outsider, "_guard", lambda self: None)
    r = run_replication_seed(1, duration=3.0, outsider="auth")
    assert any("reached the member's handler" in e for e in r.outsider_effects)
    assert not r.ok
