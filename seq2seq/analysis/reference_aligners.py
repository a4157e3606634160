"""A word aligner's links beside the runs' attention: the reference rows of ``seq2seq compare``.

Another aligner (eflomal, ``seq2seq align --eflomal --write``) gives a Pharaoh file of links for
the test set the runs were scored on. Its row holds its test AER against the same gold links; each
group of runs is tested against it on AER with the stratified approximate randomization of
``seq2seq.analysis.significance`` (each seed's links of a sentence against the reference's,
swapped with probability ½ in every stratum, the reference's links repeated in each), so that
"attention aligns better or worse than the aligner" comes with a p-value over all seeds.

The gold file must be the runs' test gold: each run's ``test_alignments.tsv`` holds, per sentence,
its count of sure gold links, and a file whose counts differ is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seq2seq.analysis.alignment import (
    AlignmentCounts,
    count_links,
    read_pharaoh,
)
from seq2seq.analysis.compare import RunsError
from seq2seq.analysis.groups import Group, group_figures, markdown, p_text, read_alignments
from seq2seq.analysis.intervals import Interval
from seq2seq.analysis.metrics import TEST_ALIGNMENTS
from seq2seq.analysis.significance import (
    SHUFFLES,
    aer_statistics,
    corpus_aer,
    stratified_randomization,
)


@dataclass(frozen=True)
class ReferenceAligner:
    """An aligner's links of the test sentences, with their counts against the gold."""

    name: str
    counts: list[AlignmentCounts]

    @property
    def aer(self) -> float:
        total = AlignmentCounts()
        for sentence in self.counts:
            total += sentence
        return total.aer


def read_reference(
    name: str, links: Path, gold: Path, targets: Sequence[str] | None = None
) -> ReferenceAligner:
    """``links`` (Pharaoh, one line per test sentence) scored against ``gold``. ``targets``: the
    runs' test references, whose words every link's target index must fall within (links of
    other sentences are refused rather than scored)."""
    predicted = read_pharaoh(links, f"the links of --reference {name}")
    references = read_pharaoh(gold, "the gold links (--gold)")
    if len(predicted) != len(references):
        raise RunsError(
            f"--reference {name}={links} has {len(predicted)} lines but --gold {gold} has "
            f"{len(references)}: give the links of the runs' test sentences, one line each."
        )
    if targets is not None and len(targets) != len(predicted):
        raise RunsError(
            f"--reference {name}={links} has {len(predicted)} lines but the runs' test set has "
            f"{len(targets)} sentences: give the links of the runs' test sentences."
        )
    for number, found in enumerate(predicted, 1):
        if found.possible != found.sure:
            raise RunsError(
                f"{links}:{number}: possible links (i-p-j) in an aligner's output; an aligner "
                "gives links, write them as i-j."
            )
        sentence = None if targets is None else targets[number - 1].split()
        for origin, given in ((links, found), (gold, references[number - 1])):
            beyond = [(i, j) for i, j in sorted(given.possible) if sentence is not None and
                      j >= len(sentence)]  # fmt: skip
            if beyond:
                i, j = beyond[0]
                raise RunsError(
                    f"{origin}:{number}: link {i}-{j} points past the {len(sentence or [])} "
                    "words of the runs' test reference there: the file holds another test "
                    "set's links (the runs' test references are in their test_references.txt)."
                )
    counts = [
        count_links(found.sure, reference)
        for found, reference in zip(predicted, references, strict=True)
    ]
    return ReferenceAligner(name, counts)


def reference_table(
    groups: Sequence[Group], references: Sequence[ReferenceAligner], shuffles: int = SHUFFLES
) -> str:
    """Markdown: each reference's test AER, then each group's (mean ± 95 % interval over seeds)
    with, per reference, the group's mean minus the reference's AER and the p-value of the
    stratified test over the group's seeds. A group whose runs kept no alignment counts is left
    out."""
    header = ["aligner", "runs", "test AER"]
    header += [f"Δ AER against {reference.name} (p)" for reference in references]
    rows = [[f"{ref.name} (reference)", "1", f"{ref.aer:.3f}"] for ref in references]
    rows = [row + ["–"] * len(references) for row in rows]
    for group in groups:
        runs = [read_alignments(run.path / TEST_ALIGNMENTS) for run in group.runs]
        if any(counts is None for counts in runs):
            continue
        checked = [check_same_gold(group, counts, references[0]) for counts in runs]
        figure = group_figures(group)["test_aer"]
        if figure is None:
            continue
        shown = figure.format(3) if isinstance(figure, Interval) else f"{figure:.3f}"
        cells = [group.label, str(len(group.runs)), shown]
        system = np.stack([aer_statistics(counts) for counts in checked])  # (R, N, 4)
        for reference in references:
            baseline = np.repeat(aer_statistics(reference.counts)[None], len(checked), axis=0)
            result = stratified_randomization("AER", baseline, system, corpus_aer, shuffles)
            mean = figure.mean if isinstance(figure, Interval) else figure
            shown_p = p_text(result.p_value, shuffles)  # "≤0.0010*" at the floor
            relation = "" if shown_p.startswith("≤") else "= "
            cells.append(f"{mean - reference.aer:+.3f} (p {relation}{shown_p})")
        rows.append(cells)
    return markdown(header, rows)


def check_references(groups: Sequence[Group], references: Sequence[ReferenceAligner]) -> None:
    """Refuse, before any work, references of another test set than the runs' (by each
    sentence's count of sure gold links) and two references of one name."""
    names = [reference.name for reference in references]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RunsError(
            f"--reference {', '.join(repeated)} given twice: name each aligner once (e.g. "
            "eflomal=a.links eflomal_fwd=b.links)."
        )
    for group in groups:
        for run in group.runs:
            counts = read_alignments(run.path / TEST_ALIGNMENTS)
            if counts is not None and references:
                check_same_gold(group, counts, references[0])


def check_same_gold(
    group: Group, counts: list[AlignmentCounts] | None, reference: ReferenceAligner
) -> list[AlignmentCounts]:
    """The run's counts, if they were taken against the gold the reference was scored on."""
    assert counts is not None
    if [c.sure for c in counts] != [c.sure for c in reference.counts]:
        raise RunsError(
            f"--gold is not the test set {group.label}'s runs were scored on: their "
            f"{TEST_ALIGNMENTS} counts {len(counts)} sentences and "
            f"{sum(c.sure for c in counts)} sure links, the gold file "
            f"{len(reference.counts)} and {sum(c.sure for c in reference.counts)}."
        )
    return counts
