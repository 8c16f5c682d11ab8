"""The documentation covers the code: a hook, an option, a command, a multiprocessing name or an
example without its documentation fails here, and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fibercore
from fibercore.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
mkdocs_hooks = importlib.import_module("mkdocs_hooks")


def test_every_hook_has_a_docstring_and_a_row_in_the_hook_table():
    table = (DOCS / "hooks.md").read_text()
    specs = mkdocs_hooks.hook_specs()
    assert len(specs) >= 20
    for name, func, _ in specs:
        assert (func.__doc__ or "").strip(), f"hook {name} has no docstring in hookspecs.py"
        assert f"| `{name}(" in table, f"hook {name} is not in the table of docs/hooks.md"


def test_every_option_has_help_and_its_plugins_page_shows_its_table():
    pages = {"fibercore": "configuration.md", "fiber-local": "backends/local.md",
             "fiber-docker": "backends/docker.md", "fiber-k8s": "backends/kubernetes.md",
             "fiber-aws": "backends/aws.md", "fiber-slurm": "backends/slurm.md",
             "fiber-ssh": "backends/ssh.md"}
    options = mkdocs_hooks.all_options()
    for option in options:
        assert option.help.strip(), f"option {option.name} ({option.plugin}) has no help text"
        assert option.plugin in pages, f"no documentation page for {option.plugin}'s options ({option.name})"
    for plugin, page in pages.items():
        text = (DOCS / page).read_text()
        assert f"<!-- fiber:options {plugin} -->" in text, f"docs/{page} does not show {plugin}'s options"
        table = mkdocs_hooks.options_table(plugin)
        for option in (o for o in options if o.plugin == plugin):
            assert f"| `{option.name}` |" in table


def test_the_tables_written_into_the_markdown_are_the_codes():
    """A reader of the repository (not the site) sees each backend's keys and every hook: the
    tables below their markers are what the code declares now."""
    stale = [str(page.relative_to(ROOT)) for page in mkdocs_hooks.stale_pages()]
    assert not stale, f"{stale}: run python docs/mkdocs_hooks.py --write"
    text = (DOCS / "backends" / "ssh.md").read_text()
    assert "| `ssh_hosts` | str |" in text and "<!-- /fiber:options -->" in text


def test_every_command_is_documented_and_registered():
    parser = build_parser()
    registered = set(next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices)
    assert registered == set(COMMANDS)
    text = (DOCS / "cli.md").read_text()
    for command in COMMANDS:
        assert f"## fiber {command}\n" in text, f"`fiber {command}` has no section in docs/cli.md"


def test_every_multiprocessing_name_is_mapped_and_present():
    text = (DOCS / "multiprocessing-mapping.md").read_text()
    rows = re.findall(r"^\| (.+?) \| (supported|differs|not|extra) \|", text, re.M)
    mapped = {name for cell, _ in rows for name in re.findall(r"`([\w.]+)`", cell)}
    for name in multiprocessing.__all__:
        assert name in mapped, f"multiprocessing.{name} is not in docs/multiprocessing-mapping.md"
        assert hasattr(fibercore, name), f"fibercore has no {name}"


def test_every_example_is_listed_and_run_by_the_tests():
    listed = (DOCS / "examples.md").read_text()
    tested = (ROOT / "tests" / "test_examples.py").read_text()
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert f"`examples/{path.name}`" in listed, f"examples/{path.name} is not in docs/examples.md"
        assert path.name in tested, f"examples/{path.name} is not run by tests/test_examples.py"


def test_no_page_links_to_a_file_the_site_leaves_out():
    """``docs/perf/*.md`` are left out of the site (mkdocs.yml's exclude_docs; pages include
    them): a link to one would be a 404 on the built site, as ``perf/transports.md`` was."""
    bad = [f"{page.name}: {target}" for page in sorted(DOCS.glob("*.md"))
           for target in re.findall(r"\]\((perf/[^)#]+\.md)[)#]", page.read_text())]
    assert not bad, f"links to pages that are not built: {bad}"


def test_the_getting_started_code_fits_the_page():
    """A newcomer's first page: no line of a code block is wider than the site's code column
    (88 characters), so no command or comment runs off the right edge."""
    wide, inside = [], False
    for number, line in enumerate((DOCS / "getting-started.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif inside and len(line) > 88:
            wide.append(f"line {number}: {len(line)} characters")
    assert not wide, wide


def test_the_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        if os.environ.get("CI"):
            pytest.fail("CI=true but mkdocs is not installed (pip install -e '.[docs]')")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    done = subprocess.run([mkdocs, "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    hooks_page = (tmp_path / "site" / "hooks" / "index.html").read_text()
    assert "fiber_create_job" in hooks_page and "fiber_doctor" in hooks_page
    assert "docker_network" in (tmp_path / "site" / "backends" / "docker" / "index.html").read_text()
    assert_api_page_reads_well(tmp_path / "site")



def assert_api_page_reads_well(site: Path) -> None:
    """The API page: headings with the names users import, no raw Sphinx roles."""
    api = (site / "api" / "index.html").read_text()
    headings = [re.sub(r"<[^>]+>|&para;", "", h).split()[0]
                for h in re.findall(r'<h2 id="[^"]+" class="doc doc-heading">(.*?)</h2>', api, re.S)]
    for name in ("fibercore.Process", "fibercore.Pool", "fibercore.Queue", "fibercore.Pipe", "fibercore.init"):
        assert name in headings, headings
    assert not [h for h in headings if h.startswith(("fibercore.pool.api", "fibercore.process."))], headings
    text = re.sub(r"<[^>]+>", "", api)
    roles = re.findall(r":(?:meth|class|func|attr|data|mod|exc|obj):\S*", text)
    assert not roles, f"raw Sphinx roles on the API page: {roles[:5]}"


@pytest.mark.builtin_transport  # a venv of the core and fiber-local only: the built-in transport
@pytest.mark.slow
def test_the_docs_build_with_only_the_core_the_local_backend_and_the_docs_extra(tmp_path):
    """As the README says: pip install -e ".[docs]" (with fiber-local) in a new venv, then
    mkdocs build --strict. Pages of backends that are not installed say how to install them;
    Getting started's first program runs there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*pip, "-U", "pip", "setuptools", "wheel"], check=True, capture_output=True)
    done = subprocess.run([*pip, "--no-build-isolation", "-e", str(ROOT / "plugins" / "fiber_local"),
                           "-e", f"{ROOT}[docs]"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout
    assert "fiber-docker" not in listed and "fiber_docker" not in listed
    done = subprocess.run([str(venv / "bin" / "mkdocs"), "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    aws = (tmp_path / "site" / "backends" / "aws" / "index.html").read_text()
    assert "fiber-aws is not installed where this page was built" in aws
    assert "pip install -e plugins/fiber_aws" in aws
    assert_api_page_reads_well(tmp_path / "site")
    # Getting started's first program, in this venv (no tqdm: the plain counter)
    first = re.search(r"## A first program\n\n```python\n(.*?)```", (DOCS / "getting-started.md").read_text(), re.S)
    assert first, "getting-started.md has no first program"
    (tmp_path / "first.py").write_text(first.group(1))
    assert "tqdm" not in listed
    ran = subprocess.run([str(venv / "bin" / "python"), "first.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str([x * x for x in range(10)])
    assert re.fullmatch(r"map: 10/10 tasks \(100%\), [0-9.]+ tasks/s\n", ran.stderr), ran.stderr


def test_every_hook_parameter_and_result_is_documented_in_hookspecs():
    """Each hookspec's docstring names every parameter (``:param name:``) and, unless the
    hook is an observer (results ignored) or takes no arguments, its result (``:return:``)."""
    import inspect

    from fibercore import hookspecs

    missing = []
    for name, fn in vars(hookspecs).items():
        if not name.startswith("fiber_") or not callable(fn):
            continue
        doc = inspect.getdoc(fn) or ""
        params = list(inspect.signature(fn).parameters)
        missing += [f"{name}({p})" for p in params if f":param {p}:" not in doc]
        observer = "results are ignored" in " ".join(doc.split())
        if not observer and ":return:" not in doc:
            missing.append(f"{name}: its result")
    assert not missing, f"undocumented in fibercore/hookspecs.py: {missing}"


def test_every_row_of_the_surface_inventory_names_tests_that_exist():
    """docs/security.md's surface inventory: each row names at least one test, and each test
    it names is a function of that file (a renamed or removed attack test fails here)."""
    import ast

    root = ROOT
    text = (DOCS / "security.md").read_text()
    section = text.split("## Surface inventory", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| resource")]
    assert len(rows) >= 20, "the inventory lost its rows"
    defined: dict[str, set[str]] = {}
    for row in rows:
        named = re.findall(r"`([\w/]+\.py)::(\w+)`", row.split("|")[-2])
        assert named, f"an inventory row names no test: {row[:100]}"
        for path, name in named:
            if path not in defined:
                tree = ast.parse((root / path).read_text())
                defined[path] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in defined[path], f"docs/security.md names {path}::{name}, which does not exist"
