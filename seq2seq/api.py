"""The toolkit from Python, for a notebook cell: ``train``, ``compare``, ``explore``.

    import seq2seq
    run = seq2seq.train("attention=additive", "trainer.max_epochs=1")
    run.summary["best_val_bleu"], run.metrics()[-1], run.translator().translate(["a b c"])
    seq2seq.compare([run, other, ...])                   # compare_runs.py's tables, as Markdown
    seq2seq.explore({"additive": run, "dot": other}, ["a b c"])    # shows inline; .save(path)

``train`` takes the command line's overrides (``python train.py OVERRIDES``) and leaves no Hydra
state behind, so that a second call in the same process composes afresh. Bad input is the same
one-paragraph error as on the command line (a ``seq2seq.errors.Seq2SeqError``).
"""

from __future__ import annotations

import contextlib
import csv
import inspect
import json
import logging
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig, OmegaConf, open_dict

from seq2seq.analysis.compare import RunsError, markdown_table, read_runs
from seq2seq.analysis.groups import (
    ONE_GROUP_NOTE,
    compare_groups,
    flat_config,
    group_runs,
    groups_table,
    run_labels,
    significance_table,
)
from seq2seq.atomic import write_atomic
from seq2seq.attention import Attention
from seq2seq.errors import ConfigError, Seq2SeqError
from seq2seq.explorer import ExplorerModel, explorer_data
from seq2seq.explorer.page import InlinePage
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.inference.translator import Translator
from seq2seq.pipeline import hydra_run_dir, trusted_by_config
from seq2seq.pipeline import train as train_config
from seq2seq.pipeline.building import PART_KEYS
from seq2seq.pipeline.resume import outermost_missing, remove_refused_run


def config_dir() -> Path:
    """The configs ``python train.py`` composes, installed with the package (``seq2seq/conf``;
    the repository's ``conf/`` links to them)."""
    installed = Path(__file__).resolve().parent / "conf"
    if (installed / "config.yaml").is_file():
        return installed
    raise ConfigError(
        f"no configs at {installed}: this installation of seq2seq lacks its conf/ directory. "
        "Reinstall it (pip install seq2seq from a wheel built with python -m build, or "
        "pip install -e . from a checkout)."
    )


@dataclass(frozen=True)
class Run:
    """A finished training run: its directory, resolved config, summary and checkpoints."""

    directory: Path
    config: DictConfig
    summary: dict[str, Any]

    def __repr__(self) -> str:
        bleu = self.summary.get("best_val_bleu")
        shown = "none" if bleu is None else f"{bleu:.2f}"
        return f"Run({str(self.directory)!r}, best val BLEU {shown})"

    @property
    def best_checkpoint(self) -> Path:
        return self.directory / "checkpoints" / "best.ckpt"

    def metrics(self) -> Any:
        """``metrics.csv`` as a pandas DataFrame when pandas is installed, else a list of dicts
        of numbers (one per logged step, empty cells left out)."""
        path = self.directory / "metrics.csv"
        try:
            import pandas
        except ImportError:
            with path.open(newline="") as file:
                return [
                    {key: number(value) for key, value in row.items() if value != ""}
                    for row in csv.DictReader(file)
                ]
        return pandas.read_csv(path)

    @property
    def trusted(self) -> list[str]:
        """The modules this run's config trusted when training (``trust_modules`` and the module
        of a scoring function or normalizer of the user's own, ``__main__`` for one defined in a
        notebook): its checkpoints load trusting them, as the run that wrote them did."""
        return trusted_by_config(self.config)

    def translator(self, checkpoint: str = "best") -> Translator:
        """The ``best`` (or ``last``) checkpoint, loaded for translation."""
        return Translator.load(self.checkpoint(checkpoint), trust_modules=self.trusted)

    def checkpoint(self, which: str = "best") -> Path:
        """``checkpoints/best.ckpt`` or ``checkpoints/last.ckpt``, which must exist."""
        path = self.directory / "checkpoints" / f"{which}.ckpt"
        if which not in ("best", "last") or not path.is_file():
            raise ConfigError(
                f"{path}: no such checkpoint; a run keeps checkpoints/best.ckpt and last.ckpt "
                "(checkpoint='best' or 'last')."
            )
        return path

    def export(self, out_dir: str | Path, onnx: bool = False, checkpoint: str = "best") -> Path:
        """The ``best`` (or ``last``) checkpoint as a bundle in ``out_dir``, as ``seq2seq export``
        writes it (``onnx``: with the encoder and decoder step in ONNX); returns ``out_dir``."""
        trained = load(self.checkpoint(checkpoint), trust_modules=self.trusted)
        bundle = export_bundle(trained, out_dir)
        if onnx:
            from seq2seq.inference.onnx_export import export_onnx  # needs the onnx extra

            export_onnx(trained.model, bundle)
        return bundle


