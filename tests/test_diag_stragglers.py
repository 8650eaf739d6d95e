"""Straggler detection (servers.diagnostics.stragglers): simulated step times with known slow ranks, the Greyhound
change-point rule, aggregation to nodes and parallel groups, the job's slowdown and where its time went, the builder
from a job's metrics and bad input. Real jobs slowed for real: tests/test_live_stragglers.py."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servers.core.errors import InputError
from servers.diagnostics import stragglers
from servers.diagnostics.stragglers import (
    VERDICTS,
    StragglerReport,
    detect_stragglers,
    detect_stragglers_in_metrics,
    load_rows,
    parse_rows_text,
    rows_from_metrics,
)


def simulate(
    ranks: int,
    steps: int,
    *,
    slow: dict[int, tuple[float, int, int | None]] | None = None,
    noise: float = 0.02,
    seed: int = 0,
    ranks_per_node: int | None = None,
    base: float = 1.0,
) -> list[dict[str, Any]]:
    """Rows for `ranks` x `steps` (steps 1..steps): each time base * (1 + gaussian noise), times factor for a slow
    rank from its first step to its last (None: to the end)."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        for rank in range(ranks):
            t = base * max(0.5, 1.0 + rng.gauss(0.0, noise))
            if slow and rank in slow:
                factor, first, last = slow[rank]
                if step >= first and (last is None or step <= last):
                    t *= factor
            row: dict[str, Any] = {"rank": rank, "step": step, "step_time_s": t}
            if ranks_per_node:
                row["node"] = f"n{rank // ranks_per_node}"
            rows.append(row)
    return rows


def verdict_of(report: StragglerReport, rank: int) -> str:
    for name in ("stragglers", "was_slow", "slowed"):
        if any(e.rank == rank for e in getattr(report, name)):
            return name
    if rank in report.not_enough_steps_ranks:
        return "not_enough_steps"
    return "ok"


def assert_counts_add_up(report: StragglerReport) -> None:
    assert set(report.counts) == set(VERDICTS)
    assert sum(report.counts.values()) == report.ranks


# ---------------------------------------------------------------------------------------------------------------------
# the slow rank is found, the others are not


def test_one_slow_rank_is_found_with_evidence_and_the_others_are_not() -> None:
    rows = simulate(16, 60, slow={5: (1.3, 20, None)}, ranks_per_node=8)
    report = detect_stragglers(rows)
    assert report.verdict == "stragglers"
    assert report.counts == {
        "straggler": 1,
        "likely_straggler": 0,
        "was_slow": 0,
        "slowed": 0,
        "ok": 15,
        "not_enough_steps": 0,
    }
    [item] = report.stragglers
    assert (item.rank, item.node, item.since_step, item.until_step) == (5, "n0", 20, 60)
    assert item.ratio == pytest.approx(1.3, abs=0.03)
    assert item.fleet_median_s == pytest.approx(1.0, abs=0.02)
    assert item.flagged_in_last_window == 10
    assert item.change_point is not None and item.change_point.since_step == 20 and item.change_point.ongoing
    assert item.change_point.ratio == pytest.approx(1.3, abs=0.04)
    assert item.attribution == "unknown" and item.action.startswith("Rebalance")  # only step times were given
    assert report.signal == "step_time_s" and report.stride == 1
    assert report.nodes_total == 2 and [n.node for n in report.nodes] == ["n0"] and not report.nodes[0].all_slow
    assert "rank 5 (n0) 1.29x its peers since step 20" in report.summary
    assert_counts_add_up(report)


def test_two_ranks_are_compared_leave_one_out() -> None:
    """Of two ranks, the median and MAD of both put each at z = +-0.67: each is compared with the other instead."""
    report = detect_stragglers(simulate(2, 30, slow={1: (2.0, 1, None)}, noise=0.01))
    assert [e.rank for e in report.stragglers] == [1]
    assert verdict_of(report, 0) == "ok"
    assert report.stragglers[0].ratio == pytest.approx(2.0, rel=0.05)
    assert any("leave-one-out" in line for line in report.method)


