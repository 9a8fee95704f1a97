"""The documentation tells the truth: a current config reference, links that resolve, a true map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdc_pipeline.config import TableConfig
from cdc_pipeline.schedules import PRESETS
from cdc_tools import config_reference

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("cdc_pipeline", "cdc_airflow", "spark_jobs", "cdc_tools")
# [text](target) and ![alt](target); the target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")


def prose(text: str) -> str:
    """The Markdown without fenced code blocks and code spans (their brackets are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as -."""
    found: set[str] = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, count = slug, 1
        while anchor in found:
            anchor, count = f"{slug}-{count}", count + 1
        found.add(anchor)
    return found


def section(page: Path, heading: str) -> str:
    """The text of one `## heading` section of a page."""
    text = page.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_config_reference_is_generated_from_the_current_model() -> None:
    committed = (ROOT / config_reference.DOC_PATH).read_text()
    assert committed == config_reference.render(), (
        "docs/config.md is stale: run `python -m cdc_tools.config_reference --write`"
    )


def test_config_reference_lists_every_field_with_a_description() -> None:
    page = config_reference.render()
    for name, info in TableConfig.model_fields.items():
        assert info.description, f"{name} has no Field(description=...)"
        assert f"| `{name}` |" in page


def test_schedule_description_names_every_preset() -> None:
    description = TableConfig.model_fields["schedule"].description or ""
    assert [preset for preset in PRESETS if preset not in description] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_an_existing_file_and_anchor(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {linked.name}")
    assert broken == []


def test_readme_code_map_names_every_module_and_only_modules_that_exist() -> None:
    code_map = section(ROOT / "README.md", "Code map")
    named = set(re.findall(r"`([a-z_0-9]+\.py)`", code_map)) - {"__init__.py"}
    files = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    modules = {path.name for path in files if path.name != "__init__.py"}
    assert sorted(modules - named) == [], "modules missing from the README's code map"
    assert sorted(named - modules) == [], "the README's code map names modules that do not exist"
    for folder in {path.parent.relative_to(ROOT) for path in files}:
        shown = f"`{folder.as_posix()}/`" if len(folder.parts) == 1 else f"`{folder.name}/`"
        assert shown in code_map, f"the README's code map does not name the package {folder}"


def test_readme_cli_lists_exactly_the_commands_of_cdc_help() -> None:
    from cdc_tools.cli import build_parser

    usage = build_parser().format_usage()  # `usage: cdc ... {validate,stage,...} ...`
    shown = re.search(r"\{([a-z,-]+)\}", usage)
    assert shown is not None
    block = section(ROOT / "README.md", "CLI").split("```")[1]
    listed = re.findall(r"^cdc ([a-z-]+)", block, flags=re.MULTILINE)
    assert sorted(listed) == sorted(shown.group(1).split(","))
