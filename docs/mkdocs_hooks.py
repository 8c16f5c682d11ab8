"""mkdocs hooks: the generated parts of the site, from the code itself.

A page asks for generated content with an HTML comment marker (left as is on GitHub):

- ``<!-- fiber:options PLUGIN -->``: the configuration keys ``PLUGIN`` declares (``fibercore``
  for the core, ``fiber-docker``...), as a table: key, type, default, variable, meaning.
- ``<!-- fiber:hooks -->``: every hook of ``fibercore/hookspecs.py``: signature, calling
  rule and docstring.
- ``<!-- fiber:cli -->``: ``fiber COMMAND --help`` of every command.
- ``<!-- fiber:include PATH -->``: a file of the repository (a plugin's README), its
  relative links turned into plain paths (they point outside the site).

So an option, hook or command added to the code is on the site at the next build, and
``tests/test_docs.py`` fails when one has no documentation at all.

The option tables and the hook reference are also written into the Markdown files, between
the marker and ``<!-- /fiber:options -->`` (``/fiber:hooks``), so a reader of the repository
sees them too: ``python docs/mkdocs_hooks.py --write`` refreshes them, ``--check`` (and
``tests/test_docs.py``) fails when one is stale. The site always shows the code's own.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- fiber:(?P<kind>options|hooks|cli|include)\s*([^>]*?)\s*-->"
                    r"(?:\n(?P<old>(?:(?!<!-- fiber:).)*?)<!-- /fiber:(?P=kind) -->)?", re.S)
#: The kinds written into the Markdown too (the others are long or vary with the terminal).
WRITTEN = ("options", "hooks")


def all_options() -> list[Any]:
    """The core's options, then each installed backend's (entry points fiber.backends)."""
    from fibercore.config import CORE_OPTIONS
    from fibercore.plugins import BACKENDS_GROUP, installed, load_value

    options = list(CORE_OPTIONS)
    seen = set()
    for info in installed(BACKENDS_GROUP):
        plugin = load_value(info.value)
        if info.value in seen or not hasattr(plugin, "fiber_config_options"):
            continue
        seen.add(info.value)
        options += plugin.fiber_config_options()
    return options


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def options_table(plugin: str) -> str:
    """The table of ``plugin``'s keys; where that backend is not installed, how to install it."""
    rows = [o for o in all_options() if o.plugin == plugin]
    if not rows and plugin != "fibercore" and not _installed(plugin):
        folder = "plugins/" + plugin.replace("-", "_")
        return (f'!!! note "{plugin} is not installed where this page was built"\n'
                f"    Its configuration keys are listed here when it is: `pip install -e {folder}` "
                f"from a checkout, then build the site again. `fiber config --all --backend NAME` shows "
                f"them too, once it is installed.\n")
    if not rows:
        raise ValueError(f"no configuration keys declared by {plugin!r} (is it installed?)")
    out = ["| key | type | default | environment | meaning |", "|---|---|---|---|---|"]
    for o in rows:
        default = "—" if o.default is None else f"`{o.default!r}`"
        choices = f" One of {', '.join(f'`{c}`' for c in o.choices)}." if o.choices else ""
        text = (o.help + choices).replace("|", "\\|")
        out.append(f"| `{o.name}` | {o.type_name} | {default} | `FIBER_{o.name.upper()}` | {text} |")
    return "\n".join(out)


def hook_specs() -> list[tuple[str, Any, dict[str, Any]]]:
    """(name, function, spec options) of every hook, in the file's order."""
    from fibercore import hookspecs

    found = []
    for name, func in vars(hookspecs).items():
        if name.startswith("fiber_") and callable(func):
            opts = getattr(func, "fiber_spec", None) or {}
            found.append((name, func, opts))
    return found