def test_two_ranks_that_differ_by_a_tenth_all_run_long_are_no_stragglers_but_a_quarter_is() -> None:
    """With one peer there is no spread between ranks to measure: a constant 10% gap between two clean ranks (what two
    cores of this machine gave) is under the small-group floor; a rank 25% slower is over it."""
    for seed in range(5):
        report = detect_stragglers(simulate(2, 60, slow={0: (1.10, 1, None)}, noise=0.01, seed=seed))
        assert report.counts["straggler"] == 0 and report.counts["likely_straggler"] == 0, report.summary
        report = detect_stragglers(simulate(2, 60, slow={0: (1.25, 1, None)}, noise=0.01, seed=seed))
        assert [e.rank for e in report.stragglers] == [0], report.summary
    assert any("fewer than 3 peers" in line for line in report.method)
    # with 12 ranks the peers' spread is measured and the small-group floor does not apply: 8% is found
    rows = [
        {"rank": r, "step": s, "step_time_s": 0.5 * (1.08 if r == 4 else 1.0)} for s in range(30) for r in range(12)
    ]
    report = detect_stragglers(rows)
    assert [e.rank for e in report.stragglers] == [4]
    assert not any("fewer than 3 peers" in line for line in report.method)


def test_identical_times_do_not_divide_by_zero_and_small_differences_are_not_stragglers() -> None:
    rows = [{"rank": r, "step": s, "step_time_s": 0.5} for s in range(30) for r in range(12)]
    report = detect_stragglers(rows)
    assert report.verdict == "no_stragglers" and report.counts["ok"] == 12
    rows = [
        {"rank": r, "step": s, "step_time_s": 0.5 * (1.03 if r == 4 else 1.0)} for s in range(30) for r in range(12)
    ]
    report = detect_stragglers(rows)
    assert report.counts["straggler"] == 0  # 3% is under min_slowdown (5%)
    rows = [
        {"rank": r, "step": s, "step_time_s": 0.5 * (1.08 if r == 4 else 1.0)} for s in range(30) for r in range(12)
    ]
    assert [e.rank for e in detect_stragglers(rows).stragglers] == [4]


def test_a_rank_that_recovered_was_slow_and_is_not_a_straggler() -> None:
    report = detect_stragglers(simulate(10, 60, slow={3: (1.5, 15, 35)}))
    assert report.counts["straggler"] == 0 and report.counts["was_slow"] == 1
    [item] = report.was_slow
    assert (item.rank, item.since_step, item.until_step) == (3, 15, 35)
    assert item.action.startswith("None now")
    assert report.verdict == "no_stragglers"


def test_not_enough_steps_claims_no_straggler() -> None:
    report = detect_stragglers(simulate(4, 6, slow={2: (3.0, 1, None)}))
    assert report.verdict == "not_enough_steps"
    assert report.counts == {
        "straggler": 0,
        "likely_straggler": 0,
        "was_slow": 0,
        "slowed": 0,
        "ok": 0,
        "not_enough_steps": 4,
    }
    assert report.not_enough_steps_ranks == [0, 1, 2, 3]
    assert "Not enough steps" in report.summary and "needs 10" in report.summary
    # with a smaller window the same rows suffice
    assert [
        e.rank
        for e in detect_stragglers(
            simulate(4, 6, slow={2: (3.0, 1, None)}), params={"window": 5, "min_flagged": 3}
        ).stragglers
    ] == [2]


def test_ranks_with_too_few_steps_are_set_apart() -> None:
    rows = simulate(6, 40, slow={1: (1.5, 1, None)})
    rows += [{"rank": 6, "step": s, "step_time_s": 5.0} for s in range(1, 5)]  # a rank that logged four steps
    report = detect_stragglers(rows)
    assert [e.rank for e in report.stragglers] == [1]
    assert report.not_enough_steps_ranks == [6]
    assert_counts_add_up(report)


# ---------------------------------------------------------------------------------------------------------------------
# change points (the Greyhound rule)


@pytest.mark.parametrize(
    ("factor", "length", "found"),
    [(1.25, 10, True), (1.25, 9, False), (1.15, 20, False), (1.6, 30, True)],
)
def test_change_point_needs_20_percent_for_10_iterations(factor: float, length: int, found: bool) -> None:
    """One rank alone (no peers): only its own baseline can tell."""
    rows = [
        {"rank": 0, "step": s, "step_time_s": 2.0 * (factor if 30 <= s < 30 + length else 1.0)} for s in range(1, 61)
    ]
    report = detect_stragglers(rows)
    assert report.counts["straggler"] == 0
    if found:
        [item] = report.slowed
        assert item.change_point is not None
        assert (item.change_point.since_step, item.change_point.until_step) == (30, 29 + length)
        assert item.change_point.iterations == length and item.change_point.baseline_s == 2.0
        assert not item.change_point.ongoing
    else:
        assert report.slowed == [] and report.counts["not_enough_steps"] == 1
    assert any("one rank only" in w for w in report.warnings)


