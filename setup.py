"""Packaging for dledger: a Raft-replicated commit log on Twisted."""

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the optional C extension (dledger._native_c) if a compiler is there; install without it if not.

    The pure-Python code is the reference and the fallback (dledger/_native.py decides which runs)."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers: the pure-Python code runs
            print(f"warning: dledger._native_c not built ({exc}); the pure-Python codec runs")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} not built ({exc}); the pure-Python codec runs")



with open("README.md", encoding="utf-8") as fh:
    LONG_DESCRIPTION = fh.read()

setup(
    name="dledger",
    version="0.1.0",
    description="A Raft-replicated commit log for Python on Twisted (DLedger-compatible)",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["dledger", "dledger.*"]) + ["twisted.plugins"],
    # A flat layout named as such: an editable install in setuptools' default mode (`pip install -e .`) then
    # puts the repository on sys.path with a static .pth, as compat mode does, instead of an import hook;
    # twistd scans sys.path for twisted/plugins/dledger_plugin.py, which an import hook never shows it.
    package_dir={"": "."},
    # Optional: the entry codec's batch loops in C (issue #28 Round 2g; docs/benchmarks.md); DLEDGER_PURE=1 skips it.
    ext_modules=[Extension("dledger._native_c", ["dledger/_native.c"], optional=True, extra_compile_args=["-O2"])],
    cmdclass={"build_ext": OptionalBuildExt},
    package_data={"twisted": ["plugins/dledger_plugin.py"], "dledger.status": ["static/*"]},
    install_requires=[
        "twisted>=24.3",
        "zope.interface>=6",
        "pluggy>=1.5",
        "crc32c>=2.4",
        "lmdb>=1.4",
        "prometheus_client>=0.20",
        "twisted[tls]>=24.3",  # pyOpenSSL + service_identity: TLS on the member port (docs/security.md)
        "cryptography>=42",  # dledger certs init: a CA and member/client certificates
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-twisted>=1.14", "hypothesis>=6.100", "ruff>=0.6", "pyyaml>=6"],
        # `dledger bench ... --plot FILE.svg` only; the member never imports it.
        "plot": ["matplotlib>=3.7"],
    },
    entry_points={
        "console_scripts": ["dledger = dledger.cli:main"],
        # Built-ins register through the same group a third-party plugin uses.
        "dledger": [
            "memory = dledger.store.memory",
            "mmap = dledger.store.mmapfile",
            "lmdb = dledger.store.lmdbstore",
            "inprocess = dledger.transport.inprocess",
            "tcp = dledger.transport.tcp",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Twisted",
        "Topic :: System :: Distributed Computing",
    ],
)
