"""Packaging: the console script, the twistd dropin and the README's two commands."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BIN = Path(sys.executable).parent


def run(*args, cwd="/"):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_twistd_finds_the_dledger_plugin_from_any_directory():
    """The installed project exposes twisted/plugins/dledger_plugin.py to twistd (not only from the repo root)."""
    out = run(str(BIN / "twistd"), "--help")
    assert out.returncode == 0, out.stderr
    assert "dledger" in out.stdout


def test_console_script_lists_plugins():
    """`dledger plugins` prints the built-in memory store and where it came from."""
    out = run(str(BIN / "dledger"), "plugins")
    assert out.returncode == 0, out.stderr
    assert "memory" in out.stdout and "entry point 'dledger'" in out.stdout


def test_config_command_rejects_bad_files(tmp_path):
    """`dledger config` exits 2 with the option named when the file is wrong."""
    bad = tmp_path / "bad.toml"
    bad.write_text('peers = "n0-127.0.0.1:99999"\n')
    out = run(str(BIN / "dledger"), "config", str(bad))
    assert out.returncode == 2 and "out of range" in out.stderr


def test_readme_has_exactly_two_setup_commands():
    """The README's quick start is `make demo` and `make test`, and CI calls `make test`."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quick start")[1].split("```sh")[1].split("```")[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("projects, command, usage", [
    (["."], "dledger", "dledger [--config FILE]"),
    ([".", "plugins/rocketmq"], "rocketmq-namesrv", "rocketmq-namesrv"),
])
def test_default_mode_editable_install_lets_twistd_find_the_dropin(tmp_path, projects, command, usage):
    """`pip install -e .` in setuptools' default mode (not only compat) exposes the twistd dropin (issue 30, item 3).

    The editable wheels are built as pip builds them (PEP 660 ``build_editable``) and unpacked into a fresh
    venv whose only other path is this venv's site-packages (Twisted and the dependencies, without our own
    ``.pth``); twistd then runs there from an unrelated directory, as an operator would.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_dir = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site_dir / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for k, project in enumerate(projects):
        wheels = tmp_path / f"wheels{k}"
        build = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                                "print(b.build_editable(sys.argv[1]))", str(wheels)], cwd=ROOT / project,
                               capture_output=True, text=True, timeout=120)
        assert build.returncode == 0, build.stderr[-2000:]
        with zipfile.ZipFile(wheels / build.stdout.strip().splitlines()[-1]) as zf:
            zf.extractall(site_dir)
    from dledger.launcher import TWISTD

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", TWISTD, command, "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={**env, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stdout[-500:] + out.stderr[-2000:]
    assert usage in out.stdout
