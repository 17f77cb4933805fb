"""mkdocs hooks (mkdocs.yml ``hooks:``). This file lives beside mkdocs.yml, outside ``docs_dir``:
everything in ``docs/`` is published, so a hook there would ship its source and its bytecode.

- The published site carries the leaderboard (the committed ``leaderboard_site``, built by
  ``fl-leaderboard publish`` from the exports in ``evidence/``; tests/leaderboard/test_published_site.py keeps
  it equal to that build) under ``leaderboard/``, so one static site holds both and the docs' links into
  it are checked like any other. Its files are static files of the build; its Markdown twins
  (``*.md``, for reading on GitHub) are left out, or mkdocs would render them as pages.
- Formulas become MathML at build time (below); one that would show a raw TeX macro fails the build.
- A list that follows a line of text without a blank line between is a list (docstrings are written
  that way; Python-Markdown alone would run it into the paragraph).
"""

from __future__ import annotations

import html as html_module
import re
from pathlib import Path
from typing import Any

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

LEADERBOARD = Path(__file__).resolve().parent / "leaderboard_site"


def on_files(files: Files, config: Any) -> Files:
    if not (LEADERBOARD / "index.html").is_file():
        return files  # a checkout without the published results: the docs alone
    for path in sorted(LEADERBOARD.rglob("*")):
        if path.is_file() and path.suffix != ".md":
            uri = f"leaderboard/{path.relative_to(LEADERBOARD).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# ------------------------------------------------------------------ lists right after a line of text

LIST_ITEM = re.compile(r"^ {0,3}(?:[-*+]|\d+\.) +\S")


class ListsAfterText(Preprocessor):
    """Puts a blank line before a list that starts right under a line of text (outside a list):
    ``The contract:\n - a\n - b`` becomes a paragraph and a list. Fenced code is stashed before
    this runs (priority below pymdownx.superfences' and the HTML block stash)."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        in_list = False
        for line in lines:
            if LIST_ITEM.match(line):
                if out and out[-1].strip() and not in_list:
                    out.append("")
                in_list = True
            elif not line.strip():
                pass
            elif out and not out[-1].strip() and not line.startswith((" ", "\t")):
                in_list = False  # a paragraph after a blank line ends the list
            out.append(line)
        return out


class ListsAfterTextExtension(Extension):
    def extendMarkdown(self, md: Any) -> None:  # noqa: N802 - Python-Markdown's name
        md.preprocessors.register(ListsAfterText(md), "lists_after_text", 5)


@event_priority(100)  # before mkdocstrings' on_config, which hands the extensions to its handlers
def on_config(config: Any) -> Any:
    config.markdown_extensions.append(ListsAfterTextExtension())
    return config


# ------------------------------------------------------------------ formulas

# pymdownx.arithmatex (generic) wraps each formula as \( ... \) or \[ ... \]; the build turns it into
# MathML, which browsers render natively: no MathJax or KaTeX script, so the site works offline.
# A formula latex2mathml cannot read fails the build (strict), naming the page and the formula.
# latex2mathml passes a sized delimiter's macro through as text (``\Big\lVert`` gives
# ``<mo ...>\lVert</mo>``, which a browser shows as "\lVert"): those are mapped to their characters,
# and any macro still left in the MathML fails the build, naming the page and the formula.
DELIMITERS = {
    "\\lVert": "&#x02016;", "\\rVert": "&#x02016;", "\\Vert": "&#x02016;", "\\|": "&#x02016;",
    "\\lvert": "&#x0007C;", "\\rvert": "&#x0007C;", "\\vert": "&#x0007C;",
    "\\lfloor": "&#x0230A;", "\\rfloor": "&#x0230B;", "\\lceil": "&#x02308;", "\\rceil": "&#x02309;",
    "\\langle": "&#x027E8;", "\\rangle": "&#x027E9;", "\\{": "{", "\\}": "}",
}
SIZED = re.compile(r"(<mo\b[^>]*>)(" + "|".join(re.escape(k) for k in DELIMITERS) + r")(</mo>)")
RAW_MACRO = re.compile(r">[^<]*?(\\[A-Za-z]+|\\[|{}])[^<]*<")
FORMULA = re.compile(r'<(?P<tag>span|div) class="arithmatex">'
                     r'(?:\\\((?P<inline>.*?)\\\)|\\\[(?P<block>.*?)\\\])</(?P=tag)>',
                     re.S)


def on_page_content(html: str, page: Any, **_: Any) -> str:
    from latex2mathml.converter import convert

    def mathml(match: re.Match) -> str:
        block = match["block"] is not None
        tex = html_module.unescape(match["block"] if block else match["inline"]).strip()
        try:
            rendered = convert(tex, display="block" if block else "inline")
        except Exception as error:  # noqa: BLE001 - latex2mathml raises several kinds
            raise PluginError(f"{page.file.src_uri}: cannot render the formula {tex!r}: {error}") from error
        rendered = SIZED.sub(lambda m: m[1] + DELIMITERS[m[2]] + m[3], rendered)
        if raw := RAW_MACRO.search(rendered):
            raise PluginError(f"{page.file.src_uri}: the formula {tex!r} would show the TeX macro {raw[1]!r} "
                              "as text (latex2mathml does not know it there): write it another way")
        return f'<{match["tag"]} class="arithmatex">{rendered}</{match["tag"]}>'

    return FORMULA.sub(mathml, html)
