"""The documentation site builds strictly, its references come from the code, and no internal link is broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayft.cli.config_cmd import iter_fields
from rayft.config.schema import RayftConfig
from tests.support.docsite import broken_links, build_site

pytest.importorskip("mkdocs")
pytest.importorskip("material")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


def test_every_internal_link_resolves_to_a_built_file(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert broken_links(site) == []


def test_config_reference_lists_every_field(site: Path) -> None:
    page = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    paths = [path for path, *_ in iter_fields(RayftConfig)]
    assert len(paths) > 100
    missing = [p for p in paths if f"<code>{p}</code>" not in page]
    assert missing == []


def test_cli_reference_lists_every_command_and_option(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for heading in ("rayft train", "rayft config fields", "rayft k8s render", "rayft data prepare"):
        assert f"<code>{heading}</code>" in page
    assert "--resume" in page
    assert "--target" in page
