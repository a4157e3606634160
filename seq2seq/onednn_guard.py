"""Keep oneDNN off CPU instructions this process cannot run, decided once per machine.

Under CPU autocast (``trainer.precision=bf16-mixed``) torch runs bf16 GRUs, LSTMs and matmuls
through oneDNN, which picks its kernels from the instructions the CPU advertises. On some
machines that advertise AMX (Intel Xeon Sapphire Rapids and later: the ``amx_tile`` flag) the
process may not execute AMX instructions after all: Linux hands out the AMX register state only
on request, and a hypervisor may not pass it through. oneDNN's AMX kernels then die of SIGILL,
which no ``try`` can catch: the process is gone, with no message and no checkpoint.

Why a probe in a subprocess: whether the instructions run is a property of the CPU, the kernel
and the hypervisor together, which no flag in ``/proc/cpuinfo`` reveals; running them is the only
test, and only a separate process can survive failing it. So where the CPU advertises AMX, a
short script does what training does in bf16 (a bidirectional GRU, an LSTM and a linear layer,
forward and backward, under autocast) in a child process. If the child dies of a signal, it is
run again with oneDNN capped one level lower (``ONEDNN_MAX_CPU_ISA``: AVX512_CORE_BF16, which
keeps the bf16 instructions but not AMX, then AVX512_CORE, then AVX2), and the first level that
survives is set in this process's environment. oneDNN reads that variable when it first creates
a kernel, not when torch is imported, so this must happen before any oneDNN use: it runs when
``seq2seq`` is imported. The child processes of a run (DDP ranks) inherit the variable.

The verdict is kept in ``$XDG_CACHE_HOME/seq2seq/onednn_probe.json`` keyed by the CPU's model and
flags, the kernel release, the Python executable and torch's version, so the probe (one child
process, about 2 s) runs once per machine. A CPU that does not advertise AMX is not probed at
all (its cost is reading ``/proc/cpuinfo``). A value the user set for ``ONEDNN_MAX_CPU_ISA`` (or
oneDNN's older ``DNNL_MAX_CPU_ISA``) is respected and nothing is probed. ``SEQ2SEQ_ONEDNN_PROBE=0``
turns the guard off.

This module imports no torch: it runs before torch has done anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from seq2seq.atomic import write_atomic

ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")  # oneDNN reads either
# Tried in this order after the uncapped run crashes: each keeps all it can of the one before.
FALLBACK_CAPS = ("AVX512_CORE_BF16", "AVX512_CORE", "AVX2")
ADVERTISED_RISKS = ("amx_tile", "amx_bf16", "amx_int8")  # /proc/cpuinfo flags
PROBE_TIMEOUT_S = 180
CACHE_NAME = "onednn_probe.json"
MARKER = "seq2seq-onednn-probe-ok"

# What bf16 training asks of oneDNN: recurrent layers and matmuls, forward and backward.
PROBE_SCRIPT = f"""
import torch
torch.manual_seed(0)
gru = torch.nn.GRU(64, 64, batch_first=True, bidirectional=True)
lstm = torch.nn.LSTM(64, 64, batch_first=True)
linear = torch.nn.Linear(128, 64)
x = torch.randn(8, 10, 64)
with torch.autocast("cpu", dtype=torch.bfloat16):
    out, _ = gru(x)
    out = linear(out)
    out, _ = lstm(out)
