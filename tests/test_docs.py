"""The docs name only what exists: ``docs/architecture.md`` and the README.

Every backticked file or folder (``app/wiring.py``, ``sparse/factory.py``,
``tests/app/browser/``), dotted name (``app.wiring``, ``feature_store.ops.control``,
``ControlListener._dispatch``, a settings path such as ``api.candidate_sources``),
code-looking identifier (``open_resources``, ``TRAINER_ACTIONS``) and ``vidrec``
command they cite must be found in the tree, so a rename or a removal that
leaves a doc behind fails here. A name written right after a file
(```app/wiring.py` `run_up```) must be defined in that file.

Cheap: it parses the sources (``ast``), imports nothing of the project but the
settings tree (pydantic), and needs no service.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from pydantic import BaseModel

from feature_store.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "trainer", "feature_store", "bench", "tests")
DOCS = ("docs/architecture.md", "README.md")

NOT_CODE = {
    "ignore_imports",  # import-linter's key in pyproject.toml
    "VIDREC_*",
    "VIDREC_TORCH",
    "VIDREC_ONNXRUNTIME",
    "VIDREC_NEED_BROWSER",
}
"""Backticked words that look like code but name something outside the Python tree."""

TICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"[\w.-]+(/[\w.*-]+)*/?")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
IDENT = re.compile(r"[A-Za-z_]\w*")
FILE_SUFFIXES = (".py", ".md", ".toml", ".js", ".html", ".css", ".yml", ".yaml", ".json")
AFTER_FILE = re.compile(r"`([\w/.-]+\.py)` `([A-Za-z_][\w.]*)")


@functools.cache
def tracked() -> frozenset[str]:
    """Tracked files and their folders (``a/b/``), relative to the root."""
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    found = set(out)
    for path in out:
        parts = path.split("/")[:-1]
        found.update("/".join(parts[: i + 1]) + "/" for i in range(len(parts)))
    return frozenset(found)


def path_exists(token: str) -> bool:
    """A path from the root, or a shorthand that ends a tracked path (``sparse/factory.py``)."""
    files = tracked()
    if token in files or f"{token}/" in files:
        return True
    return any(f.endswith("/" + token) or f.endswith("/" + token + "/") for f in files)


@functools.cache
def tree(path: Path) -> ast.Module:
    with warnings.catch_warnings():  # a stray escape in someone's docstring is not ours
        warnings.simplefilter("ignore")
        return ast.parse(path.read_text(), str(path))


def defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines: defs, classes, assignments, fields."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):  # re-exports
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):
            names.update(defined(node.body))
    return names


def attribute_names(cls: ast.ClassDef) -> set[str]:
    """A class's own names plus the ``self.x = ...`` its methods assign."""
    names = set(defined(cls.body))
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


@functools.cache
def sources() -> tuple[Path, ...]:
    this = Path(__file__).resolve()  # its own strings name what must not be found
    return tuple(
        ROOT / f for f in tracked()
        if f.endswith(".py") and f.split("/")[0] in PACKAGES and ROOT / f != this
    )


@functools.cache
def every_name() -> dict[str, list[ast.AST]]:
    """Every name defined anywhere in the packages (classes by their attributes too),
    and every identifier-like string constant (a value such as ``no_model``)."""
    found: dict[str, list[ast.AST]] = {}
    for path in sources():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Module | ast.ClassDef):
                for name, where in defined(node.body).items():
                    found.setdefault(name, []).append(where)
            if isinstance(node, ast.ClassDef):
                for name in attribute_names(node):
                    found.setdefault(name, []).append(node)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if IDENT.fullmatch(node.value):  # a value the docs cite: ``no_model``
                    found.setdefault(node.value, []).append(node)
    return found


