"""Loggers and what each validation records: W&B offline run files read back, TensorBoard events,
heatmap PNGs with token labels, the W&B mode and run id, and compare_runs.py on two tiny runs."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
import torch
import wandb

from seq2seq import Translator
from seq2seq.analysis import compare
from seq2seq.analysis.compare import RunRecord
from seq2seq.analysis.plotting import draw_attention, plot_attention
from seq2seq.errors import ConfigError
from seq2seq.explorer.page import read_page
from seq2seq.training.loggers import RunInfo, wandb_logger, wandb_mode, wandb_run_id
from tests.test_pipeline import run_training

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["trainer.max_epochs=2", "examples.num_samples=3", "examples.num_maps=2"]


@pytest.fixture
def no_wandb_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no W&B settings


def wandb_records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: W&B's header, then a LevelDB-style log of protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        payload = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0:  # zero padding at the end of the file
            break
        pending += payload
        if kind in (1, 4):  # FULL, or LAST of a record split over blocks
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def logged_history(run_files: Path) -> list[dict[str, Any]]:
    [record_file] = run_files.glob("run-*.wandb")
    rows = []
    for record in wandb_records(record_file):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            # A media value (image, table) comes as one item per field: ("val/samples", "path").
            *parents, key = item.nested_key or [item.key]
            node = row
            for parent in parents:
                node = node.setdefault(parent, {})
            node[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def metrics_column(run_dir: Path, column: str) -> list[float]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return [float(row[column]) for row in csv.DictReader(file) if row.get(column)]


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("wandb_run")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
            patch.delenv(name, raising=False)
        patch.setenv("HOME", str(run_dir / "home"))
        run_training(run_dir, ["logger=wandb", *TINY])
    return run_dir


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("tensorboard_run")
    run_training(run_dir, ["logger=tensorboard", "attention=scaled_dot", *TINY])
    return run_dir


def test_wandb_without_credentials_writes_an_offline_run_with_bleu_and_images(
    wandb_run: Path,
) -> None:
    [run_files] = wandb_run.glob("wandb/offline-run-*")
    run_id = (wandb_run / "wandb_run_id").read_text().strip()
    assert run_files.name.endswith(run_id)  # the id that a resumed training reuses
    history = logged_history(run_files)
    logged_bleu = [row["val/bleu"] for row in history if "val/bleu" in row]
    assert logged_bleu == pytest.approx(metrics_column(wandb_run, "val/bleu"))
    # Every validation, num_maps sentences, each map under its own key (maps differ in size).
    images: dict[int, list[dict[str, Any]]] = {}
    for row in history:
        for key, value in row.items():
            if key.startswith("val/attention/"):
                images.setdefault(row["trainer/global_step"], []).append(value)
    assert [len(maps) for maps in images.values()] == [2, 2]
    last = images[max(images)]
    assert all(image["count"] == 1 for image in last)
    for path in [name for image in last for name in image["filenames"]]:
        assert (run_files / "files" / path).read_bytes()[:8] == PNG_MAGIC
    tables = [row["val/samples"] for row in history if "val/samples" in row]
    table = json.loads((run_files / "files" / tables[-1]["path"]).read_text())
    assert table["columns"] == ["index", "source", "reference", "hypothesis"]
    assert len(table["data"]) == 3
    config = [r for r in wandb_records(next(run_files.glob("run-*.wandb"))) if r.HasField("run")]
    summary = json.loads((wandb_run / "summary.json").read_text())
    assert config[0].run.display_name == summary["name"]
    # The explorer page at every validation, as HTML without W&B's stylesheet from its servers.
    pages = [row["val/explorer"] for row in history if "val/explorer" in row]
    assert len(pages) == 2 and pages[-1]["_type"] == "html-file"
    page = (run_files / "files" / pages[-1]["path"]).read_text()
    assert page == (wandb_run / "attention" / "explorer.html").read_text()
    assert "http://" not in page and "https://" not in page


def test_run_is_named_after_the_chosen_options_and_a_sweep_is_a_group(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from seq2seq.pipeline import describe_run

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = compose(
            "config",
            ["attention=dot", "model=lstm", f"run_dir={tmp_path}"],
            return_hydra_config=True,
        )
    app_config = config.copy()  # what @hydra.main passes: no hydra node
    with open_dict(app_config):
        del app_config["hydra"]
    try:
        HydraConfig.instance().set_config(config)
        run = describe_run(app_config)
        assert (run.name, run.group) == ("dot-lstm-toy", None)
        assert run.tags == ("dot", "lstm", "toy", "bahdanau")
        assert run.config["attention"]["scaled"] is False  # the resolved config travels along
        luong = app_config.copy()
        luong.model.decoder._target_ = "seq2seq.models.LuongDecoder"
        assert describe_run(luong).name == "dot-lstm-luong-toy"
        # The attention's other parts name the run too, so tables and W&B tell them apart.
        parts = app_config.copy()
        parts.attention.normalizer = "entmax"
        parts.attention.alpha = 1.3
        parts.attention.window = "local_p"
        parts.attention.window_size = 3
        assert describe_run(parts).name == "dot+entmax1.3+local_p3-lstm-toy"
        # Coverage, an RNN decoder's heads and input feeding too.
        more = luong.copy()
        more.attention.coverage = True
        more.model.num_heads = 4
        more.model.input_feeding = True
        assert describe_run(more).name == "dot+coverage-lstm-luong-heads4-feed-toy"
        OmegaConf.set_readonly(config.hydra, False)
        config.hydra.mode = RunMode.MULTIRUN
        config.hydra.sweep.dir = "multirun/sweep-1"
        HydraConfig.instance().set_config(config)
        assert describe_run(app_config).group == "multirun/sweep-1"
    finally:
        HydraConfig.instance().cfg = None


def test_tensorboard_events_hold_bleu_and_attention_images(tensorboard_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    bleu = [event.value for event in events.Scalars("val/bleu")]
    assert bleu == pytest.approx(metrics_column(tensorboard_run, "val/bleu"))
    image_tags = events.Tags()["images"]
    assert len(image_tags) == 2 and all(tag.startswith("val/attention/") for tag in image_tags)
    assert events.Images(image_tags[0])[-1].encoded_image_string[:8] == PNG_MAGIC


def test_each_validation_writes_heatmaps_and_the_samples_with_their_attention(
    tensorboard_run: Path,
) -> None:
    records = sorted((tensorboard_run / "attention").glob("step-*.json"))
    assert len(records) == 2  # one per validation
    record = json.loads(records[-1].read_text())
    sentence = record["sentences"][0]
    weights = torch.tensor(sentence["attention"])
    assert weights.shape == (len(sentence["tgt_tokens"]), len(sentence["src_tokens"]))
    assert torch.allclose(weights.sum(-1), torch.ones(len(weights)), atol=1e-4)
    pngs = sorted((tensorboard_run / "attention").glob(f"step-{record['step']:06d}-*.png"))
    assert len(pngs) == 2 and all(png.read_bytes()[:8] == PNG_MAGIC for png in pngs)


def test_heatmap_has_the_tokens_on_its_axes(tmp_path: Path) -> None:
    src, tgt = ["the", "dog", "runs", "."], ["kodan", "tula", "."]
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    figure, axes = plt.subplots()
    draw_attention(axes, src, tgt, weights, title="t")
    assert [label.get_text() for label in axes.get_xticklabels()] == src
    assert [label.get_text() for label in axes.get_yticklabels()] == tgt
    assert (axes.get_xlabel(), axes.get_ylabel(), axes.get_title()) == ("source", "output", "t")
    plt.close(figure)
    path = plot_attention(src, tgt, weights, tmp_path / "map.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="do not match 3 target and 2 source tokens"):
        plot_attention(src[:2], tgt, weights, tmp_path / "bad.png")


def hatched(axes: Any) -> set[tuple[float, float]]:
    """The cells ``draw_attention`` hatched as exact zeros: their lower-left corners."""
    return {(patch.get_x(), patch.get_y()) for patch in axes.patches if patch.get_hatch()}


def test_only_exact_zeros_are_hatched_whether_the_weights_are_a_tensor_or_rounded() -> None:
    """A weight that rounds to 0 is not one: rounded weights are hatched where ``zeros`` says,
    a tensor where it is 0, and rounded weights without ``zeros`` nowhere."""
    src, tgt = ["a", "b", "c"], ["x", "y"]
    weights = torch.tensor([[0.0, 0.4, 0.6], [1e-7, 0.0, 1.0 - 1e-7]])
    rounded = [[round(w, 5) for w in row] for row in weights.tolist()]  # 1e-7 -> 0.0
    cells = {(-0.5, -0.5), (0.5, 0.5)}  # (column - 0.5, row - 0.5) of the two exact zeros
    for given, zeros in ((weights, None), (rounded, [[0], [1]]), (rounded, None)):
        figure, axes = plt.subplots()
        draw_attention(axes, src, tgt, given, zeros=zeros)
        assert hatched(axes) == (set() if isinstance(given, list) and zeros is None else cells)
        plt.close(figure)


def test_wandb_mode_auto(monkeypatch: pytest.MonkeyPatch, no_wandb_credentials: None) -> None:
    assert wandb_mode("auto") == "offline"
    assert wandb_mode("online") == "online"  # asked for explicitly
    netrc = Path.home() / ".netrc"
    netrc.parent.mkdir(parents=True)
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789\n")
    netrc.chmod(0o600)
    assert wandb_mode("auto") == "online"
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the user's environment wins
    assert wandb_mode("auto") == "disabled"


def test_run_directory_keeps_its_wandb_id(tmp_path: Path) -> None:
    first = wandb_run_id(tmp_path)
    assert wandb_run_id(tmp_path) == first  # what a resumed training passes to W&B
    assert (tmp_path / "wandb_run_id").read_text().strip() == first


def test_bad_wandb_mode_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"logger\.mode must be one of auto, online, offline"):
        wandb_logger(tmp_path, RunInfo("x"), mode="sometimes")


def test_missing_wandb_package_is_a_config_error_that_offers_csv(
    monkeypatch: pytest.MonkeyPatch, no_wandb_credentials: None, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without it imports
    with pytest.raises(ConfigError, match=r"pip install wandb.*logger=csv"):
        wandb_logger(tmp_path, RunInfo("x"))


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """An address that accepts connections and never answers (a firewall that swallows packets,
    a proxy that hangs): W&B waits for init_timeout there, not for a refused connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])  # held open, never read, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    stop.set()
    thread.join()
    for connection in [*held, listener]:
        connection.close()


