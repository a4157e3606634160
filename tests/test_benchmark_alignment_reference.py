"""benchmarks/alignment_reference.py's eflomal rows: each form of its links scored as
``corpus_aer`` scores them, and the table's cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.alignment_reference import EFLOMAL, SPLITS, eflomal_rows, shown
from tests.configs import write_toy_files


def test_eflomal_rows_score_every_form_on_every_split(tmp_path: Path) -> None:
    pytest.importorskip("eflomal")
    data = write_toy_files(tmp_path / "toy", train=300, val=10, test=40)
    (data / "test_long.src").write_text((data / "test.src").read_text())
    (data / "test_long.tgt").write_text((data / "test.tgt").read_text())
    (data / "test_long.align").write_text((data / "test.align").read_text())
    rows = eflomal_rows(data, runs=1)
    assert set(rows) == set(EFLOMAL)
    for splits in rows.values():
        assert set(splits) == set(SPLITS)
        assert all(len(values) == 1 and 0 <= values[0] <= 1 for values in splits.values())


def test_cells_say_the_runs_and_the_interval() -> None:
    assert shown([0.1]) == "0.100 (1 run)"
    assert shown([0.1, 0.1, 0.1]) == "0.100 ± 0.000 (3 runs)"
