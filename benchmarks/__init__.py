"""Benchmarks and documentation experiments: the benchmark harness, the peer runners (Joey NMT,
OpenNMT-py) and the attention experiments of docs/attention.md. Not part of the installed
package; ``scripts/benchmark.py``, ``scripts/benchmark_step.py`` and
``scripts/attention_diagnostics.py`` run them from a checkout."""
