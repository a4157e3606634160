"""eflomal (Östling and Tiedemann, 2016): a statistical word aligner beside the attention's links.

eflomal learns from the parallel text it is given (no model to download, nothing trained here):
a Bayesian IBM model with HMM and fertility parts, sampled with Gibbs sampling, in both
directions. As aligners are evaluated, it learns from the pairs to align together with any more
parallel text (``context``: e.g. the training pairs), and only the pairs to align are returned.
Its sampler seeds itself from /dev/urandom, so two runs can differ: compare over several runs.

Words are the whitespace-separated words of each line (eflomal lowercases them), indices from 0,
source first, as everywhere in ``seq2seq.analysis.alignment``.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

from seq2seq.analysis.alignment import Link, parse_pharaoh
from seq2seq.errors import ALIGN, require_extra


def eflomal_links(
    sources: Sequence[str],
    targets: Sequence[str],
    context: tuple[Sequence[str], Sequence[str]] = ((), ()),
) -> tuple[list[list[Link]], list[list[Link]]]:
    """eflomal's links of each (source, target) pair: its source→target model's, and its
    target→source model's (already source first, ready for ``word_alignment.symmetrize``).
    ``context``: more (sources, targets) pairs for it to learn from; their links are dropped."""
    require_extra("align", ALIGN)
    import eflomal

    logging.getLogger("eflomal").setLevel(logging.WARNING)  # its per-call "Prepared N sentences"
    more_sources, more_targets = context
    if len(sources) != len(targets) or len(more_sources) != len(more_targets):
        raise ValueError("eflomal aligns line-parallel sentences: the counts differ.")
    if not sources:
        return [], []
    with tempfile.TemporaryDirectory(prefix="eflomal-") as directory:
        forward, backward = Path(directory) / "forward", Path(directory) / "backward"
        eflomal.Aligner().align(
            [*map(_line, more_sources), *map(_line, sources)],
            [*map(_line, more_targets), *map(_line, targets)],
            links_filename_fwd=str(forward),
            links_filename_rev=str(backward),
            quiet=True,
        )
        skip = len(more_sources)
        return _read(forward, skip), _read(backward, skip)


def _line(text: str) -> str:
    # eflomal reads lines: one sentence must stay one line whatever whitespace it holds.
    return " ".join(text.split()) + "\n"


def _read(path: Path, skip: int) -> list[list[Link]]:
    lines = path.read_text(encoding="utf-8").splitlines()[skip:]
    return [
        sorted(parse_pharaoh(line, f"eflomal's {path.name}:{n}").sure)
        for n, line in enumerate(lines, skip + 1)
    ]
