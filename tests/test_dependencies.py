"""Every package seq2seq imports is declared, in the extra of the feature that imports it, and a
missing extra is named in one paragraph (``seq2seq.errors.require_extra``); the slow tests install
the project into fresh virtual environments as a new user would."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import venv
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from seq2seq import errors
from seq2seq.errors import MissingExtraError, require_extra

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seq2seq"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TOOL = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names, as ``require_extra`` reads it, canonicalised."""
    return canonical(errors.requirement_name(requirement))


CORE = {requirement_name(requirement) for requirement in PROJECT["dependencies"]}
EXTRAS = {
    extra: {requirement_name(requirement) for requirement in requirements}
    for extra, requirements in PROJECT["optional-dependencies"].items()
    if extra != "dev"
}
# Imports that may fail: deptry's list of packages used only when present.
SOFT = set(TOOL["deptry"]["per_rule_ignores"]["DEP001"])


def guards(tree: ast.AST) -> list[tuple[int, str, ast.AST | None]]:
    """(line, extra, enclosing function or None) of each ``require_extra("extra", ...)``."""
    found = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))]:
        body = scope.body if isinstance(scope, ast.FunctionDef | ast.Module) else []
        for statement in body:
            call = getattr(statement, "value", None)
            if (
                isinstance(call, ast.Call)
                and getattr(call.func, "id", None) == "require_extra"
                and isinstance(call.args[0], ast.Constant)
            ):
                owner = scope if isinstance(scope, ast.FunctionDef) else None
                found.append((statement.lineno, str(call.args[0].value), owner))
    return found


def third_party_imports(tree: ast.AST) -> Iterator[tuple[int, str, ast.AST | None]]:
    """(line, top-level module, enclosing function or None) of each import of another package."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        owner = parents.get(node)
        while owner is not None and not isinstance(owner, ast.FunctionDef):
            owner = parents.get(owner)
        for name in names:
            top = name.split(".")[0]
            if top != "seq2seq" and top not in sys.stdlib_module_names and top != "__future__":
                yield node.lineno, top, owner


def distributions(module: str) -> list[str]:
    return [canonical(name) for name in metadata.packages_distributions().get(module, [])]


def package_guards(path: Path) -> set[str]:
    """The extras that ``path``'s package and its parents require when they are imported."""
    extras = set()
    for folder in path.relative_to(ROOT).parents:
        init = ROOT / folder / "__init__.py"
        if init.is_file():
            tree = ast.parse(init.read_text())
            extras |= {extra for _, extra, owner in guards(tree) if owner is None}
    return extras


def test_every_optional_import_is_guarded_by_the_extra_that_declares_it() -> None:
    """A third-party import is a core dependency, or a package of an extra whose
    ``require_extra`` runs first: in the same function above it, at the top of the same module,
    or in the package's ``__init__``. So a package in the wrong extra, or an unguarded import of
    one, fails here (deptry, in ``make test``, catches one declared nowhere)."""
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = guards(tree)
        for line, module, owner in third_party_imports(tree):
            names = distributions(module)
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if module in SOFT:  # used only where present (installed or not: otter brings pandas)
                continue
            if not names:
                problems.append(f"{where}, which no installed distribution provides")
                continue
            if any(name in CORE for name in names):
                continue
            extras = {extra for extra, members in EXTRAS.items() if members & set(names)}
            if not extras:
                problems.append(f"{where} ({names}), declared in no extra and not a dependency")
                continue
            before = {
                extra
                for guard_line, extra, guard_owner in guarded
                if guard_line < line and guard_owner in (owner, None)
            }
            if not extras & (before | package_guards(path)):
                problems.append(f"{where} of the {sorted(extras)} extra without require_extra")
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_unguarded_import(tmp_path: Path) -> None:
    """The checker's own parts on a made-up module: an import in a function without the guard,
    and one after it."""
    source = (
        "def bad():\n    import uvicorn\n\n"
        "def good():\n    require_extra('serve', 'x')\n    import uvicorn\n"
    )
    tree = ast.parse(source)
    (bad, good) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [(line, extra, owner) for line, extra, owner in guards(tree)] == [(5, "serve", good)]
    assert [(line, owner) for line, _, owner in third_party_imports(tree)] == [(2, bad), (6, good)]
    assert "uvicorn" in EXTRAS["serve"] and "uvicorn" not in CORE