def test_rows_every_k_steps_cover_k_iterations_each() -> None:
    """Metrics rows every 10 steps are averages over 10 iterations: two slow rows are 20 slow iterations."""
    rows = [{"rank": 0, "step": s, "step_time_s": 1.0 * (1.5 if s >= 150 else 1.0)} for s in range(10, 201, 10)]
    report = detect_stragglers(rows)
    assert report.stride == 10
    [item] = report.slowed
    assert item.change_point is not None
    assert item.change_point.since_step == 141 and item.change_point.iterations == 60 and item.change_point.ongoing


def test_a_fleet_wide_slowdown_is_not_a_straggler() -> None:
    rows = simulate(8, 60, noise=0.01)
    for row in rows:
        if row["step"] >= 30:
            row["step_time_s"] *= 1.5
    report = detect_stragglers(rows)
    assert report.counts["straggler"] == 0 and report.counts["slowed"] == 8
    assert report.fleet_change_point is not None and report.fleet_change_point.since_step == 30
    assert "The job as a whole slowed 1.50x from step 30" in report.summary
    assert any("fleet-wide change" in w for w in report.warnings)
    together = report.changed_together
    assert together is not None and together.ranks == list(range(8)) and together.ranks_total == 8
    assert (together.first_step, together.last_step, together.tolerance_iterations) == (30, 30, 10)
    assert any(
        "8 of 8 judged ranks slowed against their own baseline together (ranks 0-7" in w for w in report.warnings
    )
    assert all("together with the others" in e.action for e in report.slowed)


