"""README and docs/: every relative link and anchor resolves, and the README speaks about the product, not the work
history (that lives in git log)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (not - or _), spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            s = slug(m.group(1))
            out.add(s if seen[s] == 0 else f"{s}-{seen[s]}")
            seen[s] += 1
    return out


def test_slug_matches_github() -> None:
    assert slug("### `engine.max_batch_size`".lstrip("# ")) == "enginemax_batch_size"
    assert slug("Converters (`builders/convert/`)") == "converters-buildersconvert"
    assert slug("Five minutes with `make demo`") == "five-minutes-with-make-demo"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_readme_has_no_work_history() -> None:
    text = (ROOT / "README.md").read_text()
    for pattern in (r"\b(first|second|third|fourth|fifth|previous|earlier|this) session\b", r"\bissue \d+",
                    r"\bbefore/after\b", r"\bbefore (that|this) work\b"):
        hits = re.findall(pattern, text, flags=re.I)
        assert not hits, f"README.md mentions work history ({pattern}): move it to git log / issue notes"


def test_readme_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md does not link {missing}"


def test_pages_name_only_the_pinned_images() -> None:
    """Commands users copy from the README and the guides must name the images the project records: the pinned one
    (engine flow) and the current line's base and image."""
    from builders import versions

    current_base = versions.CURRENT_TRITON_BASE.rsplit(":", 1)[1].split("-")[0]
    for page in PAGES:
        text = page.read_text()
        for tag in re.findall(r"tritonserver:(\d\d\.\d\d)", text):
            assert tag in (versions.TRITON_RELEASE, current_base), f"{page.relative_to(ROOT)} names tritonserver:{tag}"
        for image in re.findall(r"eagle-deploy:[\w.-]*[\w]", text):
            assert image in (versions.GPU_IMAGE, versions.CPU_IMAGE, versions.CURRENT_GPU_IMAGE), \
                f"{page.relative_to(ROOT)} names {image}"