@pytest.mark.parametrize("server", ["refuses", "never answers"])
def test_unreachable_server_falls_back_to_offline(
    monkeypatch: pytest.MonkeyPatch,
    no_wandb_credentials: None,
    tmp_path: Path,
    server: str,
    request: pytest.FixtureRequest,
) -> None:
    """Credentials but no network: the run starts offline after init_timeout, no failure."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    # Port 9 (discard): nothing listens there on a test machine, the connection is refused.
    address, held = "http://127.0.0.1:9", []
    if server == "never answers":
        address, held = request.getfixturevalue("silent_server")
    monkeypatch.setenv("WANDB_BASE_URL", address)
    wandb.teardown()  # W&B's service outlives a run and keeps the server it was started with
    logger = wandb_logger(tmp_path, RunInfo("x"), init_timeout=1)
    assert logger.experiment.settings.mode == "offline"
    assert bool(held) == (server == "never answers")  # W&B did reach the silent server
    logger.experiment.finish()
    assert list(tmp_path.glob("wandb/offline-run-*"))


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` -> its content's SHA-256."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_compare_runs_never_writes_into_the_runs_it_reads(
    wandb_run: Path, tensorboard_run: Path, tmp_path: Path
) -> None:
    """Without --out the figures go to comparison-NAME in the current directory, said in the
    log; the input directories are byte for byte what they were; --out inside a run is refused
    in one paragraph."""
    before = [tree_digest(wandb_run), tree_digest(tensorboard_run)]
    here = tmp_path / "here"
    here.mkdir()
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts/compare_runs.py"), str(wandb_run),
         str(tensorboard_run)],
        cwd=here, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    out = here / f"comparison-{wandb_run.name}-and-1-more"
    assert (out / "bleu_curves.png").is_file()
    assert f"comparison-{wandb_run.name}-and-1-more" in completed.stderr
    assert [tree_digest(wandb_run), tree_digest(tensorboard_run)] == before
    refused = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(wandb_run), "--out",
         str(wandb_run / "figures")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "which this comparison reads" in refused.stderr
    assert "Traceback" not in refused.stderr and not (wandb_run / "figures").exists()
    # Run from inside the run, the default would write into it: refused, with an --out outside.
    inner = subprocess.run(
        [sys.executable, str(ROOT / "scripts/compare_runs.py"), "."],
        cwd=wandb_run, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert inner.returncode == 2 and "the current directory is inside" in inner.stderr
    assert f"--out {wandb_run.parent / f'comparison-{wandb_run.name}'}" in inner.stderr
    assert "Traceback" not in inner.stderr
    assert [tree_digest(wandb_run), tree_digest(tensorboard_run)] == before
    # --pair names runs, not a directory of them: refused before anything is read.
    sweep = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(wandb_run), "--pair", str(tmp_path),
         str(wandb_run)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert sweep.returncode == 2 and "is not a run directory" in sweep.stderr, sweep.stderr
    assert "summary.json (still training" not in sweep.stderr


def test_compare_runs_tables_and_plots_two_runs(
    wandb_run: Path, tensorboard_run: Path, tmp_path: Path
) -> None:
    completed = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(wandb_run), str(tensorboard_run),
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith(
        "| run | directory | attention | parameters | best val BLEU | test BLEU | test chrF | "
        "test AER"
    )
    # The per-run table ends at the first blank line (the groups' tables follow).
    table = lines[2 : lines.index("")] if "" in lines else lines[2:]
    rows = [line.split(" | ") for line in table]
    summary = json.loads((wandb_run / "summary.json").read_text())
    other = json.loads((tensorboard_run / "summary.json").read_text())
    assert [row[2] for row in rows] == [summary["attention"], other["attention"]]
    assert rows[0][4] == f"{max(metrics_column(wandb_run, 'val/bleu')):.2f}"
    assert rows[0][3] == f"{summary['parameters']:,}"
    for name in ["bleu_curves.png", "attention_grid.png"]:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    # The explorer: both runs' best checkpoints on the first run's validation sentences.
    page = (tmp_path / "explorer.html").read_text()
    data = read_page(page)
    [latest] = sorted((wandb_run / "attention").glob("explorer-step-*.json"))[-1:]
    shown = json.loads(latest.read_text())["sentences"]
    assert [s["src"] for s in data["sentences"]] == [s["src"] for s in shown]
    assert [m["name"] for m in data["models"]] == [row[0].removeprefix("| ") for row in rows]
    for model, run in zip(data["models"], [wandb_run, tensorboard_run], strict=True):
        translator = Translator.load(run / "checkpoints" / "best.ckpt")
        first = data["sentences"][0]
        [pair] = translator.force_decode([first["src"]], [first["ref"]])
        assert pair.attention is not None
        weights = torch.tensor(first["models"][model["name"]]["forced"]["weights"])
        assert torch.allclose(weights, pair.attention, atol=1e-4)


def test_attention_grid_titles_fit_in_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One panel is 4.2 inches wide: a long val sentence (the suptitle) and a long run label were
    # cut off at the figure's edges.
    source = "Eine Gruppe von Männern lädt Baumwolle auf einen großen Lastwagen am Straßenrand"
    words = source.split()
    sentence = {
        "index": 0, "source": source, "src_tokens": words, "tgt_tokens": ["A", "group", "."],
        "attention": torch.full((3, len(words)), 1 / len(words)).tolist(),
    }  # fmt: skip
    run_dir = tmp_path / "a_run_directory_with_a_rather_long_name_seed2"
    (run_dir / "attention").mkdir(parents=True)
    record = {"step": 5115, "epoch": 32, "sentences": [sentence]}
    (run_dir / "attention" / "step-005115.json").write_text(json.dumps(record))
    runs = [RunRecord(run_dir, "scaled_dot-transformer-multi30k", {"attention": "scaled_dot"})]
    figures: list[Any] = []
    monkeypatch.setattr(compare.plt, "close", figures.append)  # keep the figure to measure it
    label = f"scaled_dot, seed 2 ({run_dir.name})"
    assert compare.plot_attention_grid(runs, [label], tmp_path / "grid.png") is not None
    (figure,) = figures
    renderer = figure.canvas.get_renderer()
    titles = [figure._suptitle, *(axes.title for axes in figure.axes)]
    assert any(source in title.get_text().replace("\n", " ") for title in titles)
    for title in titles:
        box = title.get_window_extent(renderer)
        assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1, title.get_text()
    monkeypatch.undo()  # compare.plt is pyplot itself
    plt.close(figure)


def test_bleu_curves_draw_a_seed_in_one_line_style_in_every_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Colour says the group, line style the seed: seed 2 is dashed in both groups, whatever
    order the runs come in."""
    metrics = [{"step": 9.0, "val/bleu": 50.0}, {"step": 19.0, "val/bleu": 60.0}]
    runs = [RunRecord(tmp_path / name, name, {}, metrics) for name in ["a2", "a1", "b1", "b2"]]
    figures: list[Any] = []
    monkeypatch.setattr(compare.plt, "close", figures.append)  # keep the figure to read it
    compare.plot_bleu_curves(
        runs, ["a, seed 2", "a, seed 1", "b, seed 1", "b, seed 2"], tmp_path / "curves.png",
        colours=[0, 0, 2, 2], styles=[1, 0, 0, 1],
    )  # fmt: skip
    monkeypatch.undo()  # compare.plt is pyplot itself
    (figure,) = figures
    drawn = {line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()}
    plt.close(figure)
    assert drawn == {"a, seed 2": "--", "a, seed 1": "-", "b, seed 1": "-", "b, seed 2": "--"}


def test_compare_runs_explains_a_directory_without_runs(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2
    assert "holds no run" in completed.stderr and "Traceback" not in completed.stderr


def test_validations_are_counted_in_updates_as_the_attention_maps_are(wandb_run: Path) -> None:
    """Lightning logs a validation at its last batch's index (metrics.csv's 9 after 10 updates);
    the plots count updates, as the attention records, the checkpoints and the explorer do."""
    run = compare.read_run(wandb_run)
    records = sorted(
        int(p.stem.split("-")[1]) for p in (wandb_run / "attention").glob("step-*.json")
    )
    assert [step for step, _ in run.validations()] == records
    assert [step + 1 for step, _ in run.series("val/bleu")] == records
