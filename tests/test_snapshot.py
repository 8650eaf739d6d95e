"""What the agent sees of every suite tool (name, title, description, input schema, annotations) is checked in as
tests/snapshots/tools.json: any change to it shows as a diff to review. `llm-infra-mcp docs --write` regenerates it
with README.md's generated sections."""

import json

from servers.docs import SNAPSHOT, tools_snapshot


def test_the_tools_snapshot_is_what_the_suite_serves() -> None:
    current = tools_snapshot()
    stored = SNAPSHOT.read_text()
    if current != stored:
        now = {t["name"]: t for t in json.loads(current)}
        then = {t["name"]: t for t in json.loads(stored)}
        changed = sorted(n for n in now.keys() & then.keys() if now[n] != then[n])
        raise AssertionError(
            f"tools/list changed: added {sorted(now.keys() - then.keys())}, removed "
            f"{sorted(then.keys() - now.keys())}, changed {changed}; review it and run `llm-infra-mcp docs --write`"
        )


def test_the_snapshot_has_every_tool_once_with_its_annotations() -> None:
    tools = json.loads(SNAPSHOT.read_text())
    names = [t["name"] for t in tools]
    assert names == sorted(set(names)) and len(names) >= 30
    assert all(t["description"] and t["inputSchema"]["type"] == "object" and "annotations" in t for t in tools)
