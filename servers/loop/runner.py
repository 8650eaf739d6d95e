"""The study, step by step, over the suite's tools: node check, overlap, the RL scaling study (pilot, round 1, the
held-out check, fits, comparison, decision, an optional follow-up round), then the report.

Every result that decides something comes from a tool; study.py turns those results into decisions. A tool that
fails (a job that fails or is killed, a fit that is refused) is recorded in the report and the study goes on with
what is left. The study is resumable: sweeps are planned from the same spec on a rerun (so the suite gives them the
same sweep id) and submit_sweep of a submitted sweep starts nothing; the overlap job, which has no key, is found
again through the study's ledger (ledger.json in the output folder).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servers.loop import study
from servers.loop.client import SuiteClient, ToolCallError, connect
from servers.loop.study import StudyConfig, StudyError, Variant

CPU_METHODS = ["sequential", "chunked", "ring"]  # symm_mem needs NVLink GPUs
OVERLAP_CHUNKS = [2, 4]
OVERLAP_TIMEOUT_S = 900.0
PREDICT_GPU_DEFAULT = "H100-SXM"  # the preset's usual target when no GPU is here
NEXT_COMPUTE_FACTOR = 10.0  # "what next": predict the chosen variant at this many times the study's largest compute


class Ledger:
    """The study's own record of what it started (ledger.json): which sweep or job answered which request."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"study": name, "entries": {}}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise StudyError(f"{path} cannot be read ({exc}); remove it or choose another --out") from exc
            if data.get("study") != name:
                raise StudyError(
                    f"{path.parent} holds the study {data.get('study')!r}, not {name!r}: choose another --out, or "
                    f"--name {data.get('study')} to resume it"
                )
            self.data = data

    def get(self, key: str, identity: Any) -> str | None:
        entry = self.data["entries"].get(key)
        return entry["id"] if entry and entry.get("identity") == identity else None

    def put(self, key: str, identity: Any, ident: str) -> None:
        self.data["entries"][key] = {"identity": identity, "id": ident}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def trim_fit(fit: dict[str, Any]) -> dict[str, Any]:
    """A fit report without its long list of excluded points (their count stays)."""
    return {k: v for k, v in fit.items() if k != "excluded"}


