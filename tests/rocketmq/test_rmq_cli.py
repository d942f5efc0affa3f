"""``dledger rocketmq`` commands: argument checks, one-line errors, ``inspect`` of the golden store."""

from __future__ import annotations

import json

import pytest

from dledger import cli


@pytest.mark.parametrize("argv, text", [
    (["rocketmq", "send", "nohost", "T", "x"], "ADDR must be ip:port"),
    (["rocketmq", "send", "127.0.0.1:9", "T", "x", "--queue", "-1"], "negative"),
    (["rocketmq", "pull", "127.0.0.1:9", "g", "T", "--max", "0"], "not positive"),
    (["rocketmq", "send", "127.0.0.1:9", "T"], "required"),
])
def test_argument_errors_exit_2(argv, text, capsys):
    """Bad arguments are one argparse line and exit 2, before any connection."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


def test_offsets_set_needs_group_and_form(capsys):
    """--set QUEUE=OFFSET is checked (exit 2) and needs --group."""
    assert cli.main(["rocketmq", "offsets", "127.0.0.1:9", "T", "--set", "0=x"]) == 2
    assert "QUEUE=OFFSET" in capsys.readouterr().err
    assert cli.main(["rocketmq", "offsets", "127.0.0.1:9", "T", "--set", "0=3"]) == 2
    assert "--group" in capsys.readouterr().err


def test_inspect_golden_store(main_store, capsys):
    """inspect reads the golden master store offline: queues with offsets, last messages, consumer offsets."""
    assert cli.main(["rocketmq", "inspect", str(main_store), "--last", "2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    queues = {(q["topic"], q["queueId"]): q for q in info["queues"]}
    gt2 = queues[("GoldenTopic", 2)]
    assert (gt2["minOffset"], gt2["maxOffset"]) == (0, 8)
    assert [m["queueOffset"] for m in gt2["last"]] == [6, 7]
    assert gt2["last"][-1]["body"] == "golden: wakes up a held pull"
    assert queues[("GoldenBulk", 0)]["maxOffset"] == 150
    assert "GoldenTopic" in info["topics"] and "RaftNode00" in info["topics"]
    assert "broker-a" not in info["topics"]  # only what the store's topics.json holds
    assert any(c["group"] == "golden_pull_cg" for c in info["consumerOffsets"])
    assert cli.main(["rocketmq", "inspect", str(main_store)]) == 0
    assert "queue GoldenTopic/2: min 0 max 8" in capsys.readouterr().out


def test_inspect_missing_dir(tmp_path, capsys):
    """inspect of a missing directory is one line and exit 2."""
    assert cli.main(["rocketmq", "inspect", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("dledger rocketmq: error:")


def test_inspect_store_written_by_the_plugin(tmp_path, capsys):
    """inspect reads a one-member mmap group's broker store: queue offsets, last messages, committed offsets."""
    from dledger_rocketmq.common.control import OffsetCommit
    from rmq_cluster_util import master, msg, put, settled

    from dledger import plugins
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing import Cluster

    cluster = Cluster(1, seed=4, plugin_manager=plugins.make_plugin_manager(), store_base_dir=str(tmp_path),
                      mapped_file_size_for_entry_data=65536,
                      extras={"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000},
                      store_factory=lambda mid, cfg, state: MmapLogStore.from_config(cfg, state, clock=cluster.clock))
    cluster.start()
    b = master(cluster)
    for i in range(4):
        assert put(cluster, b, msg(topic="Insp", queue_id=1, body=f"m{i}".encode(), tags="T")).ok
    done = []
    b.commit_offsets([OffsetCommit("grp", "Insp", 1, 2)]).addBoth(done.append)
    assert cluster.run_until(lambda: bool(done), 10) and settled(cluster)
    stopped = []
    cluster.stop().addBoth(stopped.append)
    assert cluster.run_until(lambda: bool(stopped), 30)
    assert cli.main(["rocketmq", "inspect", str(tmp_path / "rocketmq-n0"), "--last", "2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    [q] = [q for q in info["queues"] if q["topic"] == "Insp"]
    assert (q["queueId"], q["minOffset"], q["maxOffset"]) == (1, 0, 4)
    assert [(m["queueOffset"], m["body"], m["tags"]) for m in q["last"]] == [(2, "m2", "T"), (3, "m3", "T")]
    assert {"group": "grp", "topic": "Insp", "queue_id": 1, "offset": 2} in info["consumerOffsets"]


@pytest.mark.parametrize("argv, text", [
    (["--access-key", "producer1"], "--access-key and --secret-key-file go together"),
    (["--secret-key-file", "/nonexistent"], "--access-key and --secret-key-file go together"),
    (["--access-key", "producer1", "--secret-key-file", "/nonexistent/secret"], "cannot read the secret key"),
    (["--tls-cert", "c.crt", "--tls-key", "c.key"], "--tls-cert/--tls-key need --tls-ca"),
    (["--tls-ca", "/nonexistent/ca.crt"], "/nonexistent/ca.crt"),
])
def test_credential_options_are_checked_before_connecting(argv, text, capsys):
    """The ACL and TLS options give one line and exit 2 when they cannot be used (nothing listens on port 9)."""
    assert cli.main(["rocketmq", "send", "127.0.0.1:9", "T", "x", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dledger rocketmq: error:") and text in err and err.count("\n") == 1