def record_overrides(
    directory: Path, overrides: Sequence[str], attention: type[Attention] | None
) -> None:
    """``.hydra/overrides.yaml`` as the command line writes it, which ``seq2seq.compare`` names
    groups by (``attention=scaled_dot``); without the run's own directory and ``quiet``, and
    with a class of the user's own as ``attention=ClassName``."""
    kept = [
        override
        for override in overrides
        if override.split("=", 1)[0].lstrip("+~") not in ("run_dir", "quiet")
        and not (attention is not None and override.startswith("attention="))
    ]
    if attention is not None:
        kept.insert(0, f"attention={attention.__qualname__}")
    (directory / ".hydra").mkdir(exist_ok=True)
    write_atomic(
        directory / ".hydra" / "overrides.yaml",
        lambda path: path.write_text(yaml.safe_dump(kept), encoding="utf-8"),
    )


def number(text: str) -> int | float:
    """A metrics.csv cell as the number it holds (steps and epochs as integers)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def new_run_dir() -> Path:
    """``outputs/DATE/TIME`` as the command line names runs; ``-2``, ``-3`` … within a second."""
    base = Path("outputs") / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    path, number = base, 1
    while path.exists():
        number += 1
        path = base.with_name(f"{base.name}-{number}")
    return path


def compose_overrides(overrides: Sequence[str]) -> tuple[DictConfig, dict[str, str]]:
    """``conf/config.yaml`` with ``overrides``, as ``python train.py OVERRIDES`` sees it, and the
    option chosen in each config group (``attention: additive``: runs are named by them, as on
    the command line); Hydra's global state is cleared before and after."""
    OmegaConf.register_new_resolver("seq2seq_run_dir", hydra_run_dir, replace=True)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            config = compose("config", overrides=list(overrides), return_hydra_config=True)
    except HydraException as error:  # a key that does not exist, a bad group option, a typo
        # Hydra's search path tells a user nothing they can act on.
        message = " ".join(str(error).split("Config search path")[0].split())
        if "Could not find 'attention/" in message:
            hint = "A scoring function of your own is a class, passed as a keyword: "
            message = f"{message.rstrip('.')}. {hint}seq2seq.train(..., attention=MyAttention)."
        raise ConfigError(f"the overrides do not compose: {message}") from None
    finally:
        GlobalHydra.instance().clear()
    choices = {
        str(group): str(option)
        for group, option in config.hydra.runtime.choices.items()
        if option is not None and not str(group).startswith("hydra/")
    }
    with open_dict(config):
        del config["hydra"]
    return config, choices


# Lightning's loggers: their start-up lines, model summary and test table flood a notebook.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning_fabric")


