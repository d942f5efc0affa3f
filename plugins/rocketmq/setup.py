"""Packaging for dledger-rocketmq: the RocketMQ broker layer as a dledger plugin."""

from setuptools import Extension, find_packages, setup

with open("README.md", encoding="utf-8") as fh:
    LONG_DESCRIPTION = fh.read()

setup(
    name="dledger-rocketmq",
    version="0.1.0",
    description="RocketMQ 4.x broker layer (CommitLog records, consume queues) on dledger, as a dledger plugin",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # twisted/plugins/rocketmq_namesrv_plugin.py: the `twistd rocketmq-namesrv` dropin (no __init__.py there, as
    # Twisted wants; an editable compat install finds it on sys.path, a normal install copies it).
    packages=find_packages(include=["dledger_rocketmq", "dledger_rocketmq.*"]) + ["twisted.plugins"],
    # A flat layout named as such: an editable install in the default mode then puts this directory on
    # sys.path (a static .pth) rather than an import hook twistd cannot see, so the dropin is found.
    package_dir={"": "."},
    package_data={"twisted": ["plugins/rocketmq_namesrv_plugin.py"]},
    # Optional C speedups of per-message loops (dledger_rocketmq/common/native.py decides whether they are
    # used; the pure-Python code is the reference and the fallback): without a compiler the install succeeds.
    ext_modules=[Extension("dledger_rocketmq.common._speedups", ["dledger_rocketmq/common/_speedups.c"],
                           libraries=["z"], optional=True)],
    install_requires=["dledger", "PyYAML>=5.1"],  # plain_acl.yml (RocketMQ ACL)
    entry_points={
        # The same group dledger's own stores and transports use.
        "dledger": ["rocketmq = dledger_rocketmq.plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Twisted",
    ],
)