class StudyRun:
    def __init__(self, cfg: StudyConfig, client: SuiteClient, ledger: Ledger, say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.c = client
        self.ledger = ledger
        self.say = say
        self.errors: list[dict[str, Any]] = []
        self.images: dict[str, bytes] = {}
        self.job_ids: list[str] = []
        self.reused: set[str] = set()
        self.data: dict[str, Any] = {
            "study": cfg.name,
            "config": {
                **{k: v for k, v in asdict(cfg).items() if k not in ("out", "variants")},
                "out": str(cfg.out),
                "variants": [{"name": v.name, "args": list(v.args)} for v in cfg.variants],
            },
        }
        self.gpu_count = 0
        self.gpu_name: str | None = None
        self.recipe: dict[str, Any] | None = None
        self.pending_chart: tuple[list[dict[str, Any]], str, str] | None = None

    # ---- helpers ---------------------------------------------------------------------------------------------
    async def try_call(self, where: str, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await self.c.call(tool, args)
        except ToolCallError as exc:
            self.error(where, exc.message, tool=tool)
            return None

    def error(self, where: str, message: str, *, tool: str | None = None) -> None:
        self.errors.append({"where": where, "tool": tool, "message": message})
        first = message.strip().splitlines()[0] if message.strip() else message
        self.say(f"   ! {where}: {tool + ' failed: ' if tool else ''}{first}")

    def track(self, job_id: str, reused: bool = False) -> None:
        if job_id not in self.job_ids:
            self.job_ids.append(job_id)
        if reused:
            self.reused.add(job_id)

    # ---- 0. what the suite offers --------------------------------------------------------------------------
    async def prepare(self) -> None:
        info = self.c.client.server_info
        self.data["server"] = {"name": info.name, "version": info.version} if info else None
        self.say(f"== suite: {info.name} {info.version}" if info else "== suite (no server info)")
        recipes = await self.c.call("list_recipes", {})
        self.recipe = next((r for r in recipes["recipes"] if r["name"] == study.RECIPE), None)
        if self.recipe is None:
            raise StudyError(
                f"the suite has no {study.RECIPE} recipe (list_recipes: {[r['name'] for r in recipes['recipes']]})"
            )
        problems = study.check_variants(self.cfg.variants, self.recipe["arguments"])
        if problems:
            raise StudyError("--variants: " + "; ".join(problems))
        backends = await self.c.call("list_backends", {})
        chosen = next((b for b in backends["backends"] if b["name"] == self.cfg.backend), None)
        if chosen is None or not chosen["detected"] or not chosen["launch_supported"]:
            detail = chosen["detail"] if chosen else "not offered by this suite"
            raise StudyError(f"--backend {self.cfg.backend}: not usable here: {detail}")
        self.data["backend"] = chosen

    # ---- 1. the node -------------------------------------------------------------------------------------------
    async def node_check(self) -> None:
        self.say("== node check")
        health = await self.try_call("node", "gpu_health", {})
        kernel, kernel_error = None, None
        for source in ("dmesg", "journal"):
            try:
                kernel = await self.c.call("scan_kernel_log", {"source": source})
                kernel_source = source
                break
            except ToolCallError as exc:
                kernel_error = f"{source}: {exc.message.strip().splitlines()[0]}"
        else:
            kernel_source = None
        if health and health.get("available"):
            self.gpu_count = int(health.get("gpu_count") or 0)
            names = [(g.get("gpu") or {}).get("name") for g in health.get("gpus") or []]
            self.gpu_name = next((n for n in names if n), None)
        verdict = study.node_verdict(health, kernel, kernel_error)
        self.data["node"] = {
            "health": health,
            "kernel_log": None
            if kernel is None
            else {**kernel, "source": kernel_source, "events": kernel.get("events", [])[:20]},
            "kernel_log_error": kernel_error if kernel is None else None,
            "gpu_count": self.gpu_count,
            "verdict": verdict,
        }
        self.say(f"   {verdict}")

    # ---- 2. overlap ----------------------------------------------------------------------------------------
    async def overlap(self) -> None:
        cfg = self.cfg
        self.say(f"== overlap: {cfg.preset} at TP={cfg.tp}")
        section: dict[str, Any] = {"preset": cfg.preset, "tp": cfg.tp}
        self.data["overlap"] = section
        presets = await self.try_call("overlap", "list_shape_presets", {"name": cfg.preset, "world_size": cfg.tp})
        if presets is None:
            return
        layers = presets["presets"][0]["layers"]
        if cfg.overlap_layers:
            wanted = [x for x in layers if x["layer"] in cfg.overlap_layers]
            if not wanted:
                self.error("overlap", f"the preset has none of the layers {cfg.overlap_layers}")
                return
            layers = wanted
        section["tokens"] = presets["presets"][0]["tokens"]
        section["source"] = presets["presets"][0].get("source")
        # Predictions: for the GPU here when the catalog has it, else for the preset's usual target.
        gpu = self.gpu_name or PREDICT_GPU_DEFAULT
        predictions: dict[str, dict[str, Any]] = {}
        for layer in layers:
            args = {
                "pattern": layer["pattern"],
                "m": layer["m"],
                "n": layer["n"],
                "k": layer["k"],
                "world_size": cfg.tp,
            }
            try:
                predictions[layer["layer"]] = await self.c.call("predict_overlap", {**args, "gpu": gpu})
            except ToolCallError as exc:
                if gpu == PREDICT_GPU_DEFAULT:
                    self.error("overlap", exc.message, tool="predict_overlap")
                    continue
                self.error(
                    "overlap",
                    f"{gpu}: {exc.message}; predicting for {PREDICT_GPU_DEFAULT} instead",
                    tool="predict_overlap",
                )
                gpu = PREDICT_GPU_DEFAULT
                prediction = await self.try_call("overlap", "predict_overlap", {**args, "gpu": gpu})
                if prediction is not None:
                    predictions[layer["layer"]] = prediction
        section["predicted_for"] = gpu
        section["predictions"] = predictions
        # The measurement: the same shapes on the GPUs here, or the preset's shapes at a few tokens on CPU.
        on_gpus = self.gpu_count >= cfg.tp
        if on_gpus:
            measured_layers, backend, dtype, methods = layers, "auto", "bf16", None
            note = None
        else:
            small = await self.try_call(
                "overlap", "list_shape_presets", {"name": cfg.preset, "seq_len": cfg.cpu_seq_len, "world_size": cfg.tp}
            )
            if small is None:
                return
            names = {x["layer"] for x in layers}
            measured_layers = [x for x in small["presets"][0]["layers"] if x["layer"] in names]
            backend, dtype, methods = "gloo", "fp32", CPU_METHODS
            why = f"{self.gpu_count} GPU(s) here, TP={cfg.tp} needs {cfg.tp}" if self.gpu_count else "no GPU here"
            note = (
                f"Measured on CPU ({why}): gloo, fp32, the preset's layers at {cfg.cpu_seq_len} tokens instead of "
                f"{section['tokens']}. Compare the gains, not the times: the prediction is for {gpu} at "
                f"{section['tokens']} tokens."
            )
        args = {
            "layers": [{k: x[k] for k in ("layer", "pattern", "m", "n", "k")} for x in measured_layers],
            "world_size": cfg.tp,
            "dtype": dtype,
            "chunks": OVERLAP_CHUNKS,
            "iters": cfg.overlap_iters,
            "backend": backend,
            "wait_s": 0,
            "max_wall_s": OVERLAP_TIMEOUT_S,
            **({"methods": methods} if methods else {}),
        }
        section["measure_args"] = args
        section["measure_note"] = note
        job_id = self.ledger.get("overlap", args)
        view = None
        if job_id is not None:
            view = await self.try_call("overlap", "get_job", {"job_id": job_id})
            if view is not None:
                self.say(f"   reusing {job_id} (this study measured it before)")
                self.track(job_id, reused=True)
        if view is None:
            started = await self.try_call("overlap", "tune_overlap", args)
            if started is None:
                return
            job_id = started["job_id"]
            self.ledger.put("overlap", args, job_id)
            self.track(job_id)
        assert job_id is not None
        try:
            job = await self.c.wait_job(job_id, "tune_overlap", OVERLAP_TIMEOUT_S + 60)
        except ToolCallError as exc:
            self.error("overlap", exc.message, tool="wait_for_job")
            return
        section["job"] = {k: job.get(k) for k in ("job_id", "state", "reason", "elapsed_s")}
        result = None
        if job["state"] == "SUCCEEDED":
            try:
                result = await self.c.full_result(job)
            except ToolCallError as exc:
                self.error("overlap", exc.message, tool="resources/read")
                section["rows"] = study.overlap_rows(predictions, None, note)
                return
        if not isinstance(result, dict):
            self.error("overlap", f"job {job_id} {job['state']}: {job.get('reason')}", tool="tune_overlap")
            section["rows"] = study.overlap_rows(predictions, None, note)
            return
        section["measured"] = {
            k: result.get(k)
            for k in (
                "backend",
                "backend_decision",
                "device",
                "device_name",
                "note",
                "dtype",
                "world_size",
                "prediction_note",
            )
        }
        section["table"] = result.get("table")
        section["rows"] = study.overlap_rows(predictions, result, note)
        # drawn while the next jobs run (draw_pending), not while nothing does
        self.pending_chart = (section["rows"], gpu, result.get("device_name") or "here")
        for row in section["rows"]:
            m, p = row["measured"] or {}, row["predicted"] or {}
            self.say(
                f"   {row['layer']}: predicted speedup {p.get('speedup', float('nan')):.2f}x on {gpu}; measured: "
                f"{m.get('verdict') or 'no measurement'}"
            )

    def draw_pending(self) -> None:
        """The overlap chart (matplotlib), once there is something to draw; the loop calls it while jobs run."""
        if self.pending_chart is None:
            return
        from servers.loop.report import overlap_chart

        rows, gpu, device = self.pending_chart
        self.pending_chart = None
        try:
            self.images["overlap.png"] = overlap_chart(rows, gpu, device)
        except Exception as exc:  # a picture that cannot be drawn must not end the study
            self.error("overlap", f"the overlap chart could not be drawn: {type(exc).__name__}: {exc}")

    # ---- 3. the RL scaling study --------------------------------------------------------------------------
    def base_spec(self, round_key: str, base_args: list[str], runs: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "recipe": study.RECIPE,
            "args": base_args,
            "name": self.cfg.name,
            "tags": [f"study:{self.cfg.name}", f"round:{round_key}"],
            "backend": self.cfg.backend,
            "max_wall_s": self.cfg.run_wall_s,
        }
        if self.cfg.backend == "local" and 0 < self.gpu_count < runs:  # share_gpus: a local backend's option
            spec["options"] = {"share_gpus": True}  # more runs at once than GPUs here: the tiny recipe shares them
        return spec

    async def run_sweep(self, round_key: str, base_args: list[str], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every run (dicts with variant, seed, args) as sweeps of at most max_runs_per_sweep runs; returns the runs
        with job_id, state, reason, times, and the metrics rows of those that succeeded."""
        size = self.cfg.max_runs_per_sweep
        sweeps = self.data.setdefault("scaling", {}).setdefault("sweeps", [])
        for b in range(0, len(runs), size):
            batch = runs[b : b + size]
            key = f"{round_key}-{b // size}"
            spec = self.base_spec(round_key, base_args, len(batch))
            variants = [r["args"] for r in batch]
            label = f"sweep {round_key}" + (f" part {b // size + 1}" if len(runs) > size else "")
            record: dict[str, Any] = {"key": key, "runs": len(batch)}
            sweeps.append(record)
            sweep_id = self.ledger.get(key, {"spec": spec, "variants": variants})
            resumed = False
            if sweep_id is not None:  # planned and submitted before: still running? then follow it, do not re-plan
                listed = await self.try_call(label, "list_jobs", {"sweep_id": sweep_id, "limit": 200})
                if listed and listed["total"] == len(batch) and not all(j["finished"] for j in listed["jobs"]):
                    resumed = True
                    record.update(sweep_id=sweep_id, resumed_running=True, existing_before_submit=len(batch), started=0)
                    self.say(f"   {label}: {sweep_id} is still running (submitted by an earlier run); following it")
            if not resumed:
                plan = await self.try_call(label, "plan_sweep", {"spec": spec, "variants": variants})
                if plan is None:
                    for r in batch:
                        r.update(state="NOT STARTED", reason="plan_sweep refused the sweep (see the errors)")
                    continue
                sweep_id = plan["sweep_id"]
                record.update(sweep_id=sweep_id, total_gpu_hours=plan["total_gpu_hours"], warnings=plan["warnings"])
                if plan["needs_confirmation"]:
                    self.say(f"   {label}: needs the person's approval (plan_id {plan['plan_id']})")
                before = await self.try_call(label, "list_jobs", {"sweep_id": sweep_id, "limit": 1})
                submitted = await self.try_call(label, "submit_sweep", {"sweep_token": plan["sweep_token"]})
                if submitted is None:
                    for r in batch:
                        r.update(state="NOT STARTED", reason="submit_sweep refused the sweep (see the errors)")
                    continue
                existing = before["total"] if before else None
                record.update(
                    existing_before_submit=existing, started=None if existing is None else len(batch) - existing
                )
                self.ledger.put(key, {"spec": spec, "variants": variants}, sweep_id)
                for r, job_id in zip(batch, submitted["job_ids"], strict=True):
                    r["job_id"] = job_id
                if existing:
                    self.say(
                        f"   {label}: {sweep_id} was submitted before; {existing} run(s) reused, none started again"
                    )
                else:
                    self.say(f"   {label}: {sweep_id} submitted: {len(batch)} run(s)")
            assert sweep_id is not None
            self.draw_pending()
            try:
                status = await self.c.wait_sweep(sweep_id, label, self.cfg.run_wall_s + 120)
            except ToolCallError as exc:
                self.error(label, exc.message, tool="wait_for_job")
                status = {"jobs": []}
            by_index = {j["index"]: j for j in status["jobs"]}
            for i, r in enumerate(batch):
                job = by_index.get(i)
                if job is not None:
                    r["job_id"] = job["job_id"]
            record["job_ids"] = [r.get("job_id") for r in batch]
            for r in batch:
                if r.get("job_id"):
                    self.track(r["job_id"], reused=bool(resumed or record.get("existing_before_submit")))
                    await self.collect(r)
        return runs

    async def collect(self, run: dict[str, Any]) -> None:
        """The run's final view, and its metrics rows when it succeeded (its log's tail when it did not)."""
        job = await self.try_call("runs", "get_job", {"job_id": run["job_id"]})
        if job is None:
            run.update(state="UNKNOWN", reason="get_job failed (see the errors)")
            return
        run.update(
            {
                k: job.get(k)
                for k in ("state", "reason", "exit_code", "created_at", "started_at", "ended_at", "elapsed_s")
            }
        )
        if job["state"] != "SUCCEEDED":
            logs = {entry["process"]: entry["size_bytes"] for entry in job.get("logs") or []}
            process = "rank0" if "rank0" in logs else "main" if "main" in logs else None
            if process is not None:
                chunk = await self.try_call(
                    "runs",
                    "read_job_logs",
                    {"job_id": run["job_id"], "process": process, "offset": max(0, logs[process] - 1500)},
                )
                run["log_tail"] = chunk["text"] if chunk else None
            self.error(
                "runs",
                f"{run['variant']} seed {run['seed']} ({run['job_id']}) {job['state']}: "
                f"{job.get('reason') or 'no reason given'}; left out of the "
                + ("study" if run["round"] == "pilot" else "fits"),
            )
            return
        keys = [study.VALUE_KEY, "compute_flops", "compute_gpu_hours", "split", "device"]
        rows: list[dict[str, Any]] = []
        since: int | None = None
        while True:  # page through with since_step: the evaluations are spread over the whole run
            args: dict[str, Any] = {"job_id": run["job_id"], "keys": keys, "limit": 5000}
            if since is not None:
                args["since_step"] = since
            page = await self.try_call("runs", "read_job_metrics", args)
            if page is None:
                return
            rows += [r for r in page["rows"] if r.get("split") == "eval"]  # training rows are not the curve
            if not page["truncated"] or page["last_step"] is None:
                break
            since = page["last_step"]
        run["rows"] = rows

    async def pilot(self) -> dict[str, float]:
        """A short run of every variant (seed 0): that it runs at all, and its compute per step (for the budget)."""
        cfg = self.cfg
        unit = cfg.budget_unit or "flops"
        key = study.COMPUTE_KEYS[unit]
        self.say(f"== pilot: {study.PILOT_STEPS} steps of each variant, to measure its compute per step")
        runs = [
            {"variant": v.name, "seed": 0, "round": "pilot", "args": study.run_args(v, study.PILOT_STEPS, 0)}
            for v in cfg.variants
        ]
        await self.run_sweep("pilot", ["--evals", "2"], runs)
        rates: dict[str, float] = {}
        for r in runs:
            rate = study.per_step_rate(r.get("rows") or [], key) if r.get("state") == "SUCCEEDED" else None
            if rate is not None:
                rates[r["variant"]] = rate
            elif r.get("state") == "SUCCEEDED":
                self.error("pilot", f"{r['variant']}: its metrics have no {key}; left out of the study")
        self.data["scaling"]["pilot"] = {"runs": runs, "per_step": rates, "unit": unit, "compute_key": key}
        for name, rate in rates.items():
            self.say(f"   {name}: {rate:.4g} {unit} per step")
        return rates

    async def scaling(self) -> None:
        cfg = self.cfg
        section = self.data.setdefault("scaling", {})
        section.update(recipe=study.RECIPE, level=cfg.level)
        rates = await self.pilot()
        unit = cfg.budget_unit or "flops"
        key = study.COMPUTE_KEYS[unit]
        section.update(unit=unit, compute_key=key)
        variants = [v for v in cfg.variants if v.name in rates]
        dropped = [v.name for v in cfg.variants if v.name not in rates]
        section["dropped_variants"] = dropped
        if len(variants) < 2:
            self.error(
                "scaling",
                f"{len(variants)} variant(s) passed the pilot ({', '.join(v.name for v in variants) or 'none'}); a "
                "comparison needs two: no RL study this time",
            )
            return
        plan = study.split_budget(cfg.budget, unit, {v.name: rates[v.name] for v in variants}, cfg.seeds, cfg.followup)
        section["budget"] = asdict(plan)
        self.say(f"== RL scaling study: {plan.rule}")
        for v in variants:
            self.say(f"   {v.name}: {plan.steps[v.name]} steps per run x {cfg.seeds} seed(s)")
        runs = [
            {"variant": v.name, "seed": s, "round": "1", "args": study.run_args(v, plan.steps[v.name], s)}
            for v in variants
            for s in range(cfg.seeds)
        ]
        base_args = ["--evals", str(cfg.evals)]
        await self.run_sweep("1", base_args, runs)
        section["runs"] = runs
        section["held_out"] = []
        for r in runs:
            await self.held_out_check(r)
        round1 = await self.analyse("1", variants, runs)
        section["rounds"] = [round1]
        decision = round1.get("decision")
        leading = decision["leading_variant"] if decision else None
        check = (round1.get("variants", {}).get(leading) or {}).get("check") if leading else None
        needed, why = study.followup_needed(check, cfg.followup_threshold, plan, leading)
        section["followup"] = {"needed": needed, "reason": why}
        self.say(f"== follow-up: {'yes' if needed else 'no'}: {why}")
        if needed and leading is not None:
            variant = next(v for v in variants if v.name == leading)
            extra = {
                "variant": leading,
                "seed": cfg.seeds,
                "round": "2",
                "args": study.run_args(variant, plan.followup_steps[leading], cfg.seeds),
            }
            await self.run_sweep("2", base_args, [extra])
            runs.append(extra)
            await self.held_out_check(extra)
            section["followup"]["run"] = extra
            round2 = await self.analyse("2", variants, runs)
            section["rounds"].append(round2)
        final = section["rounds"][-1]
        section["decision"] = final.get("decision")
        spent = [
            max((row[key] for row in r.get("rows") or [] if isinstance(row.get(key), int | float)), default=0.0)
            for r in [*runs, *section["pilot"]["runs"]]
        ]
        section["spent"] = {"compute": float(sum(spent)), "unit": unit, "of_budget": plan.budget}
        await self.plots(final, unit)
        await self.next_step(final, runs, unit)

    async def held_out_check(self, run: dict[str, Any]) -> None:
        """Fit the run's first half of compute, predict its second half, and set the two side by side."""
        if not run.get("rows"):
            return
        cfg = self.cfg
        key = self.data["scaling"]["compute_key"]
        unit = self.data["scaling"]["unit"]
        points = study.curve_points(run["rows"], key)
        where = f"held-out {run['variant']} seed {run['seed']}"
        if len(points) < 8:
            self.error(where, f"{len(points)} evaluation points: too few to fit a first half")
            return
        split, _, held = study.held_out(points)
        entry: dict[str, Any] = {
            "variant": run["variant"],
            "seed": run["seed"],
            "round": run["round"],
            "job_id": run["job_id"],
            "split": split,
        }
        self.data["scaling"]["held_out"].append(entry)
        if not held:
            self.error(where, "no evaluation beyond the first half of compute")
            return
        fit = await self.try_call(
            where,
            "fit_scaling_law",
            {
                "model": study.LAW,
                "data": {"job_id": run["job_id"], "columns": {"compute": key, "value": study.VALUE_KEY}},
                "max_compute": split,
                "compute_unit": unit,
                "label": f"{run['variant']} seed {run['seed']}: first half",
                "bootstrap": cfg.bootstrap,
                "seed": 0,
            },
        )
        if fit is None:
            return
        entry["fit"] = trim_fit(fit)
        predicted = await self.try_call(
            where,
            "predict_scaling",
            {"fit_id": fit["fit_id"], "compute": [p["compute"] for p in held], "level": cfg.level},
        )
        if predicted is None:
            return
        entry["rows"] = study.error_rows(held, predicted["values"])
        entry["summary"] = study.error_summary(entry["rows"])
        s = entry["summary"]
        self.say(
            f"   {run['variant']} seed {run['seed']}: fitted on compute <= {split:.3g} {unit}, predicted {s['points']} "
            f"held-out point(s): mean |error| {s['mean_abs_error']:.4f}, max {s['max_abs_error']:.4f}"
        )

    async def analyse(self, round_key: str, variants: list[Variant], runs: list[dict[str, Any]]) -> dict[str, Any]:
        """Per variant (its seeds pooled): a first-half fit, the extrapolation check, a fit on all compute; then the
        comparison of the full fits and the decision."""
        cfg = self.cfg
        unit = self.data["scaling"]["unit"]
        key = self.data["scaling"]["compute_key"]
        self.say(f"== fits (round {round_key})")
        out: dict[str, Any] = {"round": round_key, "variants": {}}
        for v in variants:
            mine = [r for r in runs if r["variant"] == v.name and r.get("rows")]
            points = [p for r in mine for p in study.curve_points(r["rows"], key, run=f"seed {r['seed']}")]
            where = f"fit {v.name} (round {round_key})"
            if len(points) < 8:
                self.error(where, f"{len(points)} evaluation points from {len(mine)} run(s): too few to fit")
                continue
            entry: dict[str, Any] = {
                "runs": [r["job_id"] for r in mine],
                "points": len(points),
                "split": study.half_split(points),
            }
            out["variants"][v.name] = entry
            common = {
                "model": study.LAW,
                "data": {"points": points},
                "compute_unit": unit,
                "bootstrap": cfg.bootstrap,
                "seed": 0,
            }
            half = await self.try_call(
                where, "fit_scaling_law", {**common, "max_compute": entry["split"], "label": f"{v.name}: first half"}
            )
            entry["half"] = trim_fit(half) if half else None
            check = await self.try_call(
                where,
                "check_extrapolation",
                # bootstrap 0: the loop reads only the check's point errors (its stored fits' intervals go unused)
                {"data": {"points": points}, "compute_unit": unit, "bootstrap": 0},
            )
            entry["check"] = check
            full = await self.try_call(where, "fit_scaling_law", {**common, "label": v.name})
            entry["full"] = trim_fit(full) if full else None
            if full:
                p = full["parameters"]
                self.say(
                    f"   {v.name}: A={p['A']['value']:.3f}, C_mid={p['C_mid']['value']:.3g} {unit} on "
                    f"{full['points_used']} points" + (f"; extrapolation: {check['verdict']}" if check else "")
                )
        fitted = {name: e["full"]["fit_id"] for name, e in out["variants"].items() if e.get("full")}
        variant_of_fit = {fit_id: name for name, fit_id in fitted.items()}
        if len(fitted) < 2:
            self.error(f"compare (round {round_key})", f"{len(fitted)} variant(s) have a fit; a comparison needs two")
            return out
        ids = list(fitted.values())
        first = await self.try_call("compare", "compare_scaling_fits", {"fit_ids": ids, "level": cfg.level})
        if first is None:
            return out
        best = first["highest_fitted_asymptote"]  # decide() judges how sure; best_asymptote is null when unsure
        best_first = (
            first
            if ids[0] == best
            else await self.try_call(
                "compare",
                "compare_scaling_fits",
                {"fit_ids": [best, *[i for i in ids if i != best]], "level": cfg.level},
            )
        )
        if best_first is None:
            return out
        efficient = best_first.get("most_efficient")
        efficient_first = best_first if efficient == best else None
        if efficient is not None and efficient != best:
            efficient_first = await self.try_call(
                "compare",
                "compare_scaling_fits",
                {"fit_ids": [efficient, *[i for i in ids if i != efficient]], "level": cfg.level},
            )
        out["comparison"] = best_first
        out["comparison_efficient_first"] = efficient_first
        out["variant_of_fit"] = variant_of_fit
        decision = study.decide(best_first, efficient_first, variant_of_fit, cfg.level)
        out["decision"] = asdict(decision)
        self.say(f"   comparison: {best_first['verdict']}")
        self.say(f"   decision: {decision.text}")
        return out

    async def plots(self, final: dict[str, Any], unit: str) -> None:
        variants = final.get("variants") or {}
        half_ids = [e["half"]["fit_id"] for e in variants.values() if e.get("half")]
        full_ids = [e["full"]["fit_id"] for e in variants.values() if e.get("full")]
        largest = max((e["split"] * 2 for e in variants.values()), default=None)
        for name, ids, args in (
            ("fit_heldout.png", half_ids, {"extrapolate_to": largest} if largest else {}),
            ("fit_full.png", full_ids, {}),
        ):
            if not ids:
                continue
            try:
                info, png = await self.c.call_image("plot_scaling_fit", {"fit_ids": ids[:6], **args})
            except ToolCallError as exc:
                self.error("plot", exc.message, tool="plot_scaling_fit")
                continue
            if png is None:
                self.error("plot", "plot_scaling_fit returned no PNG image", tool="plot_scaling_fit")
                continue
            self.images[name] = png
            self.data["scaling"].setdefault("plots", {})[name] = info

    async def next_step(self, final: dict[str, Any], runs: list[dict[str, Any]], unit: str) -> None:
        """What the loop would run next, with the chosen (or leading) variant's prediction there."""
        decision = final.get("decision")
        section = self.data["scaling"]
        if decision is None:
            section["next"] = {
                "text": "Fix what failed (see the errors) and run the study again: nothing to compare yet."
            }
            return
        name = decision["variant"] or decision["leading_variant"]
        fit = (final["variants"].get(name) or {}).get("full")
        largest = max((e["split"] * 2 for e in final["variants"].values()), default=None)
        text = ""
        prediction = None
        if fit and largest:
            target = largest * NEXT_COMPUTE_FACTOR
            prediction = await self.try_call(
                "next", "predict_scaling", {"fit_id": fit["fit_id"], "compute": [target], "level": self.cfg.level}
            )
        if decision["kind"] == "none":
            text = (
                f"More seeds of every variant (this study ran {self.cfg.seeds} per variant): the bootstrap could not "
                f"separate them at {self.cfg.level:.0%}."
            )
        else:
            text = f"Scale {name}: one run at {NEXT_COMPUTE_FACTOR:g}x this study's largest compute."
        if prediction is not None and prediction["values"]:
            v = prediction["values"][0]
            band = f" [{v['pi_low']:.3f}, {v['pi_high']:.3f}]" if v.get("pi_low") is not None else ""
            text += (
                f" predict_scaling for {name} at {v['compute']:.3g} {unit}: pass rate {v['value']:.3f}{band} "
                f"({self.cfg.level:.0%} prediction interval{', extrapolated' if v.get('extrapolated') else ''})."
            )
        section["next"] = {"text": text, "prediction": prediction}

    # ---- 4. the jobs' own times -------------------------------------------------------------------------------
    async def account_jobs(self) -> None:
        jobs = []
        for job_id in self.job_ids:
            view = await self.try_call("jobs", "get_job", {"job_id": job_id})
            if view is not None:
                jobs.append(
                    {
                        **{
                            k: view.get(k)
                            for k in (
                                "job_id",
                                "kind",
                                "state",
                                "created_at",
                                "started_at",
                                "ended_at",
                                "elapsed_s",
                                "reason",
                            )
                        },
                        "reused": job_id in self.reused,
                    }
                )
        self.data["jobs"] = jobs


def max_runs_per_sweep() -> int:
    """A sweep starts all its runs at once, within LLM_INFRA_MCP_MAX_CONCURRENT_JOBS (the server's setting)."""
    try:
        return max(1, int(os.environ.get("LLM_INFRA_MCP_MAX_CONCURRENT_JOBS", "4")))
    except ValueError:
        return 4


async def run_study(cfg: StudyConfig, *, server: Any = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the study and write its report; returns study.json's content. StudyError for a study that cannot run as
    asked (nothing is started then, or the message says what was)."""
    from servers.loop.report import write_report

    cfg.validate()
    cfg.out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(cfg.out / "ledger.json", cfg.name)
    started, t0 = time.time(), time.monotonic()
    refused: StudyError | None = None  # raised after the client's task group has closed (not as a group)
    async with connect(server, say) as client:
        run = StudyRun(cfg, client, ledger, say)
        try:
            await run.prepare()
            await run.node_check()
            if cfg.overlap:
                await run.overlap()
            await run.scaling()
        except StudyError as exc:
            refused = exc
        finally:
            run.draw_pending()  # when no sweep ran after the overlap step
            await run.account_jobs()
            run.data["errors"] = run.errors
            run.data["timing"] = {"started_at": started, "ended_at": time.time(), "wall_s": time.monotonic() - t0}
            run.data["calls"] = [asdict(c) for c in client.calls]
    if refused is not None:
        if run.job_ids:  # it got that far: what ran is still worth a report
            run.data["refused"] = str(refused)
            write_report(cfg.out, run.data, run.images)
        raise refused
    write_report(cfg.out, run.data, run.images)
    return run.data