@contextlib.contextmanager
def quieted() -> Iterator[None]:
    """Lightning's chatter kept out of a notebook's output (its INFO logs and warnings; the
    config's ``quiet`` drops its model summary and test table); the progress bar, warnings and
    errors of ours still show."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(pytorch_)?lightning")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def use_scoring_class(config: DictConfig, scoring: Any, overrides: Sequence[str]) -> None:
    """``config.attention`` made the ``_partial_`` config of the class ``scoring``: its import
    path as ``_target_``; of the chosen group's keys (``attention=dot`` …) those its ``__init__``
    takes, the others dropped, unless an override set one (then refused: it would be lost)."""
    if not (isinstance(scoring, type) and issubclass(scoring, Attention)):
        raise ConfigError(
            "seq2seq.train(attention=...) takes a scoring function's class, a subclass of "
            f"seq2seq.attention.Attention; got {scoring!r}. A built-in one is an override "
            "instead: seq2seq.train('attention=scaled_dot')."
        )
    name = scoring.__qualname__
    if "<" in name:  # <locals>: a class made inside a function has no import path
        raise ConfigError(
            f"{name} is defined inside a function, so a checkpoint could not name it to build "
            "it again; define the class at the top level of a notebook cell or a module."
        )
    parameters = inspect.signature(scoring.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    given = {
        override.split("=", 1)[0].lstrip("+~").removeprefix("attention.")
        for override in overrides
        if override.lstrip("+~").startswith("attention.")
    }
    kept = {"_target_", "_partial_", "num_heads", *PART_KEYS}
    with open_dict(config):
        for key in [str(key) for key in config.attention]:
            if key in kept or key in parameters or takes_any:
                continue
            if key in given:
                raise ConfigError(
                    f"the override attention.{key}=... sets an argument that {name}.__init__ "
                    f"does not take (it takes {', '.join(p for p in parameters if p != 'self')}); "
                    "drop the override or add the argument to the class."
                )
            del config.attention[key]
        config.attention._target_ = f"{scoring.__module__}.{name}"
        config.attention._partial_ = True


def train(*overrides: str, attention: type[Attention] | None = None, quiet: bool = True) -> Run:
    """Train as ``seq2seq train OVERRIDES`` does, each override a string (``"attention=dot"``),
    into the directory the override ``"run_dir=DIR"`` names (else ``outputs/DATE/TIME``), and
    return the run; ``quiet``: without Lightning's summaries and logs, only a progress bar (in a
    notebook tqdm's, one line an epoch; none with ``trainer.enable_progress_bar=false``): the
    run's files hold everything, and ``repr(run)`` says where it is and how it did.

    ``attention``: a scoring function's class of your own, e.g. one defined in a notebook cell,
    with the arguments its ``__init__`` takes from the attention group chosen by the overrides
    (``attention=dot`` gives ``dropout``, ``temperature``, ``initial_temperature``). Its module is
    trusted, as a config that names it is (``__main__`` for a notebook's or script's own class:
    ``run.translator()`` trusts it too; a checkpoint loaded elsewhere needs
    ``trust_modules=["__main__"]`` and the class defined there under the same name)."""
    for override in overrides:
        if not isinstance(override, str) or "=" not in override:
            raise ConfigError(
                f"seq2seq.train takes overrides as the command line does, each a string "
                f"'key=value', e.g. seq2seq.train('attention=additive', 'trainer.max_epochs=1'); "
                f"got {override!r}."
            )
        if re.search(r"\s\S+=", override.split("=", 1)[1]):
            raise ConfigError(
                f"{override!r} holds several overrides in one string; pass each as a string of "
                f"its own: seq2seq.train({', '.join(map(repr, override.split()))})."
            )
    given = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "run_dir"]
    directory = Path(given[-1].split("=", 1)[1]) if given else new_run_dir()
    extra = [] if given else [f"run_dir={directory}"]
    if quiet and not any(o.split("=", 1)[0].lstrip("+") == "quiet" for o in overrides):
        extra.append("quiet=true")  # no model summary, no test table
    config, choices = compose_overrides([*overrides, *extra])
    if attention is not None:
        use_scoring_class(config, attention, overrides)
        choices.pop("attention", None)  # named after the class
    created = outermost_missing(directory)
    try:
        with quieted() if quiet else contextlib.nullcontext():
            train_config(config, choices)
    except InstantiationException as error:  # a class the config names refused its arguments
        cause = error.__cause__
        message = str(cause) if isinstance(cause, Seq2SeqError) else " ".join(str(error).split())
        raise ConfigError(f"the config could not be built: {message}") from None
    finally:
        # A run that stopped before it trained leaves no directory.
        remove_refused_run(directory, created)
    record_overrides(directory, overrides, attention)
    summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    resolved = OmegaConf.load(directory / "config.yaml")
    assert isinstance(resolved, DictConfig)
    return Run(directory, resolved, summary)


@dataclass(frozen=True, repr=False)
class Comparison:
    """``compare_runs.py``'s tables, shown as Markdown in a notebook: each run, the groups of
    runs that differ only by seed (mean ± 95 % interval), and paired tests between groups."""

    runs: str
    groups: str | None
    tests: str | None

    def _repr_markdown_(self) -> str:
        parts = [self.runs]
        if self.groups:
            parts.append(f"**Groups** (mean ± 95 % interval over seeds)\n\n{self.groups}")
        if self.tests:
            parts.append(f"**Paired tests**\n\n{self.tests}")
        return "\n\n".join(parts)

    def __repr__(self) -> str:  # a notebook without Markdown, or print(): the same tables
        return self._repr_markdown_()


def compare(
    runs: Sequence[Run | str | Path] | Run | str | Path,
    by: Sequence[str] | None = None,
    test: str = "ar",
    samples: int | None = None,
) -> Comparison:
    """Compare ``runs`` (Runs, run directories, or multirun directories holding them) as
    ``seq2seq compare`` does: grouped
    by their config but the seed (or by the config keys ``by``), with paired tests between groups
    when the runs kept their test hypotheses: one stratified approximate randomization over all
    seeds, and each seed pair's own (``ar``: approximate randomization; ``bs``: sacreBLEU's
    paired bootstrap for BLEU and chrF); ``samples``: resamples, or shuffles with ``ar``
    (default 1,000 and 10,000)."""
    if isinstance(runs, Run | str | Path):  # one run, or a multirun directory of them
        runs = [runs]
    try:
        records = read_runs(run.directory if isinstance(run, Run) else Path(run) for run in runs)
    except RunsError as error:
        raise ConfigError(str(error)) from None
    if not records:
        raise ConfigError("seq2seq.compare needs at least one run.")
    groups = group_runs(records, by)
    grouped = groups_table(groups)
    tests = ONE_GROUP_NOTE
    if len(groups) > 1:
        tokenize = str(flat_config(records[0]).get("data.bleu_tokenize", "13a"))
        try:
            tests = significance_table(compare_groups(groups, tokenize, test, samples), test)
        except RunsError as error:
            tests = f"(no paired tests: {error})"
    return Comparison(markdown_table(records, run_labels(records, groups)), grouped, tests)


Model = Run | Translator | str | Path


def explore(
    models: Mapping[str, Model],
    sentences: Sequence[str],
    refs: Sequence[str] | None = None,
    align: Sequence[Any] | None = None,
    beam_size: int = 1,
    title: str = "Attention explorer",
) -> InlinePage:
    """The explorer page of up to four ``models`` (name -> a Run, a Translator, or a checkpoint
    or bundle path) on ``sentences`` (with references and gold ``align``ments,
    ``seq2seq.analysis.alignment.GoldAlignment``): shown inline as a cell's last expression,
    ``.save(path)`` writes it."""
    if not isinstance(models, Mapping):
        raise ConfigError(
            "seq2seq.explore takes its models as a dict of name -> model (a Run, a Translator, "
            "or a checkpoint or bundle path), e.g. {'additive': run}; got "
            f"{type(models).__name__}."
        )
    if isinstance(sentences, str):
        raise ConfigError(
            "seq2seq.explore takes a list of sentences, e.g. ['the dog sees a cat .']; got one "
            "string, which would be read character by character."
        )
    if not 1 <= len(models) <= 4:
        raise ConfigError(f"seq2seq.explore shows one to four models, got {len(models)}.")
    loaded = []
    for name, model in models.items():
        if isinstance(model, Run):
            translator = model.translator()
        elif isinstance(model, Translator):
            translator = model
        else:
            translator = Translator.load(model)
        loaded.append(ExplorerModel(name, translator))
    data = explorer_data(loaded, list(sentences), refs, align, beam_size=beam_size, title=title)
    return InlinePage(data)
