"""localize_network_fault's work is bounded before it is allocated (issue 21, defect 7).

Before: each ECMP-ambiguous probe put every spine its leaves share (and both links to it) on its path, so memory grew
with probes x shared spines (2 leaves x 1,024 spines, 12,000 probes: 4.1 GB and 69 s; 60,000 probes: more than
8 GB). Now an ambiguous probe is a member of three rows of an ECMP table (its pair of leaf groups, each end's leaf
and the other end's group), so the incidence is probes x path length plus the table; its size is worked out first
and a call over MAX_INCIDENCE entries is refused with the numbers before anything of that size exists. Peak memory
is measured in a subprocess (its peak resident set, VmHWM: the whole process, generous bounds); no timed assertions
here (the linear-time check is benchmarks/netloc_scale.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import servers.diagnostics.netloc as netloc
from servers.core.errors import InputError
from servers.diagnostics.netloc import (
    MAX_INCIDENCE,
    MAX_PROBES,
    PATH_COLUMNS,
    build_index,
    link_name,
    localize_network_fault,
)
from servers.diagnostics.netsim import make_scenario

REPO = Path(__file__).resolve().parents[1]

# The reproductions, run in a fresh interpreter so that its peak is this call's. Both print one JSON line.
PEAK = """
import resource, sys


def peak_mb():
    # This process's peak resident set. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child of a big
    # pytest process would report its parent's peak.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
"""

WIDE_ECMP = """
import json, sys
import numpy as np
from servers.diagnostics.netloc import localize_network_fault
n = int(sys.argv[1])
spines = [f"s{i}" for i in range(1024)]
topology = {
    "nodes": [{"name": f"n{i}", "nics": [{"name": f"n{i}-0", "rail": 0, "leaf": "A" if i < 32 else "B"}]}
              for i in range(64)],
    "switches": [{"name": "A", "tier": "leaf", "uplinks": spines}, {"name": "B", "tier": "leaf", "uplinks": spines}]
    + [{"name": s, "tier": "spine"} for s in spines],
}
rng = np.random.default_rng(0)
src, dst, noise = rng.integers(0, 32, n), rng.integers(32, 64, n), rng.random(n) < 0.03
rows = [
    {"src_nic": f"n{a}-0", "dst_nic": f"n{b}-0", "latency_us": 5.0, "loss_rate": 0.5 if a == 3 or e else 0.0}
    for a, b, e in zip(src.tolist(), dst.tolist(), noise.tolist())
]
result = localize_network_fault(topology, rows)
print(json.dumps({
    "input_mb": len(json.dumps(rows)) / 1e6,
    "rss_mb": peak_mb(),
    "faulty": [[s.kind, s.name] for s in result.suspects if s.faulty],
    "ambiguous": result.probes.ecmp_ambiguous,
}))
"""

# 128 leaves, each uplinked to all of 1,024 spines but its own: every leaf is its own group and any two share 1,022
# spines, so the ECMP table has ~1,022 entries per leaf pair and per (leaf, other leaf) the probes join.
DISTINCT_GROUPS = """
import json, sys
import numpy as np
from servers.core.errors import InputError
from servers.diagnostics.netloc import localize_network_fault
n, leaves = int(sys.argv[1]), int(sys.argv[2])
spines = [f"s{i}" for i in range(1024)]
topology = {
    "nodes": [{"name": f"n{i}", "nics": [{"name": f"n{i}-0", "rail": 0, "leaf": f"L{i}"}]} for i in range(leaves)],
    "switches": [{"name": f"L{i}", "tier": "leaf", "uplinks": spines[:i] + spines[i + 1:]} for i in range(leaves)]
    + [{"name": s, "tier": "spine"} for s in spines],
}
rng = np.random.default_rng(1)
src = rng.integers(0, leaves, n)
dst = (src + rng.integers(1, leaves, n)) % leaves
rows = [
    {"src_nic": f"n{a}-0", "dst_nic": f"n{b}-0", "latency_us": 5.0, "loss_rate": 0.0}
    for a, b in zip(src.tolist(), dst.tolist())
]
try:
    result = localize_network_fault(topology, rows)
    error = None
except InputError as exc:
    error = str(exc)
