"""The docs hold to the code: the generated recipe reference is current, and every file,
name and test the docs point at exists."""

import re
from pathlib import Path

from tests.helpers import load_script

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _generator():
    return load_script("gen_recipe_docs")


def _pages() -> dict[str, str]:
    pages = {"README.md": (REPO / "README.md").read_text()}
    for path in sorted(DOCS.glob("*.md")):
        pages[f"docs/{path.name}"] = path.read_text()
    return pages


def _defines(source: str, name: str) -> bool:
    """``name`` is a top-level class, function or assignment, or ``Class.method``."""
    if "." in name:
        cls, method = name.split(".", 1)
        head = re.search(rf"^class {re.escape(cls)}\b", source, re.M)
        return (
            head is not None
            and re.search(rf"^\s+(async )?def {re.escape(method)}\b", source[head.start() :], re.M)
            is not None
        )
    return (
        re.search(rf"^(class|def|async def) {re.escape(name)}\b", source, re.M) is not None
        or re.search(rf"^{re.escape(name)}\s*(:[^=]*)?=", source, re.M) is not None
    )


def _test_exists(ref: str) -> bool:
    path, name = ref.split("::")
    file = REPO / path
    return file.is_file() and re.search(rf"^(async )?def {name}\(", file.read_text(), re.M)


def test_recipes_page_is_generated_from_the_schema():
    committed = (DOCS / "recipes.md").read_text()
    assert committed == _generator().render(), (
        "docs/recipes.md differs from runtime/config/schema.py's metadata: run `make docs`"
    )


def test_the_generator_lists_type_default_choices_and_doc():
    text = _generator().render()
    row = next(line for line in text.splitlines() if line.startswith("| `reflow.mode` "))
    assert "`str`" in row and "`reflow`" in row and "sync, one_step_off, async, reflow" in row
    assert "execution mode" in row
    row = next(line for line in text.splitlines() if line.startswith("| `reflow.tau` "))
    assert "> 0; <= 1" in row and "`0.5`" in row


def test_every_mechanism_row_names_a_real_file_symbol_and_test():
    text = (DOCS / "architecture.md").read_text()
    table = text.split("## Mechanisms", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 20
    problems = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4, row
        _, file_cell, names_cell, tests_cell = cells
        path = file_cell.strip("`")
        file = REPO / path
        if not file.is_file():
            problems.append(f"{path}: no such file")
            continue
        source = file.read_text()
        for name in re.findall(r"`([^`]+)`", names_cell):
            if not _defines(source, name):
                problems.append(f"{path}: defines no {name}")
        refs = re.findall(r"`([^`]+::[^`]+)`", tests_cell)
        if not refs:
            problems.append(f"{row[:60]}...: no test")
        problems += [f"{ref}: no such test" for ref in refs if not _test_exists(ref)]
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_every_test_and_repository_path_the_docs_name_exists():
    problems = []
    for page, text in _pages().items():
        for ref in set(re.findall(r"tests/[\w/]+\.py::\w+", text)):
            if not _test_exists(ref):
                problems.append(f"{page}: {ref}: no such test")
        paths = re.findall(
            r"`((?:runtime|tests|benchmarks|scripts|jobs|reflow_cli|recipes)/[\w./-]*)`", text
        )
        for path in set(paths):
            if not (REPO / path).exists():
                problems.append(f"{page}: {path}: no such file or folder")
    assert not problems, "\n".join(problems)


def test_the_docs_link_to_pages_that_exist():
    problems = []
    for page, text in _pages().items():
        base = REPO if page == "README.md" else DOCS
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
            if not (base / target).is_file():
                problems.append(f"{page}: link to {target}")
    assert not problems, "\n".join(problems)
