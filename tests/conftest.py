"""Shared fixtures: one tiny trained model for the inference tests, torch on two threads."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.pipeline import train
from tests.configs import TINY, compose_config
from tests.kernels_required import REQUIRE_KERNELS, kernels_missing

ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    """With ``SEQ2SEQ_REQUIRE_KERNELS=1`` (``.ci/run`` sets it on x86-64 Linux with a C compiler,
    where they must build), kernels that fail to build or load stop the suite with the reason,
    instead of turning every kernel test into a skip and the module tests into comparisons of
    the reference with itself."""
    if os.environ.get(REQUIRE_KERNELS) == "1":
        missing = kernels_missing()
        if missing is not None:
            pytest.exit(f"{REQUIRE_KERNELS}=1, but {missing}.", returncode=1)


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test starts from the same random state, whichever tests ran before it: a test that
    draws random data then passes or fails alone as in the whole suite."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def data_cache_in_a_temporary_directory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """Keep the data cache (data.cache_dir) of every test, and of the scripts they start, out of
    the working tree, and W&B off unless a test turns it on."""
    settings = {
        "SEQ2SEQ_CACHE_DIR": str(tmp_path_factory.mktemp("data_cache")),
        # Runs that do not choose a logger (python train.py ...) get no W&B run; the W&B tests
        # choose their mode themselves.
        "WANDB_MODE": "disabled",
    }
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield
    for name, value in previous.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.ckpt of a small model trained for two epochs on 600 toy pairs (a few seconds).

    Its maximum source length is 8 tokens, so that overlong input is easy to make.
    """
    run_dir = tmp_path_factory.mktemp("tiny_run")
    overrides = [f"run_dir={run_dir}", *TINY, "decoding.max_src_len=8", "logger=csv"]
    result = train(compose_config(overrides))
    return Path(result["best_checkpoint"])


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch on two threads for the test, so that the C passes split their rows over them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)