def module_file(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The longest module prefix of ``parts`` that is a file, and the rest."""
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[i:]
        if base.is_dir() and i == len(parts):
            return base, []  # a namespace folder such as ``tests/app``
    return None


def has_attrs(body: list[ast.stmt], rest: list[str]) -> bool:
    """Whether ``rest`` (``name``, ``Class.method``...) is defined under ``body``."""
    names = defined(body)
    for i, name in enumerate(rest):
        if name not in names:
            return False
        node = names[name]
        if i == len(rest) - 1:
            return True
        if not isinstance(node, ast.ClassDef):
            return False
        names = {n: node for n in attribute_names(node)} | defined(node.body)
    return True


def settings_path(parts: list[str]) -> bool:
    """``api.candidate_sources``, ``SparseSettings.backend``: a field of the settings tree."""
    model: type[BaseModel] = Settings
    for part in parts:
        fields = model.model_fields
        if part not in fields:
            return False
        annotation = fields[part].annotation
        nested = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation if nested else BaseModel  # type: ignore[assignment]
    return True


def settings_models() -> dict[str, type[BaseModel]]:
    import feature_store.settings as module

    return {
        name: obj for name, obj in vars(module).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel)
    }


def dotted_exists(token: str) -> bool:
    parts = token.split(".")
    if parts[0] in sys.stdlib_module_names:  # ``dataclasses.replace``
        return hasattr(importlib.import_module(parts[0]), parts[1])
    found = module_file(parts)
    if found is not None:
        path, rest = found
        if not rest or (path.suffix == ".py" and has_attrs(tree(path).body, rest)):
            return True
    if settings_path(parts):
        return True
    model = settings_models().get(parts[0])
    if model is not None and len(parts) == 2 and parts[1] in model.model_fields:
        return True
    classes = [
        n for n in every_name().get(parts[0], []) if isinstance(n, ast.ClassDef)
    ]
    return any(has_attrs(c.body, parts[1:]) for c in classes)


def looks_like_code(word: str) -> bool:
    """``open_resources``, ``TRAINER_ACTIONS``, ``TrainerView``: not ``memory`` or ``torch``."""
    return "_" in word.strip("_") or (word[0].isupper() and any(c.islower() for c in word[1:]))


@functools.cache
def cli_commands() -> frozenset[str]:
    return frozenset(re.findall(r'add_parser\(\s*"([\w-]+)"', (ROOT / "app/cli.py").read_text()))


def token_problem(token: str) -> str | None:
    """Why one backticked ``token`` names nothing in the tree, or None."""
    if token in NOT_CODE or token.startswith(("/", "http", "[", ".", "-")):
        return None
    if token.startswith("vidrec "):
        return None if token.split()[1] in cli_commands() else f"command {token!r}"
    call = re.fullmatch(r"([\w.]+)\(.*\)", token)
    if call:
        token = call.group(1)
    if "/" in token or token.endswith(FILE_SUFFIXES):
        missing = PATH.fullmatch(token) is not None and not path_exists(token)
        return f"path {token!r}" if missing else None
    if DOTTED.fullmatch(token):
        return None if dotted_exists(token) else f"name {token!r}"
    if IDENT.fullmatch(token) and looks_like_code(token) and token not in every_name():
        return f"name {token!r}"
    return None


def problems(doc: str) -> list[str]:
    """What ``doc`` cites that the tree does not have."""
    text = (ROOT / doc).read_text()
    wrong = [p for t in sorted(set(TICKED.findall(text))) if (p := token_problem(t.strip()))]
    for path, name in AFTER_FILE.findall(text):
        file = next((ROOT / f for f in tracked() if f == path or f.endswith("/" + path)), None)
        if file is not None and not has_attrs(tree(file).body, name.split(".")):
            wrong.append(f"{name!r} in {path}")
    return wrong


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_path_and_name_exists(doc: str) -> None:
    assert problems(doc) == []


def test_the_check_catches_what_is_gone() -> None:
    assert not path_exists("feature_store/nowhere.py")
    assert path_exists("sparse/factory.py")
    assert not dotted_exists("feature_store.runtime.resources.no_such_function")
    assert dotted_exists("feature_store.runtime.resources.open_resources")
    assert dotted_exists("ControlListener._dispatch")
    assert not dotted_exists("ControlListener._no_such_method")
    assert dotted_exists("api.candidate_sources")
    assert not dotted_exists("api.no_such_setting")
    assert "no_such_function" not in every_name()
