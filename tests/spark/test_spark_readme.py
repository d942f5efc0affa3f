"""README's `spark.read.format("dledger")` block, run as written in a user's own process and SparkSession.

The user's process has no PYSPARK_PYTHON and `python3` on its PATH is an interpreter without dledger-spark
(the base Python of this venv): what a user who pip-installed dledger-spark into a venv has.  Its own
Spark JVM, so this module has no shared session.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from spark_util import group_fixture  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.spark, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]


def snippet(readme: Path) -> str:
    """The one ```python block of ``readme`` that reads format("dledger")."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), re.S)
              if 'format("dledger")' in b]
    assert len(blocks) == 1, f"{readme}: expected one python block reading format('dledger'), got {len(blocks)}"
    return blocks[0]


def test_both_readmes_show_the_same_block():
    """spark/README.md (the distribution's long description) shows the block the top-level README runs."""
    assert snippet(ROOT / "spark" / "README.md") == snippet(ROOT / "README.md")


def test_readme_snippet_runs_as_written_in_a_users_own_session(group, tmp_path):
    """The README block, verbatim, in a fresh process without PYSPARK_PYTHON: it reads the committed entries."""
    group.append([b"readme-%d" % i for i in range(120)])
    expected = len(group.committed())
    script = tmp_path / "users_job.py"
    script.write_text(snippet(ROOT / "README.md"), encoding="utf-8")
    shim = tmp_path / "bin"
    shim.mkdir()
    base = getattr(sys, "_base_executable", None) or sys.executable
    (shim / "python3").symlink_to(base)  # python3 on PATH: no dledger-spark, as on a user's machine
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "DLEDGER_"))}
    env.update(PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}", DLEDGER_PEERS=group.peers)
    probe = subprocess.run(["python3", "-c", "import dledger_spark"], env=env, capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0, "python3 on the user's PATH must lack dledger-spark for this test to mean anything"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{expected} entries" in done.stdout.splitlines()
