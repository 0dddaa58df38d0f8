"""The API conformance suite's fixtures: a session folder for the TensorRT library stubs, and
the `gpu_api` marker (with room for a first install) on every test here. The installs and
the probe live in realmods.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from realmods import INSTALL_TIMEOUT_S


@pytest.fixture(scope="session")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trt-stubs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "gpu_api" in str(item.path):
            item.add_marker(pytest.mark.gpu_api)
            item.add_marker(pytest.mark.timeout(INSTALL_TIMEOUT_S * 2))  # a first install
