"""Scenario transcripts for SPEC §3 and §4 (tests/transcripts/*.txt, run by dledger.testing.transcript)."""

from pathlib import Path

import pytest

from dledger.testing.transcript import Block, parse, render, run_transcript

TRANSCRIPTS = sorted((Path(__file__).parent / "transcripts").glob("*.txt"))


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_transcript(path):
    """Every command of the transcript prints exactly the output written under it."""
    problems = run_transcript(path)
    assert not problems, "\n\n".join(problems)


def test_there_are_transcripts_for_the_spec_scenarios():
    """The SPEC §3/§4 scenarios the design names (and reads, preferred leaders) each have a transcript."""
    names = {p.stem for p in TRANSCRIPTS}
    assert {"five_node_question", "figure_8", "stale_truncate", "follower_behind_begin", "check_quorum",
            "transfer", "read_index", "preferred_leader"} <= names


def test_a_wrong_expected_output_is_reported(tmp_path):
    """A transcript whose expected output differs from what the command prints fails, naming the line."""
    path = tmp_path / "t.txt"
    path.write_text("follower n1 term=1 leader=n0\n----\nok\n\nfollower-state\n----\nend=7 commit=-1 log: (empty)\n")
    problems = run_transcript(path, rewrite=False)
    assert len(problems) == 1 and "t.txt:5: follower-state" in problems[0] and "end=-1" in problems[0]


def test_parse_and_render_round_trip():
    """Comments, commands and outputs survive a rewrite unchanged."""
    text = "# why\ncmd a=1\n----\nline 1\nline 2\n\n# trailing\n"
    blocks = parse(text)
    assert blocks[0] == Block(2, ["# why"], "cmd a=1", "line 1\nline 2")
    assert render(blocks) == text