print(json.dumps({
    "rss_mb": peak_mb(),
    "error": error,
}))
"""


def in_subprocess(script: str, *args: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PEAK + script, *map(str, args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_wide_ecmp_probes_cost_their_path_not_their_spines() -> None:
    """The issue's case: 2 leaves x 1,024 shared spines, 64 single-NIC nodes, 60,000 cross-leaf probes without a
    spine (4.7 MB of rows; before: more than 8 GB). It completes, names the bad NIC and no spine, in well under the
    memory the rows x spines expansion needed for a fifth of the probes (4.1 GB)."""
    out = in_subprocess(WIDE_ECMP, 60_000)
    assert out["input_mb"] > 4 and out["ambiguous"] == 60_000
    assert out["rss_mb"] < 600, out
    assert out["faulty"] in ([["nic", "n3-0"]], [["node", "n3"]]), out  # one NIC per node: the two are one thing


@pytest.mark.timeout(120)
def test_an_ecmp_table_over_the_bound_is_refused_with_its_numbers_before_it_is_built() -> None:
    """128 leaf groups sharing 1,022 spines pairwise: 20,000 probes need ~23M table entries (the expansion: 61M
    entries, several GB). Refused with the numbers, at the memory of the rows and the topology."""
    out = in_subprocess(DISTINCT_GROUPS, 20_000, 128)
    error = out["error"]
    assert error is not None and "\n" not in error
    assert error.startswith("probes: 20,000 probes make ")
    for part in ("path entries", "per probe", "ECMP-ambiguous probe (20,000)", "ECMP table of", "up to 1,022)"):
        assert part in error, (part, error)
    assert f"accepted: at most {MAX_INCIDENCE:,} entries per call" in error
    assert out["rss_mb"] < 400, out


@pytest.mark.timeout(120)
def test_fewer_groups_under_the_bound_are_localized() -> None:
    """The same fabric with 32 leaves (a table of ~1.5M entries) is within the bound."""
    out = in_subprocess(DISTINCT_GROUPS, 20_000, 32)
    assert out["error"] is None and out["rss_mb"] < 500, out


def test_the_bound_is_checked_before_the_incidence_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = make_scenario(64, {"nic_down": 1}, seed=3, record_route=False)
    n = len(scenario.probes)
    routes = netloc._routes(build_index(scenario.fleet.topology), _probes(scenario), np.arange(n))
    monkeypatch.setattr(netloc, "MAX_INCIDENCE", routes.work - 1)

    def not_called(*_: Any) -> None:
        raise AssertionError("the incidence was built before the bound was checked")

    monkeypatch.setattr(netloc, "_incidence", not_called)
    with pytest.raises(InputError) as info:
        localize_network_fault(scenario.fleet.topology, scenario.probes)
    message = str(info.value)
    assert message.startswith(f"probes: {n:,} probes make {routes.work:,} path entries")
    assert f"{routes.exact:,} NIC, node, leaf and known spine and link entries" in message
    assert f"an ECMP table of {routes.table:,} entries ({routes.rows:,} rows" in message
    monkeypatch.undo()
    assert localize_network_fault(scenario.fleet.topology, scenario.probes).faulty_count == 1


def test_the_caps_are_consistent() -> None:
    """A probe holds at most PATH_COLUMNS entries (an ambiguous one: 6 exact + 3 table memberships), so the probe
    cap always fits the entry bound, with room left for the ECMP table; the docstring says both."""
    assert PATH_COLUMNS * MAX_PROBES < MAX_INCIDENCE
    doc = " ".join((netloc.__doc__ or "").split())
    assert f"{MAX_PROBES:,} probes" in doc and f"{MAX_INCIDENCE:,} path entries" in doc
    assert f"{MAX_INCIDENCE - PATH_COLUMNS * MAX_PROBES:,}" in doc


# ---- the factorised incidence is the expanded one ----------------------------------------------------------------

UPLINKS = {
    "L0": ["S0", "S1", "S2", "S3"],
    "L1": ["S3", "S2", "S1", "S0"],  # L0's group (the same set, listed in another order)
    "L2": ["S2", "S3", "S4"],  # shares two spines with L0 and L1
    "L3": ["S4", "S5"],  # shares one with L2: one path, as if named
    "L4": ["S5"],
    "L5": ["S0", "S1", "S5", "S4"],  # two with L0, one with L2, two with L3, one with L4
}


def _topology() -> dict[str, Any]:
    leaves = list(UPLINKS)
    nodes = [
        {
            "name": f"node{i}",
            "nics": [
                {"name": f"node{i}-nic0", "rail": 0, "leaf": leaves[i % 6]},
                {"name": f"node{i}-nic1", "rail": 1, "leaf": leaves[(i + 1) % 6]},
            ],
        }
        for i in range(9)
    ]
    switches = [{"name": leaf, "tier": "leaf", "uplinks": ups} for leaf, ups in UPLINKS.items()]
    return {"nodes": nodes, "switches": switches + [{"name": f"S{i}", "tier": "spine"} for i in range(6)]}


def _probes(scenario: Any) -> Any:
    idx = build_index(scenario.fleet.topology)
    return netloc._load_probes(idx, scenario.probes)


def _expanded(topology: dict[str, Any], rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """Each component's probes and weights, from the definitions (names only, none of netloc's structures)."""
    where = {nic["name"]: (node["name"], nic["leaf"]) for node in topology["nodes"] for nic in node["nics"]}
    out: dict[tuple[str, str], dict[int, float]] = {}
    for i, row in enumerate(rows):
        (na, la), (nb, lb) = where[row["src_nic"]], where[row["dst_nic"]]
        path = {("nic", row["src_nic"]): 1.0, ("nic", row["dst_nic"]): 1.0, ("node", na): 1.0, ("node", nb): 1.0}
        path |= {("leaf", la): 1.0, ("leaf", lb): 1.0}
        if la != lb:
            shared = sorted(set(UPLINKS[la]) & set(UPLINKS[lb]))
            spines = [row["spine"]] if row.get("spine") else shared
            for s in spines:
                w = 1.0 / len(spines)
                path |= {("spine", s): w, ("leaf_spine_link", link_name(la, s)): w}
                path[("leaf_spine_link", link_name(lb, s))] = w
        for key, w in path.items():
            out.setdefault(key, {})[i] = w
    return out


def test_the_ecmp_table_gives_every_component_the_probes_and_weights_of_the_expansion() -> None:
    topology = _topology()
    idx = build_index(topology)
    names = idx.nic_names
    rng = np.random.default_rng(5)
    rows = []
    for a in names:
        for b in names:
            la, lb = idx.nic_leaf[idx.nic_id[a]], idx.nic_leaf[idx.nic_id[b]]
            shared = idx.shared(int(la), int(lb)) if la != lb else ()
            if a == b or (la != lb and not shared):
                continue
            row: dict[str, Any] = {"src_nic": a, "dst_nic": b, "latency_us": 5.0, "loss_rate": 0.0}
            if shared and rng.random() < 0.3:
                row["spine"] = idx.spine_names[shared[int(rng.integers(len(shared)))]]
            rows.append(row)
    pr = netloc._load_probes(idx, rows)
    layer_rows = np.arange(len(rows))
    routes = netloc._routes(idx, pr, layer_rows)
    assert len(routes.amb_at) > 50 and routes.rows > 8  # the case is exercised
    inc = netloc._incidence(idx, layer_rows, routes)
    # What the bound counts is what was allocated.
    assert (len(inc.comp), len(inc.member), len(inc.row_comp)) == (routes.exact, 3 * len(routes.amb_at), routes.table)
    got: dict[tuple[str, str], dict[int, float]] = {}
    for cc in range(idx.n_components):
        kind, name, _ = idx.describe(cc)
        probes, weights = inc.through(cc)
        assert len(set(probes.tolist())) == len(probes)  # a component is on a probe's path once
        if len(probes):
            got[(kind, name)] = dict(zip(probes.tolist(), weights.tolist(), strict=True))
    want = _expanded(topology, rows)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key]), key


def test_ambiguous_spines_and_links_are_still_found_and_listed_as_alternatives() -> None:
    """A lossy link under ECMP (no spines in the rows): the link is named (or one of the links it cannot be told
    from, listed in ambiguous_with), as before the table replaced the expansion."""
    for seed in range(3):
        scenario = make_scenario(64, {"link_lossy": 1}, seed=seed, record_route=False)
        result = localize_network_fault(scenario.fleet.topology, scenario.probes)
        (truth,) = scenario.truth
        named = [s for s in result.suspects if s.faulty]
        assert len(named) == 1 and named[0].kind == truth[0], (seed, named)
        assert truth[1] in {named[0].name, *named[0].ambiguous_with}
        assert named[0].evidence.failed_ambiguous > 0 and named[0].evidence.failed == 0
