"""expand and replace save the same bytes as the golden run (tests/golden_recipes.json, made by
tests/golden_recipes.py): every init method in both modes, and the paths that differ (tied, full load, given
tokenizers, another target kind, combining marks). A refactor of the recipes must not change any of them."""

from __future__ import annotations

import json

import pytest
from golden_recipes import GOLDEN, cases, fingerprint, make_sources, run_case, small_fasttext

EXPECTED = json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden").resolve()
    with small_fasttext():
        yield root, make_sources(root)


def test_the_golden_file_has_every_case():
    assert sorted(EXPECTED) == sorted(cases())


@pytest.mark.parametrize("name", sorted(cases()))
def test_recipe_output_is_the_golden_one(world, name):
    root, sources = world
    out = run_case(root, sources, name, cases()[name])
    assert fingerprint(out, root) == EXPECTED[name]
