"""Shared pytest setup for test/unit.

Every test session gets a private kernel cache (``OPFUSE_CACHE_DIR`` in a temporary
folder): results never depend on what an earlier run left in ``~/.cache/opfuse``, and the
tests never write there. A test that checks the cache itself sets its own folder. Analyses
kept between passes are checked (``OPFUSE_CHECK_ANALYSES``).
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
        # every function graph a pass reuses from an earlier one is checked against a fresh
        # build: a pass that changes the IR without saying so fails its own tests
        mp.setenv("OPFUSE_CHECK_ANALYSES", "1")
        yield


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (exhaustive sweeps)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="an exhaustive sweep: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
