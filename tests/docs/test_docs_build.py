"""The built documentation site (issue 50): it ships no source or bytecode, the API reference's
docstring lists are lists, and no formula shows a raw TeX macro. One strict build into a temporary
folder for the module (a few seconds; marked slow with the other site builds)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' (mkdocs-material, mkdocstrings[python])")
    out = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_ships_no_source_or_bytecode(site):
    shipped = [p.relative_to(site).as_posix() for p in site.rglob("*")
               if p.suffix in {".py", ".pyc"} or p.name == "__pycache__"]
    assert not shipped, f"the built site would publish source or bytecode: {shipped}"


def test_the_core_reference_renders_the_contract_as_a_list(site):
    page = (site / "reference" / "core" / "index.html").read_text()
    items = [html.unescape(re.sub(r"<[^>]+>", "", item)) for item in re.findall(r"<li>(.*?)</li>", page, re.S)]
    for bullet in ("__init__:", "client_objective:", "train_clients(context, shards):",
                   "aggregate(payload) -> ServerStep | Tensor:", "history_rows_to_keep(next_round):"):
        assert any(item.strip().startswith(bullet) for item in items), f"no list item for {bullet!r}"


def test_no_docstring_list_is_run_into_a_paragraph(site):
    """A paragraph of the API reference with a line that starts like a list item ("- x", "2. x") is
    a list that Markdown did not see."""
    collapsed = []
    for page in sorted((site / "reference").rglob("*.html")):
        for paragraph in re.findall(r"<p>(.*?)</p>", page.read_text(), re.S):
            for line in paragraph.splitlines()[1:]:
                if re.match(r"\s*(?:[-*+]|\d+\.)\s+\S", re.sub(r"<[^>]+>", "", line)):
                    collapsed.append(f"{page.relative_to(site)}: {line.strip()[:100]}")
    assert not collapsed, "lists run into paragraphs:\n" + "\n".join(collapsed)


def test_no_formula_shows_a_raw_tex_macro(site):
    shown = []
    for page in sorted(site.rglob("*.html")):
        if page.relative_to(site).parts[0] == "leaderboard":
            continue
        for formula in re.findall(r"<math\b.*?</math>", page.read_text(), re.S):
            text = html.unescape(re.sub(r"<[^>]+>", " ", formula))
            shown += [f"{page.relative_to(site)}: {macro}" for macro in re.findall(r"\\[A-Za-z]+|\\[|{}]", text)]
    assert not shown, "formulas that show TeX macros as text:\n" + "\n".join(sorted(set(shown)))
