"""mkdocs hooks. The published site carries the leaderboard (the committed ``leaderboard_site``,
built from the exported results) under ``leaderboard/``, so one static site holds both and the
docs' links into it are checked like any other. Its files are static files of the build; its
Markdown twins (``*.md``, for reading on GitHub) are left out, or mkdocs would render them as pages."""

from __future__ import annotations

import html as html_module
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

LEADERBOARD = Path(__file__).resolve().parents[1] / "leaderboard_site"


def on_files(files: Files, config: Any) -> Files:
    if not (LEADERBOARD / "index.html").is_file():
        return files  # a checkout without the published results: the docs alone
    for path in sorted(LEADERBOARD.rglob("*")):
        if path.is_file() and path.suffix != ".md":
            uri = f"leaderboard/{path.relative_to(LEADERBOARD).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# pymdownx.arithmatex (generic) wraps each formula as \( ... \) or \[ ... \]; the build turns it into
# MathML, which browsers render natively: no MathJax or KaTeX script, so the site works offline.
# A formula latex2mathml cannot read fails the build (strict), naming the page and the formula.
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
        return f'<{match["tag"]} class="arithmatex">{rendered}</{match["tag"]}>'

    return FORMULA.sub(mathml, html)
