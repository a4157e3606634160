"""Analysis: corpus metrics (BLEU, chrF), alignment and AER, attention diagnostics, comparing
runs, plots."""