def synchronised(
    ranks: int, steps: int, *, work: dict[int, float], rest: float, from_step: int, seed: int = 0
) -> list[dict[str, Any]]:
    """Rows of a synchronised job: each rank's own work (compute_s) 0.05 s, times work[rank] from from_step; every
    rank's step is the slowest rank's work plus the rest of the step (0.05 s, times `rest` from from_step)."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        late = step >= from_step
        own = [0.05 * (work.get(r, 1.0) if late else 1.0) * (1 + rng.gauss(0, 0.01)) for r in range(ranks)]
        whole = max(own) + 0.05 * (rest if late else 1.0) * (1 + rng.gauss(0, 0.01))
        rows += [{"rank": r, "step": step, "step_time_s": whole, "compute_s": own[r]} for r in range(ranks)]
    return rows


def test_a_job_slowed_in_communication_is_told_from_one_slowed_in_compute_or_by_a_straggler() -> None:
    """The job's step time rises 1.5x from step 30 in three ways: the rest of the step (communication: a slow NIC
    under a synchronised all-reduce), every rank's own work, one rank's own work (the others wait for it)."""
    comm = detect_stragglers(synchronised(4, 60, work={}, rest=2.0, from_step=30))
    assert comm.verdict == "no_stragglers" and comm.job_slowdown is not None, comm.summary
    assert comm.job_slowdown.attribution == "communication" and comm.job_slowdown.change_point.since_step == 30
    assert comm.job_slowdown.own_work_ratio == pytest.approx(1.0, abs=0.05)
    assert comm.job_slowdown.rest_ratio == pytest.approx(2.0, rel=0.05)
    assert comm.job_slowdown.own_work_share is not None and comm.job_slowdown.own_work_share < 0.1
    assert "communication" in comm.summary and "run_network_probes" in comm.first_action

    compute = detect_stragglers(synchronised(4, 60, work=dict.fromkeys(range(4), 2.0), rest=1.0, from_step=30))
    assert compute.job_slowdown is not None and compute.job_slowdown.attribution == "compute", compute.summary
    assert compute.job_slowdown.own_work_share is not None and compute.job_slowdown.own_work_share > 0.9
    assert compute.counts["straggler"] == 0

    one = detect_stragglers(synchronised(4, 60, work={2: 2.0}, rest=1.0, from_step=30))
    assert [e.rank for e in one.stragglers] == [2] and one.job_slowdown is not None, one.summary
    assert one.job_slowdown.attribution == "stragglers" and "rank 2" in one.job_slowdown.action
    assert one.first_action == one.stragglers[0].action  # the straggler's action comes first

    steady = detect_stragglers(synchronised(4, 60, work={}, rest=1.0, from_step=30))
    assert steady.job_slowdown is None and steady.verdict == "no_stragglers"
    without_compute = [{k: v for k, v in r.items() if k != "compute_s"} for r in synchronised(
        4, 60, work={}, rest=2.0, from_step=30)]  # fmt: skip
    unknown = detect_stragglers(without_compute)
    assert unknown.job_slowdown is not None and unknown.job_slowdown.attribution == "unknown"


def pair_with_a_borderline_slow_rank() -> list[dict[str, Any]]:
    """Issue 22, defect 8, mirrored with a fixed seed: two ranks, a row every 10 steps (each an average of 10
    iterations, as tiny-gpt logs them), every row's own work noisy (8%); rank 0's work 1.8x from step 101, rank 1's
    1.4x from step 131. Before the fix: "No straggler among 2 ranks ... 2 of 2 judged ranks slowed against their own
    baseline together: a fleet-wide change", while rank 0 changed first (step 101, 1.93x its baseline; rank 1 at
    131, 1.43x) and was slower than its peer in 10 of 10 rows after step 100 (5 flagged beyond the noise, 6 needed)."""
    rng = random.Random(120)
    rows = []
    for step in range(10, 201, 10):
        for rank in (0, 1):
            work = 0.0065 * max(0.5, 1 + rng.gauss(0, 0.08))
            work *= 1.8 if rank == 0 and step >= 110 else 1.4 if rank == 1 and step >= 140 else 1.0
            rows.append({"rank": rank, "step": step, "step_time_s": work + 0.018, "compute_s": work})
    return rows


def test_a_borderline_slow_rank_that_changed_first_is_a_likely_straggler_not_a_fleet_wide_change() -> None:
    report = detect_stragglers(pair_with_a_borderline_slow_rank())
    assert report.verdict == "likely_stragglers" and not report.summary.startswith("No straggler")
    assert report.counts == {
        "straggler": 0,
        "likely_straggler": 1,
        "was_slow": 0,
        "slowed": 1,
        "ok": 0,
        "not_enough_steps": 0,
    }
    [item] = report.likely_stragglers
    change = item.change_point
    assert item.rank == 0 and change is not None and (change.since_step, item.since_step) == (101, 101)
    assert change.ratio == pytest.approx(1.93, abs=0.01) and change.ongoing
    assert (item.rows_since_change, item.rows_slower_since_change, item.next_change_step) == (10, 10, 131)
    assert item.flagged_in_last_window == 5  # beyond the peers' noise: 5 of 10, where a straggler needs 6
    assert item.ratio is not None and item.ratio > 1.3
    assert (
        "rank 0 1.36x its peers since its own change point at step 101 (1.93x its baseline; it came first: the next "
        "rank's at step 131), at least 5% slower than its peers in 10 of 10 rows since, but beyond their noise "
        "(z > 3.5) in 5 of its last 10 (6 needed for a straggler)" in report.summary
    )
    assert report.first_action == item.action and item.action.startswith("Likely straggler, not confirmed: rank 0")
    assert "compute-bound" in item.action
    [other] = report.slowed
    assert other.rank == 1 and other.change_point is not None and other.change_point.since_step == 131
    assert "not together with the others" in other.action
    assert report.changed_together is None
    assert not any("together" in w for w in report.warnings)
    assert any(w.startswith("two ranks: each one's only peer is the other") for w in report.warnings)
    assert_counts_add_up(report)


def test_a_rank_that_slowed_before_a_fleet_wide_change_is_named_apart_from_it() -> None:
    rows = simulate(8, 60, slow={3: (1.4, 15, None)}, noise=0.01)
    for row in rows:
        if row["step"] >= 40:
            row["step_time_s"] *= 1.3
    report = detect_stragglers(rows)
    assert [e.rank for e in report.stragglers] == [3]
    together = report.changed_together
    assert together is not None and together.ranks == [0, 1, 2, 4, 5, 6, 7] and together.first_step == 40
    [note] = [w for w in report.warnings if "fleet-wide change" in w]
    assert "7 of 8 judged ranks slowed" in note and "ranks 0-2, 4-7" in note
    assert note.endswith("apart from them: rank 3 from step 15")


def test_change_points_far_apart_are_not_a_change_together() -> None:
    """Three ranks slowing one after the other (30 steps apart) did not slow together; with the peers compared by
    ratio alone (z_threshold 100), each ends as slow as the others: none is a straggler, none a likely one."""
    rows = simulate(3, 100, noise=0.0)
    for row in rows:
        if row["step"] >= {0: 20, 1: 45, 2: 70}[row["rank"]]:
            row["step_time_s"] *= 1.5
    report = detect_stragglers(rows, params={"z_threshold": 100})
    assert report.counts["slowed"] == 3 and report.changed_together is None
    assert (
        "3 of 3 judged ranks slowed against their own baseline, but not together (no half of them within 10 "
        "iterations of each other): rank 0 from step 20, rank 1 from step 45, rank 2 from step 70" in report.warnings
    )
    assert not any("fleet-wide" in w for w in report.warnings)


# ---------------------------------------------------------------------------------------------------------------------
# aggregation and actions


def test_a_node_whose_ranks_are_all_slow_is_drained() -> None:
    rows = simulate(16, 40, slow={r: (1.4, 1, None) for r in (8, 9, 10, 11)}, ranks_per_node=4)
    report = detect_stragglers(rows)
    assert sorted(e.rank for e in report.stragglers) == [8, 9, 10, 11]
    [node] = report.nodes
    assert (node.node, node.all_slow, node.stragglers, node.ranks) == ("n2", True, 4, 4)
    assert report.first_action.startswith("Drain node n2: all its 4 ranks are slow")
    assert all(e.action == node.action for e in report.stragglers)


def test_compute_bound_and_communication_bound_are_told_apart() -> None:
    rng = random.Random(3)
    rows = []
    for step in range(40):
        for rank in range(12):
            compute = 0.6 * (1 + rng.gauss(0, 0.01)) * (1.6 if rank == 7 else 1.0)
            comm = 0.4 * (1 + rng.gauss(0, 0.01)) * (2.5 if rank == 3 else 1.0)
            rows.append(
                {"rank": rank, "step": step, "step_time_s": compute + comm, "compute_s": compute, "comm_s": comm}
            )
    report = detect_stragglers(rows, signal="step_time_s")
    by_rank = {e.rank: e for e in report.stragglers}
    assert sorted(by_rank) == [3, 7]
    assert by_rank[7].attribution == "compute" and by_rank[7].compute_ratio == pytest.approx(1.6, rel=0.05)
    assert by_rank[3].attribution == "communication" and by_rank[3].comm_ratio == pytest.approx(2.5, rel=0.05)
    assert "compute-bound" in by_rank[7].action and "communication-bound" in by_rank[3].action
    # auto compares the own work (compute_s) when every row has it: only the compute-bound rank stands out
    auto = detect_stragglers(rows)
    assert auto.signal == "compute_s" and [e.rank for e in auto.stragglers] == [7]


def test_layout_maps_ranks_to_groups_in_megatron_order() -> None:
    # tp=4, dp=2, pp=2, tp fastest: ranks 4..7 are the tp group (dp=1, pp=0)
    rows = simulate(16, 40, slow={r: (1.5, 1, None) for r in (4, 5, 6, 7)}, ranks_per_node=8)
    report = detect_stragglers(rows, layout={"tp": 4, "pp": 2, "dp": 2})
    assert report.layout is not None and report.layout.order == "tp-dp-pp"
    assert sorted(e.rank for e in report.stragglers) == [4, 5, 6, 7]
    assert next(e for e in report.stragglers if e.rank == 5).coordinates == {"tp": 1, "dp": 1, "pp": 0}
    tp = [g for g in report.groups if g.kind == "tp"]
    assert [(g.label, g.all_slow, g.stragglers) for g in tp] == [("tp group (dp=1, pp=0)", True, [4, 5, 6, 7])]
    assert "tensor-parallel" in report.stragglers[0].action
    dp = [g for g in report.groups if g.kind == "dp"]
    assert dp and not any(g.all_slow for g in dp)  # one slow rank in each (tp=i, pp=0) data-parallel pair
    # another order moves the same ranks elsewhere
    other = detect_stragglers(rows, layout={"tp": 4, "pp": 2, "order": "tp-pp-dp"})
    assert next(e for e in other.stragglers if e.rank == 5).coordinates == {"tp": 1, "dp": 0, "pp": 1}


def test_pipeline_stages_are_compared_within_the_stage_and_imbalance_is_reported() -> None:
    # pp=2 (tp=1, dp=8): stage 1 (ranks 8..15 in tp-dp-pp order) does 30% more work on every rank
    rows = simulate(16, 40, slow={r: (1.3, 1, None) for r in range(8, 16)})
    report = detect_stragglers(rows, layout={"pp": 2})
    assert report.counts["straggler"] == 0
    assert [s.imbalanced for s in report.stages] == [False, True]
    assert report.stages[1].ratio == pytest.approx(1.3 / 1.15, rel=0.05)  # against the job's median
    assert "rebalance layers" in report.stages[1].note
    rows = simulate(16, 40, slow={**{r: (1.3, 1, None) for r in range(8, 16)}, 12: (1.3 * 1.4, 1, None)})
    assert [e.rank for e in detect_stragglers(rows, layout={"pp": 2}).stragglers] == [12]


def test_listing_is_bounded_and_the_counts_still_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stragglers, "MAX_LISTED", 3)
    rows = simulate(100, 30, slow={r: (1.3 + r / 100, 1, None) for r in range(0, 100, 10)})
    report = detect_stragglers(rows)
    assert report.counts["straggler"] == 10
    assert len(report.stragglers) == 3 and report.stragglers_omitted == 7
    assert [e.rank for e in report.stragglers] == [90, 80, 70]  # the slowest first
    assert_counts_add_up(report)


# ---------------------------------------------------------------------------------------------------------------------
# property tests (seeded)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(
    ranks=st.integers(min_value=3, max_value=48),
    slow_rank=st.integers(min_value=0, max_value=47),
    factor=st.floats(min_value=1.25, max_value=3.0),
    noise=st.floats(min_value=0.0, max_value=0.03),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_property_the_slow_rank_and_only_it_is_found(
    ranks: int, slow_rank: int, factor: float, noise: float, seed: int
) -> None:
    slow_rank %= ranks
    report = detect_stragglers(simulate(ranks, 40, slow={slow_rank: (factor, 1, None)}, noise=noise, seed=seed))
    assert [e.rank for e in report.stragglers] == [slow_rank]
    assert report.counts["was_slow"] == 0
    assert_counts_add_up(report)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(
    ranks=st.integers(min_value=2, max_value=64),
    steps=st.integers(min_value=1, max_value=50),
    noise=st.floats(min_value=0.0, max_value=0.05),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_property_no_slow_rank_no_straggler(ranks: int, steps: int, noise: float, seed: int) -> None:
    report = detect_stragglers(simulate(ranks, steps, noise=noise, seed=seed))
    assert report.counts["straggler"] == 0
    assert_counts_add_up(report)
    if steps < 10:
        assert report.verdict == "not_enough_steps"


@settings(derandomize=True, max_examples=30, deadline=None)
@given(
    ranks=st.integers(min_value=2, max_value=12),
    first=st.integers(min_value=0, max_value=11),
    factor=st.floats(min_value=1.5, max_value=2.2),
    stride=st.sampled_from([1, 10]),
    onset=st.integers(min_value=0, max_value=4),
    gap=st.integers(min_value=0, max_value=10),
    later_share=st.floats(min_value=0.0, max_value=1.0),
    later_factor=st.floats(min_value=0.0, max_value=1.0),
    noise=st.floats(min_value=0.0, max_value=0.05),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_property_a_rank_that_changed_first_and_stays_slower_is_never_in_a_change_together(
    ranks: int,
    first: int,
    factor: float,
    stride: int,
    onset: int,
    gap: int,
    later_share: float,
    later_factor: float,
    noise: float,
    seed: int,
) -> None:
    """One rank slows first (by 1.5-2.2x); later, clearly (more than twice the coincidence tolerance), some or all of
    the others slow by less, so that the first stays at least 15% slower than any of them. Whatever the rest do, the
    first rank is reported (straggler or likely straggler) and never among the ranks that slowed together."""
    rng = random.Random(seed)
    first %= ranks
    rows_count = 40 if stride == 1 else 24
    onset_row = (12 + onset) if stride == 1 else (4 + onset)  # after the baseline rows
    tolerance_rows = max(10 // stride, 1)
    later_row = onset_row + 2 * tolerance_rows + 1 + gap
    others = [r for r in range(ranks) if r != first]
    later = set(rng.sample(others, round(later_share * len(others))))
    later_by = 1.2 + later_factor * (factor / 1.15 - 1.2)
    rows = []
    for row in range(1, rows_count + 1):
        for rank in range(ranks):
            t = max(0.5, 1.0 + rng.gauss(0.0, noise))
            if rank == first and row >= onset_row:
                t *= factor
            if rank in later and row >= later_row:
                t *= later_by
            rows.append({"rank": rank, "step": row * stride, "step_time_s": t})
    report = detect_stragglers(rows)
    reported = {e.rank for e in report.stragglers} | {e.rank for e in report.likely_stragglers}
    assert first in reported, report.summary
    assert report.changed_together is None or first not in report.changed_together.ranks
    assert not report.summary.startswith("No straggler")
    assert_counts_add_up(report)


# ---------------------------------------------------------------------------------------------------------------------
# inputs: metrics rows, pasted text, bad rows


def test_rows_from_a_jobs_metrics() -> None:
    rows = [
        {"step": 10, "split": "train", "loss": 3.0, "rank_work_s": [0.1, 0.3], "rank_step_s": [0.35, 0.36]},
        {"step": 20, "split": "train", "rank_work_s": [0.1, None], "rank_step_s": [0.35, 0.36]},
        {"step": 20, "split": "train", "rank_work_s": [0.11, 0.31], "rank_step_s": [0.36, 0.37]},  # resumed: kept
        {"step": 30, "split": "train", "rank_work_s": [0.1, 0.3], "rank_step_s": [0.35, None]},
        {"step": 30, "split": "eval", "loss": 2.0},
        {"step": 40, "split": "train", "loss": 2.5},
    ]
    out, warnings = rows_from_metrics(rows, ranks_per_node=1)
    assert out == [
        {"rank": 0, "step": 10, "step_time_s": 0.35, "compute_s": 0.1, "node": "node0"},
        {"rank": 1, "step": 10, "step_time_s": 0.36, "compute_s": 0.3, "node": "node1"},
        {"rank": 0, "step": 20, "step_time_s": 0.36, "compute_s": 0.11, "node": "node0"},
        {"rank": 1, "step": 20, "step_time_s": 0.37, "compute_s": 0.31, "node": "node1"},
        {"rank": 0, "step": 30, "step_time_s": 0.35, "compute_s": 0.1, "node": "node0"},
    ]
    assert any("logged more than once" in w for w in warnings)
    assert any("1 rank time(s) were null" in w for w in warnings)
    with pytest.raises(InputError, match="no per-rank step times"):
        rows_from_metrics([{"step": 1, "split": "train", "loss": 1.0}])


def test_metrics_rows_are_judged_on_the_own_work() -> None:
    rows = []
    for step in range(10, 310, 10):
        work = [0.1, 0.1, 0.1, 0.1 * (3 if step >= 100 else 1)]
        rows.append({"step": step, "split": "train", "rank_work_s": work, "rank_step_s": [max(work) + 0.05] * 4})
    report = detect_stragglers_in_metrics(rows, ranks_per_node=4)
    assert report.signal == "compute_s" and report.stride == 10
    [item] = report.stragglers
    assert (item.rank, item.node, item.attribution, item.since_step) == (3, "node0", "compute", 91)
    assert item.change_point is not None and item.change_point.since_step == 91
    synchronised = detect_stragglers_in_metrics(rows, signal="step_time_s")
    assert synchronised.counts["straggler"] == 0  # DDP: every rank waits for the slowest
    assert any("step times are nearly equal on every rank" in w for w in synchronised.warnings)


@pytest.mark.parametrize(
    "text",
    [
        '[{"rank": 0, "step": 1, "step_time_s": 0.5}, {"rank": 1, "step": 1, "step_time_s": 0.6, "node": "a"}]',
        '{"rank": 0, "step": 1, "step_time_s": 0.5}\n\n{"rank": 1, "step": 1, "step_time_s": 0.6, "node": "a"}\n',
        "rank,step,step_time_s,node\n0,1,0.5,\n1,1,0.6,a\n",
    ],
)
def test_pasted_rows_as_json_jsonl_or_csv(text: str) -> None:
    assert parse_rows_text(text) == [
        {"rank": 0, "step": 1, "step_time_s": 0.5},
        {"rank": 1, "step": 1, "step_time_s": 0.6, "node": "a"},
    ]


def test_load_rows_reads_a_metrics_file_or_pasted_rows() -> None:
    text = '{"step": 10, "time": 1.0, "split": "train", "rank_work_s": [0.1, 0.2], "rank_step_s": [0.3, 0.3]}\n'
    rows, warnings = load_rows(text, ranks_per_node=2)
    assert rows == [
        {"rank": 0, "step": 10, "step_time_s": 0.3, "compute_s": 0.1, "node": "node0"},
        {"rank": 1, "step": 10, "step_time_s": 0.3, "compute_s": 0.2, "node": "node0"},
    ]
    assert warnings == []
    assert load_rows("rank,step,step_time_s\n0,1,0.5\n") == ([{"rank": 0, "step": 1, "step_time_s": 0.5}], [])
    with pytest.raises(InputError, match="ranks_per_node applies to a job's metrics"):
        load_rows("rank,step,step_time_s\n0,1,0.5\n", ranks_per_node=8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("[1, 2", "not valid JSON"),
        ("{}\nnot json", "line 2 is not a JSON object"),
        ("rank,step,time\n0,1,2\n", "must name rank, step and step_time_s"),
        ("rank,step,step_time_s\n0,1\n", "CSV line 2 has 2 cells"),
    ],
)
def test_bad_pasted_text(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_rows_text(text)


GOOD = {"rank": 0, "step": 1, "step_time_s": 0.5}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"rank": 1, "step": 1, "step_time_s": math.nan}, r"rows\[1\]\.step_time_s: got nan \(not a finite number\)"),
        ({"rank": 1, "step": 1, "step_time_s": -0.2}, r"rows\[1\]\.step_time_s: got -0.2 \(negative\)"),
        ({"rank": 1, "step": 1, "step_time_s": 0}, r"rows\[1\]\.step_time_s: got 0 \(zero\)"),
        ({"rank": 1, "step": 1, "step_time_s": "0.5"}, r'rows\[1\]\.step_time_s: got "0.5" \(a string\)'),
        ({"rank": 1, "step": 1, "step_time_s": 1e9}, r"too large: seconds, not milliseconds"),
        ({"rank": 1, "step": 1, "step_time_s": 0.5, "compute_s": -1}, r"rows\[1\]\.compute_s: got -1 \(negative\)"),
        ({"rank": 1, "step": 1, "step_time_s": 0.5, "comm_s": math.inf}, r"rows\[1\]\.comm_s: got inf"),
        (dict(GOOD), r"rows\[1\]: duplicate \(rank 0, step 1\), first at rows\[0\]"),
        ({"rank": 1, "step_time_s": 0.5}, r"rows\[1\]\.step: required field missing; accepted: an object"),
        ({"rank": 1, "step": 1, "time_s": 0.5}, r"rows\[1\]\.time_s: unknown field; accepted: rank, step, step_time_s"),
        ({"rank": True, "step": 1, "step_time_s": 0.5}, r"rows\[1\]\.rank: got true \(a boolean\)"),
        ({"rank": -1, "step": 1, "step_time_s": 0.5}, r"rows\[1\]\.rank: got -1 \(an integer\); accepted: an integer"),
        ({"rank": 1, "step": 1.5, "step_time_s": 0.5}, r"rows\[1\]\.step: got 1.5 \(a number\)"),
        ({"rank": 0, "step": 2, "step_time_s": 0.5, "node": "b"}, r"rank 0 is on 'a' in an earlier row, here on 'b'"),
        ({"rank": 1, "step": 1, "step_time_s": 0.5, "node": ""}, r"rows\[1\]\.node: got"),
        ([1, 2], r"rows\[1\]: got \[1, 2\] \(a list\); accepted: an object"),
    ],
)
def test_bad_rows_say_what_is_accepted(bad: Any, message: str) -> None:
    first = {**GOOD, "node": "a"} if isinstance(bad, dict) and bad.get("node") == "b" else GOOD
    with pytest.raises(InputError, match=message):
        detect_stragglers([first, bad])


def test_many_bad_rows_are_named_up_to_a_limit() -> None:
    rows = [{"rank": i, "step": 0, "step_time_s": -1.0} for i in range(50)]
    with pytest.raises(InputError) as caught:
        detect_stragglers(rows)
    text = str(caught.value)
    assert text.count("(negative)") == stragglers.MAX_PROBLEMS and "stopped after 10 problems" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": {"window": 2}}, r"params: window: input should be greater than or equal to 3 \(got 2\); accepted"),
        ({"params": {"window": 5, "min_flagged": 6}}, "min_flagged \\(6\\) must be at most window \\(5\\)"),
        ({"params": {"z": 3}}, r"params: z: unknown argument; accepted: z_threshold, min_slowdown"),
        ({"layout": {"tp": 3}}, "layout: tp=3 x pp=1 x dp=1 does not match the rows' 4 ranks"),
        ({"layout": {"tp": 2, "order": "tp-dp"}}, "must name tp, dp and pp once each"),
        ({"signal": "compute_s"}, "compute_s was asked for but 4 of 4 rows have no compute_s"),
        ({"signal": "fast"}, 'signal: got "fast"'),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        detect_stragglers([{"rank": r, "step": 0, "step_time_s": 1.0} for r in range(4)], **kwargs)


def test_input_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="the list is empty"):
        detect_stragglers([])
    with pytest.raises(InputError, match="accepted: a list of rows"):
        detect_stragglers("rank,step")  # type: ignore[arg-type]
    monkeypatch.setattr(stragglers, "MAX_ROWS", 10)
    with pytest.raises(InputError, match="11 rows; at most 10 are accepted"):
        detect_stragglers([{"rank": r, "step": 0, "step_time_s": 1.0} for r in range(11)])
    monkeypatch.setattr(stragglers, "MAX_CELLS", 20)
    rows = [{"rank": r, "step": r, "step_time_s": 1.0} for r in range(5)]  # 5 steps x 5 ranks
    with pytest.raises(InputError, match="5 distinct steps x 5 ranks = 25 cells; at most 20"):
        detect_stragglers(rows)


def test_the_report_refuses_counts_that_do_not_add_up() -> None:
    report = detect_stragglers(simulate(4, 20, slow={1: (2.0, 1, None)}))
    data = report.model_dump()
    data["counts"]["ok"] += 1
    with pytest.raises(ValueError, match="do not add up"):
        StragglerReport.model_validate(data)
