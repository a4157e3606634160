"""seq2seq.kernels.library where CI requires the kernels: built, loaded, looping in C, on BLAS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.configs import ROOT
from tests.kernels_required import REQUIRE_KERNELS, kernels_missing


@pytest.mark.skipif(
    os.environ.get(REQUIRE_KERNELS) != "1", reason=f"{REQUIRE_KERNELS} is not set (not CI)"
)
def test_the_kernels_are_all_there_where_ci_requires_them() -> None:
    assert kernels_missing() is None


def test_a_broken_build_fails_the_required_suite_with_its_reason(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """CC=false and an empty cache: with the variable the session stops, naming the compiler;
    without it the same tests run (the kernel tests skip, with that reason)."""
    cache = tmp_path_factory.mktemp("empty_cache")
    test = "tests/test_kernels_gru.py::test_steps_split_over_threads_compute_the_same"
    broken = {**os.environ, "CC": "false", "XDG_CACHE_HOME": str(cache)}
    required = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT, env={**broken, REQUIRE_KERNELS: "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert required.returncode == 1, required.stdout[-2000:]
    assert f"{REQUIRE_KERNELS}=1, but the C kernels did not build or load" in required.stdout
    assert "`false -O3" in required.stdout  # the failing compile command, as the reason
    optional = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test],
        cwd=ROOT, env={**broken, REQUIRE_KERNELS: "0"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert optional.returncode == 0, optional.stdout[-2000:]
    assert "skipped" in optional.stdout