def test_the_extras_that_dev_installs_are_named_not_copied() -> None:
    """``dev`` installs every other extra by naming it, so the lists cannot drift apart."""
    dev = PROJECT["optional-dependencies"]["dev"]
    named = [r for r in dev if requirement_name(r) == "seq2seq"]
    assert len(named) == 1, dev
    assert set(re.findall(r"\[(.*)\]", named[0])[0].split(",")) == set(EXTRAS)
    copied = {requirement_name(r) for r in dev} & set().union(*EXTRAS.values())
    assert not copied, f"dev repeats packages of other extras: {sorted(copied)}"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_a_missing_extra_is_named_with_its_install_command(
    extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one of the extra's packages absent, the error names it, the extra, and the pip
    command; with all of them present, nothing is raised."""
    require_extra(extra, "Feature")  # dev installs every extra
    absent = sorted(EXTRAS[extra])[-1]
    real = errors.installed
    monkeypatch.setattr(errors, "installed", lambda name: canonical(name) != absent and real(name))
    with pytest.raises(MissingExtraError) as caught:
        require_extra(extra, "Feature")
    message = str(caught.value)
    assert message.startswith(f"Feature needs the packages of seq2seq's optional {extra!r} extra")
    names = re.search(r"; (\S+) is not installed\. ", message)
    assert names is not None and canonical(names.group(1)) == absent, message
    assert "Install them into the environment that runs seq2seq: pip install " in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("origin", "command"),
    [
        (
            {"url": "file:///src/seq2seq", "dir_info": {"editable": True}},
            "pip install -e '/src/seq2seq[serve]'",
        ),
        ({"url": "file:///src/seq2seq", "dir_info": {}}, "pip install '/src/seq2seq[serve]'"),
        (
            {"url": "file:///w/seq2seq-0.1.0-py3-none-any.whl", "archive_info": {}},
            "pip install 'seq2seq[serve] @ file:///w/seq2seq-0.1.0-py3-none-any.whl'",
        ),
        (None, "pip install 'orjson>=3.8' 'h11>=0.14'"),  # from an index: seq2seq on PyPI is
        # another project, so the packages themselves
    ],
)
def test_the_install_command_fits_where_seq2seq_came_from(
    origin: dict[str, object] | None, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PEP 610's direct_url.json says where seq2seq was installed from."""

    class Installed:
        def read_text(self, name: str) -> str | None:
            assert name == "direct_url.json"
            return None if origin is None else json.dumps(origin)

    monkeypatch.setattr(errors.metadata, "distribution", lambda name: Installed())
    assert errors.install_command("serve", ["orjson>=3.8", "h11>=0.14"]) == command
    message = str(errors.missing_extra("serve", "F", ["orjson>=3.8", "h11>=0.14"]))
    assert "; orjson and h11 are not installed. " in message and message.endswith(f"{command}.")


HIDE = """
import sys
from importlib import metadata
hidden = sys.argv.pop(1)
real = metadata.distribution
def distribution(name):
    if name.replace("_", "-").lower() == hidden:
        raise metadata.PackageNotFoundError(name)
    return real(name)
metadata.distribution = distribution
sys.modules[hidden.replace("-", "_")] = None  # its import fails too, as when it is not there
from seq2seq.commands import main
sys.argv = ["seq2seq", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    ("hidden", "command", "extra"),
    [
        ("orjson", ["serve", "--model", "model.ckpt"], "serve"),
        ("uvicorn", ["serve", "--model", "model.ckpt"], "serve"),
        (
            "ctranslate2",
            ["translate", "--model", "{bundle}", "--backend", "ctranslate2"],
            "ctranslate2",
        ),
        ("onnxruntime", ["translate", "--model", "{bundle}", "--backend", "onnx"], "onnx"),
        (
            "eflomal",
            ["align", "--eflomal", "--src", "{tmp}/s", "--tgt", "{tmp}/s", "--write", "{tmp}/w"],
            "align",
        ),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    hidden: str, command: list[str], extra: str, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The installed commands, with one package of the extra gone: exit 2 and one paragraph on
    stderr naming the extra, no traceback."""
    values = {"ckpt": str(tiny_checkpoint), "tmp": str(tmp_path)}
    (tmp_path / "s").write_text("a b\n")
    if "{bundle}" in command:
        values["bundle"] = str(tmp_path / "bundle")
        export = ["export", "--checkpoint", values["ckpt"], "--out", values["bundle"]]
        subprocess.run([sys.executable, "-m", "seq2seq.commands", *export], check=True)
    argv = [part.format(**values) for part in command]
    result = subprocess.run(
        [sys.executable, "-c", HIDE, hidden, *argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"seq2seq's optional {extra!r} extra; {hidden} is not installed." in result.stderr
    assert "pip install " in result.stderr


def test_export_checks_the_extra_before_writing_anything(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """``export --onnx`` without onnx: the message, and no bundle that looks complete."""
    out = tmp_path / "bundle"
    argv = ["export", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--onnx"]
    result = subprocess.run(
        [sys.executable, "-c", HIDE, "onnxscript", *argv], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and "'onnx' extra; onnxscript is not installed" in result.stderr
    assert not out.exists()


# --- A fresh machine: new virtual environments, as the README's commands make them ---------------


def fresh_venv(path: Path) -> Path:
    """A virtual environment that sees no system site-packages; returns its python."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(path)
    return path / "bin" / "python"


def clean_environment() -> dict[str, str]:
    """This process's environment without the venv it runs in, so nothing leaks into the new one."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        part for part in env["PATH"].split(os.pathsep) if not part.startswith(sys.prefix)
    )
    return env


def run_in(
    env: dict[str, str], *command: str | Path, timeout: int = 1500
) -> subprocess.CompletedProcess[str]:
    """``command`` in the checkout with ``env``, its output captured."""
    arguments = [str(part) for part in command]
    return subprocess.run(
        arguments, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def output(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout[-4000:] + done.stderr[-4000:]


@pytest.mark.slow
def test_make_install_dev_in_a_fresh_venv_collects_the_whole_suite(tmp_path: Path) -> None:
    """``make install-dev`` (the Makefile's own pip command) into a new venv, then every test
    module imports: a package that ``dev`` forgets fails collection here."""
    python = fresh_venv(tmp_path / "venv")
    env = clean_environment()
    install = run_in(env, "make", "install-dev", f"PYTHON={python}")
    assert install.returncode == 0, output(install)
    collect = run_in(env, python, "-m", "pytest", "--collect-only", "-q", "-m", "", timeout=600)
    assert collect.returncode == 0, output(collect)
    assert re.search(r"^\d+ tests collected", collect.stdout, re.MULTILINE), output(collect)


@pytest.mark.slow
def test_the_wheel_serves_only_with_the_serve_extra(tmp_path: Path) -> None:
    """The built wheel, installed without extras: ``seq2seq serve --model M`` names the serve
    extra; with ``[serve]`` added, ``seq2seq serve --help`` runs."""
    env = clean_environment()
    wheels = tmp_path / "wheels"
    built = run_in(
        env, sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", wheels, ROOT, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, output(built)
    (wheel,) = wheels.glob("seq2seq-*.whl")
    python = fresh_venv(tmp_path / "venv")
    seq2seq = python.parent / "seq2seq"
    install = run_in(env, python, "-m", "pip", "install", "-q", "torch==2.13.0", wheel)
    assert install.returncode == 0, output(install)
    bare = run_in(env, seq2seq, "serve", "--model", "model.ckpt", timeout=300)
    assert bare.returncode == 2, output(bare)
    assert "'serve' extra" in bare.stderr and "Traceback" not in bare.stderr
    # The command the message suggests, run as given (with this venv's pip).
    suggested = bare.stderr.split("the environment that runs seq2seq: ")[1].strip()
    assert suggested == f"pip install 'seq2seq[serve] @ {wheel.as_uri()}'.", suggested
    pip, *arguments = shlex.split(suggested.removesuffix("."))
    install = run_in(env, python, "-m", pip, *arguments)
    assert install.returncode == 0, output(install)
    served = run_in(env, seq2seq, "serve", "--help", timeout=300)
    assert served.returncode == 0, output(served)
    assert "--max-batch-tokens" in served.stdout
