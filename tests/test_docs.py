"""README.md, docs/ and docker/README.md: every relative link and #anchor resolves, every source path and module named exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:gateway|workers|shared|integrations|examples|tests|docker|observability|\.ci)/[\w./-]*)")
MODULE = re.compile(r"python -m ((?:tests|poolgate)\.[\w.]+)")
TOP = {"poolgate.gateway": "gateway", "poolgate.workers": "workers", "poolgate.shared": "shared",
       "poolgate.integrations": "integrations"}


def prose(text: str) -> str:
    """The text outside fenced code blocks (links and inline paths are read from prose only)."""
    return "".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_pages_exist():
    names = {p.name for p in PAGES}
    for name in ("cli.md", "openai.md", "cohere.md", "vllm.md", "invocations.md", "models.md",
                 "operations.md", "how-it-works.md", "testing.md"):
        assert name in names


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    assert not broken_links(page), f"{page.name}: links that do not resolve: {broken_links(page)}"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## A section: `x`\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-section-x) [self](#top) [gone](c.md) [bad](b.md#nope) [web](https://x.org)\n"
                    "# Top\n```\n[in code](d.md)\n```\n", encoding="utf-8")
    assert broken_links(page) == ["c.md", "b.md#nope"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_named_paths_and_modules_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = [p for p in CODE_PATH.findall(prose(text)) if not (ROOT / p).exists()]
    for module in MODULE.findall(text):
        parts = module.split(".")
        top = ".".join(parts[:2])
        base = ROOT / TOP[top] / "/".join(parts[2:]) if top in TOP else ROOT / "/".join(parts)
        if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
            missing.append(module)
    assert not missing, f"{page.name} names paths or modules that do not exist: {missing}"


def test_slug_matches_github():
    assert slug("Scoring and reranking: `/score`, `/rerank`") == "scoring-and-reranking-score-rerank"
    assert slug("The config file: `poolgate serve --config FILE`") == "the-config-file-poolgate-serve---config-file"
