"""The oneDNN guard: its decisions from faked probe outcomes, and the real probe run here."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seq2seq import onednn_guard, pipeline
from seq2seq.errors import ConfigError
from seq2seq.onednn_guard import Decision, ProbeOutcome

OK = ProbeOutcome(ok=True, crashed=False, detail="ok")
SIGILL = ProbeOutcome(ok=False, crashed=True, detail="SIGILL")
AMX_CPUINFO = (
    "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n"
)
PLAIN_CPUINFO = "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


class FakeProbe:
    """Answers as a CPU would that crashes at the levels in ``crashes_at`` (None: uncapped)."""

    def __init__(self, crashes_at: set[str | None], other_failure: bool = False) -> None:
        self.crashes_at = crashes_at
        self.other_failure = other_failure
        self.calls: list[str | None] = []

    def __call__(self, cap: str | None) -> ProbeOutcome:
        self.calls.append(cap)
        if self.other_failure:
            return ProbeOutcome(ok=False, crashed=False, detail="ImportError: no torch")
        return SIGILL if cap in self.crashes_at else OK


def test_no_cap_where_the_probe_runs_as_it_is() -> None:
    probe = FakeProbe(crashes_at=set())
    assert onednn_guard.decide(probe) == Decision(None, True, "bf16 kernels run as they are")
    assert probe.calls == [None]


def test_the_first_level_that_survives_is_the_cap() -> None:
    probe = FakeProbe(crashes_at={None})  # AMX kills it; AVX512_CORE_BF16 runs
    decision = onednn_guard.decide(probe)
    assert decision.cap == "AVX512_CORE_BF16" and decision.bf16_ok
    assert "SIGILL" in decision.reason
    assert probe.calls == [None, "AVX512_CORE_BF16"]
    probe = FakeProbe(crashes_at={None, "AVX512_CORE_BF16"})
    assert onednn_guard.decide(probe).cap == "AVX512_CORE"


def test_crashing_at_every_level_means_bf16_cannot_run() -> None:
    probe = FakeProbe(crashes_at={None, *onednn_guard.FALLBACK_CAPS})
    decision = onednn_guard.decide(probe)
    assert not decision.bf16_ok
    assert probe.calls == [None, *onednn_guard.FALLBACK_CAPS]


def test_a_failure_without_a_signal_sets_no_cap() -> None:
    """An exception says nothing about instructions: torch's own error is the user's message."""
    decision = onednn_guard.decide(FakeProbe(set(), other_failure=True))
    assert decision.cap is None and decision.bf16_ok and "ImportError" in decision.reason


def test_guard_caps_an_amx_cpu_once_and_reads_the_verdict_back(tmp_path: Path) -> None:
    cache = tmp_path / "probe.json"
    environ: dict[str, str] = {}
    probe = FakeProbe(crashes_at={None})
    decision = onednn_guard.guard(environ, AMX_CPUINFO, probe, cache)
    assert decision is not None and decision.cap == "AVX512_CORE_BF16"
    assert environ == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    # A second process on the same machine: the cached verdict, no probe.
    environ = {}
    never = FakeProbe(crashes_at=set())
    assert onednn_guard.guard(environ, AMX_CPUINFO, never, cache) == decision
    assert never.calls == [] and environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    # Another CPU is another key: probed afresh.
    other = AMX_CPUINFO.replace("8488C", "8480+")
    assert onednn_guard.guard({}, other, never, cache) is not None and never.calls == [None]


def test_guard_leaves_alone_what_it_should(tmp_path: Path) -> None:
    cache = tmp_path / "probe.json"
    probe = FakeProbe(crashes_at={None})
    # A cap the user chose (either of oneDNN's names) is theirs.
    for name in onednn_guard.ISA_VARIABLES:
        environ = {name: "AVX2"}
        assert onednn_guard.guard(environ, AMX_CPUINFO, probe, cache) is None
        assert environ == {name: "AVX2"}
    # No AMX advertised: nothing to probe. The guard switched off: nothing either.
    assert onednn_guard.guard({}, PLAIN_CPUINFO, probe, cache) is None
    assert onednn_guard.guard({}, "", probe, cache) is None  # no /proc/cpuinfo
    assert onednn_guard.guard({"SEQ2SEQ_ONEDNN_PROBE": "0"}, AMX_CPUINFO, probe, cache) is None
    assert probe.calls == [] and not cache.exists()


def test_an_unreadable_cache_means_probing_again(tmp_path: Path) -> None:
    cache = tmp_path / "probe.json"
    cache.write_text("{not json")
    probe = FakeProbe(crashes_at=set())
    assert onednn_guard.guard({}, AMX_CPUINFO, probe, cache) is not None
    assert probe.calls == [None]
    assert onednn_guard.guard({}, AMX_CPUINFO, probe, cache) is not None
    assert probe.calls == [None]  # the rewritten cache serves the second call


def test_the_probe_runs_here() -> None:
    """The real probe, in a child process: bf16 training's oneDNN kernels either run here or die
    of a signal; where they die, the level ``decide`` picks must run."""
    outcome = onednn_guard.run_probe(None)
    assert outcome.ok or outcome.crashed, outcome.detail
    if outcome.crashed:
        decision = onednn_guard.decide(onednn_guard.run_probe)
        assert decision.bf16_ok and decision.cap is not None
        assert onednn_guard.run_probe(decision.cap).ok


def test_the_probe_sees_a_death_by_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child killed by SIGILL is told apart from one that raised."""
    monkeypatch.setattr(
        onednn_guard, "PROBE_SCRIPT", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    )
    assert onednn_guard.run_probe(None) == ProbeOutcome(ok=False, crashed=True, detail="SIGILL")
    monkeypatch.setattr(onednn_guard, "PROBE_SCRIPT", "raise ValueError('no bf16 here')")
    outcome = onednn_guard.run_probe(None)
    assert not outcome.ok and not outcome.crashed and "no bf16 here" in outcome.detail


def test_bf16_on_such_a_cpu_stops_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = OmegaConf.create({"trainer": {"precision": "bf16-mixed", "accelerator": "cpu"}})
    hopeless = Decision("AVX2", False, "oneDNN's bf16 kernels died of SIGILL at every level")
    monkeypatch.setitem(onednn_guard._decision, "applied", hopeless)
    with pytest.raises(ConfigError, match=r"trainer\.precision=bf16-mixed cannot run .*SIGILL"):
        pipeline.check_cpu_precision(cfg)
    pipeline.check_cpu_precision(OmegaConf.create({"trainer": {"precision": "32"}}))  # fine
    capped = Decision("AVX512_CORE_BF16", True, "capped at ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16")
    monkeypatch.setitem(onednn_guard._decision, "applied", capped)
    pipeline.check_cpu_precision(cfg)  # it runs, capped
    assert "ONEDNN_MAX_CPU_ISA yourself" in (onednn_guard.report() or "")
    monkeypatch.setitem(onednn_guard._decision, "applied", None)
    assert onednn_guard.report() is None and onednn_guard.bf16_error() is None
