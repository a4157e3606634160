"""``metrics.csv`` that survives crashes and resumes: Lightning's CSVLogger, made safe to continue.

Lightning's writer deletes an existing ``metrics.csv`` when it starts (a resumed run would lose the
history of the run it continues) and writes every 100 steps (a crash would lose the rows since).
This one writes each row when it is logged, and on its first write in a directory that already
holds a ``metrics.csv`` it keeps the earlier rows whose step comes before the first step it
writes, so the rows of steps that a resumed run replays (those logged after the checkpoint it
resumes from) are replaced, not duplicated. A last line cut short by a crash is dropped.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import CSVLogger as LightningCSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter

from seq2seq.atomic import write_atomic

log = logging.getLogger(__name__)


class CSVLogger(LightningCSVLogger):
    """Writes ``save_dir/name/version/metrics.csv``; ``name=""`` and ``version=""`` put it in
    ``save_dir`` itself. ``flush_logs_every_n_steps=1`` writes every row when it is logged."""

    def __init__(
        self,
        save_dir: str | Path,
        name: str = "",
        version: str = "",
        prefix: str = "",
        flush_logs_every_n_steps: int = 1,
    ) -> None:
        super().__init__(
            save_dir,
            name=name,
            version=version,
            prefix=prefix,
            flush_logs_every_n_steps=flush_logs_every_n_steps,
        )

    @property
    def experiment(self) -> ResumingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ResumingWriter(log_dir=self.log_dir)
        assert isinstance(self._experiment, ResumingWriter)
        return self._experiment


class ResumingWriter(ExperimentWriter):
    """Lightning's writer, continuing an existing ``metrics.csv`` instead of deleting it."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self._merge_pending = Path(self.metrics_file_path).is_file()

    def _check_log_dir_exists(self) -> None:
        """Lightning warns here and deletes metrics.csv; its rows are kept (see ``save``)."""

    def save(self) -> None:
        if not self.metrics or not self._merge_pending:
            super().save()
            return
        self._merge_pending = False
        path = Path(self.metrics_file_path)
        earlier = read_complete_rows(path)
        first_new_step = min(int(row["step"]) for row in self.metrics)
        kept = [row for row in earlier if _step(row) < first_new_step]
        if len(kept) < len(earlier):
            log.info(
                "%s: replacing %d row(s) of steps >= %d, logged after the checkpoint this run "
                "resumes from",
                path,
                len(earlier) - len(kept),
                first_new_step,
            )
        rows: list[dict[str, Any]] = [*kept, *self.metrics]
        self.metrics_keys = sorted(set().union(*rows))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)  # \r\n, as Lightning's
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(path, lambda temporary: temporary.write_text(text.getvalue(), newline=""))
        self.metrics = []


def read_complete_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a metrics.csv, without a last line that a crash cut short or whose step is
    unreadable."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # an unfinished last row
    rows = [
        {key: value for key, value in row.items() if value not in ("", None)}
        for row in csv.DictReader(io.StringIO(text))
    ]
    return [row for row in rows if not math.isnan(_step(row))]


def _step(row: dict[str, Any]) -> float:
    try:
        return float(row["step"])
    except (KeyError, TypeError, ValueError):
        return math.nan
