"""The shape of the code that docs/ARCHITECTURE.md promises: no function over 150 lines in servers/, and the
README's layout naming every module of servers/ (and nothing that is not there)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVERS = REPO / "servers"
MAX_FUNCTION_LINES = 150


def long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_servers_is_over_150_lines() -> None:
    assert long_functions(SERVERS, MAX_FUNCTION_LINES) == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert [line.split(" ")[1] for line in long_functions(tmp_path, MAX_FUNCTION_LINES)] == ["long"]


def layout_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_the_readme_layout_names_every_module_and_only_modules_that_exist() -> None:
    block = layout_block()
    rows: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"(servers/[a-z_]+/)\s", line)
        if head:
            current = head.group(1)
        elif not line.startswith(" "):
            current = None
        if current is not None:
            rows.setdefault(current, []).append(line)
    packages = sorted(f"servers/{p.name}/" for p in SERVERS.iterdir() if (p / "__init__.py").exists())
    assert sorted(rows) == packages, "every package of servers/ has its row in the README's layout"
    missing, absent = [], []
    for package, lines in rows.items():
        text = " ".join(lines)
        folder = REPO / package
        named = set(re.findall(r"(?<![\w/.])([a-z_0-9]+\.py)\b", text))
        subfolders = {m for m in re.findall(r"\b([a-z_]+)/ \(", text)}
        for path in folder.rglob("*.py"):
            if path.name in ("__init__.py", "__main__.py") or "__pycache__" in path.parts:
                continue
            if path.name not in named:
                missing.append(str(path.relative_to(REPO)))
        for name in named:
            if not any(folder.rglob(name)):
                absent.append(f"{package}{name}")
        for sub in subfolders:
            if not (folder / sub).is_dir():
                absent.append(f"{package}{sub}/")
    for top in re.findall(r"servers/([a-z_]+\.py)", block):
        if not (SERVERS / top).exists():
            absent.append(f"servers/{top}")
    tops = {p.name for p in SERVERS.glob("*.py") if p.name != "__init__.py"}
    missing += sorted(f"servers/{t}" for t in tops if f"servers/{t}" not in block)
    assert missing == [], "modules the README's layout does not name"
    assert absent == [], "names in the README's layout that are not in the tree"