def hooks_reference() -> str:
    out = []
    for name, func, opts in hook_specs():
        rule = "first non-None result wins" if opts.get("firstresult") else "every plugin is called"
        signature = str(inspect.signature(func)).replace("'", "")
        doc = inspect.cleandoc(func.__doc__ or "").replace(":param ", "- `").replace(":return:", "\n**Returns:**")
        doc = re.sub(r"- `(\w+):", r"- `\1`:", doc).replace(":raises Exception:", "\n**Raises:**")
        out.append(f"### `{name}`\n\n```python\ndef {name}{signature}\n```\n\n*{rule}.*\n\n{doc}\n")
    return "\n".join(out)


def cli_reference() -> str:
    from fibercore.cli import COMMANDS, build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out = []
    for command in COMMANDS:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            subparsers.choices[command].print_help()
        out.append(f"### `fiber {command}`\n\n```text\n{text.getvalue().rstrip()}\n```\n")
    return "\n".join(out)


def include(spec: str) -> str:
    """A file, or one ``## Section`` of it (``README.md#Security``)."""
    path, _, section = spec.partition("#")
    text = (ROOT / path).read_text()
    if section:
        found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        if found is None:
            raise ValueError(f"no section '## {section}' in {path}")
        text = found.group(1)
    # A relative link leaves the site: keep its text and show the repository path.
    base = (ROOT / path).parent

    def plain(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            return match.group(0)
        return f"{label} (`{(base / target).resolve().relative_to(ROOT)}`)"

    text = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", plain, text)
    # A README's own title becomes a section of the page.
    return text if section else re.sub(r"^# ", "## ", text, count=1, flags=re.M)


def expand(markdown: str) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "options":
            return options_table(arg)
        if kind == "hooks":
            return hooks_reference()
        if kind == "cli":
            return cli_reference()
        return include(arg)

    return MARKER.sub(replace, markdown)


def written(markdown: str) -> str:
    """``markdown`` with each options table and the hook reference refreshed below its marker
    (a table of a backend that is not installed here is kept as it is)."""
    def refresh(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind not in WRITTEN:
            return match.group(0)
        if kind == "options" and arg != "fibercore" and not _installed(arg):
            return match.group(0)
        body = options_table(arg) if kind == "options" else hooks_reference()
        opening = f"<!-- fiber:{kind} {arg} -->" if arg else f"<!-- fiber:{kind} -->"
        return f"{opening}\n{body.rstrip()}\n<!-- /fiber:{kind} -->"

    return MARKER.sub(refresh, markdown)


def stale_pages() -> list[Path]:
    """The pages whose written tables differ from the code's."""
    return [page for page in sorted((ROOT / "docs").rglob("*.md")) if written(page.read_text()) != page.read_text()]


def main(argv: list[str]) -> int:
    """``--write``: refresh the written tables; ``--check``: exit 1 naming the stale pages."""
    if argv[1:] == ["--write"]:
        for page in stale_pages():
            page.write_text(written(page.read_text()))
            print(f"wrote {page.relative_to(ROOT)}")
        return 0
    if argv[1:] == ["--check"]:
        stale = stale_pages()
        for page in stale:
            print(f"{page.relative_to(ROOT)}: its generated tables are stale: python docs/mkdocs_hooks.py --write")
        return 1 if stale else 0
    print("usage: python docs/mkdocs_hooks.py --write | --check")
    return 2


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)


#: A Sphinx role left in a docstring, as the Markdown renderer leaves it: ``:meth:<code>x</code>``.
_ROLE = re.compile(r":(?:py:)?(?:meth|class|func|attr|data|mod|exc|obj|const):<code>(~?)([^<]*)</code>")


def plain_roles(html: str) -> str:
    """Sphinx roles (``:class:`~fibercore.types.Job```, which ``help()`` readers know) shown as
    code: ``Job`` (a leading ``~`` keeps the last name only, as in Sphinx)."""

    def code(match: re.Match[str]) -> str:
        name = match.group(2)
        return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"

    return _ROLE.sub(code, html)


def on_page_content(html: str, **kwargs: Any) -> str:
    return plain_roles(html)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv))