out.float().sum().backward()
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    gru(x)
print("{MARKER}")
"""


@dataclass(frozen=True)
class ProbeOutcome:
    """What one run of the probe script did."""

    ok: bool
    crashed: bool  # died of a signal (an illegal instruction, typically)
    detail: str  # "ok", "SIGILL", or the error's last line


@dataclass(frozen=True)
class Decision:
    """The cap to set (None: none needed) and whether bf16 autocast can run here at all."""

    cap: str | None
    bf16_ok: bool
    reason: str  # one sentence for the log


Probe = Callable[[str | None], ProbeOutcome]

_decision: dict[str, Decision | None] = {}  # "applied": what ``apply()`` decided in this process


def run_probe(cap: str | None, timeout: float = PROBE_TIMEOUT_S) -> ProbeOutcome:
    """Run ``PROBE_SCRIPT`` in a child process with oneDNN capped at ``cap`` (None: no cap)."""
    env = {name: value for name, value in os.environ.items() if name not in ISA_VARIABLES}
    env["SEQ2SEQ_ONEDNN_PROBE"] = "0"  # the child must not probe in turn
    if cap is not None:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    try:
        result = subprocess.run(
            [sys.executable, "-c", PROBE_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return ProbeOutcome(ok=False, crashed=False, detail=f"{type(error).__name__}: {error}")
    if result.returncode < 0:
        return ProbeOutcome(ok=False, crashed=True, detail=signal_name(-result.returncode))
    if result.returncode == 0 and MARKER in result.stdout:
        return ProbeOutcome(ok=True, crashed=False, detail="ok")
    last_line = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
    return ProbeOutcome(ok=False, crashed=False, detail=last_line)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def decide(probe: Probe) -> Decision:
    """The lowest cap needed for the probe to survive: none if it runs as it is, else the first of
    ``FALLBACK_CAPS`` that survives. A probe that fails without a signal (an exception, a
    time-out) says nothing about instructions: no cap, and bf16 is left to fail with torch's own
    message."""
    first = probe(None)
    if first.ok:
        return Decision(None, True, "bf16 kernels run as they are")
    if not first.crashed:
        return Decision(None, True, f"the bf16 probe failed without a signal ({first.detail})")
    for cap in FALLBACK_CAPS:
        if probe(cap).ok:
            return Decision(
                cap,
                True,
                f"oneDNN's bf16 kernels died of {first.detail} on this CPU, which advertises AMX; "
                f"capped at ONEDNN_MAX_CPU_ISA={cap}, where they run",
            )
    return Decision(
        FALLBACK_CAPS[-1],
        False,
        f"oneDNN's bf16 kernels died of {first.detail} on this CPU at every ISA level tried "
        f"({', '.join(FALLBACK_CAPS)})",
    )


def cpu_description(cpuinfo: str) -> tuple[str, set[str]]:
    """The first processor's model name and flags from the text of ``/proc/cpuinfo``."""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: nothing is advertised, nothing is probed
        return ""


def machine_key(model: str, flags: set[str]) -> str:
    """What the verdict depends on: CPU, kernel, interpreter and torch."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    parts = [model, " ".join(sorted(flags)), platform.release(), sys.executable, torch_version]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "seq2seq" / CACHE_NAME


def cached_decision(key: str, path: Path) -> Decision | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8")).get(key)
        return None if entry is None else Decision(**entry)
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # missing or unreadable: probe again


def store_decision(key: str, decision: Decision, path: Path) -> None:
    """Add the verdict to the cache file; a cache that cannot be written only costs a re-probe."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = asdict(decision)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda temporary: temporary.write_text(json.dumps(entries, indent=1)))
    except OSError:
        pass


def guard(
    environ: MutableMapping[str, str],
    cpuinfo: str,
    probe: Probe = run_probe,
    cache: Path | None = None,
) -> Decision | None:
    """Decide, and set the cap in ``environ``: None where nothing was probed (the guard is off,
    the user chose a cap, or the CPU does not advertise AMX)."""
    if environ.get("SEQ2SEQ_ONEDNN_PROBE", "1") == "0" or any(v in environ for v in ISA_VARIABLES):
        return None
    model, flags = cpu_description(cpuinfo)
    if not flags & set(ADVERTISED_RISKS):
        return None
    key = machine_key(model, flags)
    path = cache_path() if cache is None else cache
    decision = cached_decision(key, path)
    if decision is None:
        decision = decide(probe)
        store_decision(key, decision, path)
    if decision.cap is not None:
        environ["ONEDNN_MAX_CPU_ISA"] = decision.cap
    return decision


def apply() -> Decision | None:
    """``guard`` for this process, once (``import seq2seq`` calls it)."""
    if "applied" not in _decision:
        _decision["applied"] = guard(os.environ, read_cpuinfo())
    return _decision["applied"]


def applied() -> Decision | None:
    """What ``apply`` decided in this process (None: nothing was probed)."""
    return _decision.get("applied")


def report() -> str | None:
    """The log line for a run, where the guard capped oneDNN or bf16 cannot run here."""
    decision = applied()
    if decision is None or (decision.cap is None and decision.bf16_ok):
        return None
    return decision.reason + " (set ONEDNN_MAX_CPU_ISA yourself to choose another level)."


def bf16_error() -> str | None:
    """Why bf16 autocast on the CPU cannot run in this process, or None where it can."""
    decision = applied()
    if decision is None or decision.bf16_ok:
        return None
    return (
        f"trainer.precision=bf16-mixed cannot run on this CPU: {decision.reason}, so training "
        "would die of an illegal instruction. Train in float32 (trainer.precision=32, the "
        "default), or on a GPU (trainer=gpu). Delete "
        f"{cache_path()} to probe this machine again."
    )
