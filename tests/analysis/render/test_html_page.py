"""write_page: a page is written whole or not at all."""

from __future__ import annotations

import pytest

from analysis.render.html_page import write_page


def test_a_page_that_fails_half_way_leaves_the_old_page_and_no_partial_file(tmp_path):
    page = tmp_path / "page.html"
    write_page(page, "before", ["<p>first</p>"])
    old = page.read_bytes()
    with pytest.raises(TypeError):  # the second block is no text: the write fails after the head and first block
        write_page(page, "after", ["<p>second</p>", 3])  # type: ignore[list-item]
    assert page.read_bytes() == old
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    write_page(page, "after", ["<p>second</p>"])
    assert "<p>second</p>" in page.read_text(encoding="utf-8")
