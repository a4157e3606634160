"""examples/onnx_runtime and examples/ctranslate2: a deployer's own decoding, with onnxruntime or
ctranslate2 and tokenizers only, run as a user runs them (a subprocess in which importing seq2seq
fails) and compared with the toolkit's own backends on the learning tests' copy models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq import Translator
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.pipeline import train
from tests.configs import ROOT, compose_config
from tests.test_learning import COPY, MODELS

# Copy-task sentences, a blank line and one longer than any training sentence (the length
# limit at work), decoded decisively enough to compare exactly across batchings.
SENTENCES = ["w3 w14 w7", "w1 w2 w3 w4 w5 w6 w7 w8", "w40", "", "w9 w9 w9 w10 w11",
             " ".join(f"w{i}" for i in range(5, 45))]  # fmt: skip

# Runs an example's script with seq2seq made unimportable: it must not need the toolkit.
WITHOUT_SEQ2SEQ = (
    "import runpy, sys; sys.modules['seq2seq'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> a bundle with ONNX graphs (and, for the Transformer, a CTranslate2 model)."""
    pytest.importorskip("onnxruntime", reason="pip install .[onnx] installs onnxruntime")
    from seq2seq.inference.onnx_export import export_onnx

    made = {}
    for name in ["luong", "transformer"]:
        run_dir = tmp_path_factory.mktemp(f"{name}_run")
        result = train(compose_config([*COPY, *MODELS[name], f"run_dir={run_dir}"]))
        trained = load(result["best_checkpoint"])
        made[name] = export_bundle(trained, run_dir / "bundle")
        export_onnx(trained.model, made[name])
        if name == "transformer" and _has("ctranslate2"):
            from seq2seq.inference.ctranslate2_export import export_ctranslate2

            export_ctranslate2(trained, made[name])
    return made


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def example(script: str, *arguments: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-c", WITHOUT_SEQ2SEQ, str(ROOT / "examples" / script), *arguments],
        input="\n".join(SENTENCES) + "\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.split("\n")[: len(SENTENCES)]


@pytest.mark.slow  # trains two models (CI runs the slow set too)
@pytest.mark.parametrize("name", ["luong", "transformer"])
def test_the_onnx_runtime_example_translates_as_the_onnx_backend(
    bundles: dict[str, Path], name: str
) -> None:
    expected = Translator.load(bundles[name], backend="onnx").translate(SENTENCES)
    assert len(set(expected)) == len(SENTENCES)  # distinct answers: the comparison means something
    assert example("onnx_runtime/translate.py", str(bundles[name])) == expected


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_ctranslate2_example_translates_as_the_ctranslate2_backend(
    bundles: dict[str, Path], beam_size: int
) -> None:
    pytest.importorskip("ctranslate2", reason="pip install .[ctranslate2] installs ctranslate2")
    translator = Translator.load(bundles["transformer"], backend="ctranslate2")
    expected = translator.translate(SENTENCES, beam_size=beam_size)
    assert len(set(expected)) == len(SENTENCES)
    found = example("ctranslate2/translate.py", str(bundles["transformer"]),
                    "--beam-size", str(beam_size))  # fmt: skip
    assert found == expected
