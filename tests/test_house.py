"""The house's shape (ARCHITECTURE.md): no import circle between rooms, counting the imports made inside functions
(they are still dependencies, only late ones); the library never imports its command line; benchmarks import the
library, not the CLI or the tests."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "vocgraft"


def room_of(module: str) -> str:
    """``vocgraft.init.distill.snippets`` -> ``init``: a top-level module or package of vocgraft."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports, anywhere in it, with relative imports made absolute."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def room_arrows() -> dict[str, set[str]]:
    rooms = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    arrows: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = room_of(module)
        for target in imported_modules(path, package):
            if target.startswith("vocgraft.") and room_of(target) in rooms and room_of(target) != source:
                arrows.setdefault(source, set()).add(room_of(target))
    return arrows


def reachable(arrows: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in arrows.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_no_import_circle_between_rooms():
    arrows = room_arrows()
    circles = sorted({tuple(sorted((a, b))) for a in arrows for b in arrows[a] if a in reachable(arrows, b)})
    assert circles == [], f"rooms that import each other (directly or round a circle): {circles}"


def test_the_finder_sees_a_circle_when_there_is_one():
    arrows = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert {x for x in arrows if x in reachable(arrows, x)} == {"a", "b", "c"}
    assert imported_modules(Path(__file__), "tests") >= {"ast", "pathlib.Path"}


def test_only_the_top_floor_imports_the_command_line_and_the_pipeline():
    arrows = room_arrows()
    assert [room for room, targets in arrows.items() if "cli" in targets] == []
    below_pipeline = {room for room, targets in arrows.items() if "pipeline" in targets} - {"cli"}
    assert below_pipeline == set()


def test_benchmarks_import_the_library_not_the_cli_or_the_tests():
    offenders = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        modules = imported_modules(path, "benchmarks")
        if "vocgraft.cli" in modules or any(m == "tests" or m.startswith("tests.") for m in modules):
            offenders.append(path.name)
        elif "sys.path" in text and '"tests"' in text:
            offenders.append(path.name)
    assert offenders == []
