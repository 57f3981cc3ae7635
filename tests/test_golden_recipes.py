"""expand and replace save the same bytes as the golden run (tests/golden_recipes.json, made by
tests/golden_recipes.py): every init method in both modes, and the paths that differ (tied, full load, given
tokenizers, another target kind, combining marks). A refactor of the recipes must not change any of them (where
another CPU's kernels change the last bits, the numbers within a tolerance: golden_recipes.TOLERANCE)."""

from __future__ import annotations

import json

import pytest
from golden_recipes import GOLDEN, cases, differences, make_sources, numbers_close, run_case, small_fasttext

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
    assert differences(out, root, EXPECTED[name]) == []


def test_numbers_beyond_the_tolerance_are_a_difference():
    """The fallback for other CPUs' last bits still sees a change of one part in a thousand, and a changed count."""
    sums = EXPECTED["expand-mean"]["numbers"]["model.safetensors"]
    name = next(iter(sums))
    moved = {t: list(v) for t, v in sums.items()}
    moved[name][3] += 1e-3 * abs(moved[name][1])
    assert numbers_close("model.safetensors", sums, sums)
    assert not numbers_close("model.safetensors", moved, sums)
    manifest = EXPECTED["expand-mean"]["numbers"]["vocgraft.json"]
    changed = json.loads(json.dumps(manifest))
    changed["vocab_size"] += 1
    assert numbers_close("vocgraft.json", manifest, manifest)
    assert not numbers_close("vocgraft.json", changed, manifest)
