"""The study, step by step, over the suite's tools: node check, overlap (where GPUs are), and the RL scaling study
as a ladder: a pilot of every variant (its compute per step, where its curve rises), then rounds that double the
compute per run: after each, every variant's runs are fitted and forecast at the target, the variants that cannot
catch the leader stop, and the rest continue from their checkpoints (a job with resume_from), until one is left,
those left are a tie within the margin, the target is reached, or the budget is spent; then the report.

Every result that decides something comes from a tool; study.py turns those results into decisions. A tool that
fails (a job that fails or is killed, a fit that is refused) is recorded in the report and the study goes on with
what is left. The study is resumable: each run carries an idempotency key made from its spec, and the study's
ledger (ledger.json in the output folder) records which job answered which run, so a rerun starts nothing that
succeeded and tries a failed run once more; the overlap job, which has no key, is found again through the ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from servers.loop import study
from servers.loop.client import SuiteClient, ToolCallError, connect
from servers.loop.study import StudyConfig, StudyError

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
        self.margin: float = cfg.margin if cfg.margin is not None else 0.02
        self.margin_note = ""
        self.ceiling: float | None = None
        self.variant_of = {v.name: v for v in cfg.variants}
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
        self.margin, self.margin_note = study.resolve_margin(self.cfg.margin, self.recipe["arguments"])
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

    def skip_overlap(self) -> None:
        """On CPU the overlap step measures gloo on the preset's shapes at a few tokens: minutes of CPU time that say
        nothing about GPU overlap. It is skipped there unless asked for (--overlap)."""
        why = f"{self.gpu_count} GPU(s) here, TP={self.cfg.tp} needs {self.cfg.tp}" if self.gpu_count else "no GPU here"
        self.data["overlap"] = {
            "skipped": (
                f"Overlap skipped ({why}): on CPU its timings say nothing about GPU overlap; --overlap measures it "
                "anyway (gloo, the preset's shapes at a few tokens)."
            )
        }
        self.say(f"== overlap: {self.data['overlap']['skipped']}")

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
    def run_spec(self, chain: dict[str, Any], steps: int, round_no: int, resume_from: str | None) -> dict[str, Any]:
        """One run of the ladder: a chain (variant x seed) to `steps`, continued from its previous run's job."""
        cfg = self.cfg
        variant = self.variant_of[chain["variant"]]
        horizon = chain.get("horizon")
        evals = study.PILOT_EVALS if round_no == 0 else cfg.evals
        spec: dict[str, Any] = {
            "recipe": study.RECIPE,
            "args": study.run_args(variant, steps, chain["seed"], evals=evals, horizon=horizon),
            "name": cfg.name,
            "tags": [f"study:{cfg.name}", f"round:{'pilot' if round_no == 0 else round_no}"],
            "backend": cfg.backend,
            "max_wall_s": cfg.run_wall_s,
        }
        if resume_from:
            spec["resume_from"] = resume_from
        if cfg.backend == "local" and 0 < self.gpu_count < cfg.max_runs_per_sweep:
            spec["options"] = {"share_gpus": True}  # more runs at once than GPUs here: the tiny recipe shares them
        return spec

    async def run_jobs(self, label: str, items: list[dict[str, Any]]) -> None:
        """Run every item ({chain, steps, round, resume_from}) as one job, at most max_runs_per_sweep at once; each
        item gets job_id, state, reason and, when it succeeded, its evaluation rows. A rerun finds each job again
        through the study's ledger (and the job's idempotency key); a job that failed in an earlier run of the study
        is tried again once, under a new key."""
        limiter = anyio.CapacityLimiter(self.cfg.max_runs_per_sweep)
        done = [0]

        async def one(item: dict[str, Any]) -> None:
            async with limiter:
                await self.run_one(item)
            done[0] += 1
            chain = item["chain"]
            state = item.get("state")
            self.say(
                f"   {label}: {done[0]}/{len(items)} done ({chain['variant']} seed {chain['seed']}: {state}"
                + (", reused" if item.get("reused") else "")
                + ")"
            )

        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(one, item)

    async def run_one(self, item: dict[str, Any]) -> None:
        chain, round_no = item["chain"], item["round"]
        spec = self.run_spec(chain, item["steps"], round_no, item.get("resume_from"))
        slot = f"run:{chain['variant']}:{chain['seed']}:{round_no}"
        identity = json.dumps(spec, sort_keys=True)
        where = f"{chain['variant']} seed {chain['seed']} round {round_no or 'pilot'}"
        attempt = int(self.ledger.get(f"{slot}:attempt", identity) or 0)
        earlier = self.ledger.get(slot, identity)
        if earlier is not None:
            view = await self.try_call(where, "get_job", {"job_id": earlier})
            if view is not None and view["finished"] and view["state"] != "SUCCEEDED":
                attempt += 1
                self.say(f"   {where}: {earlier} {view['state']} in an earlier run of the study; trying again")
                self.ledger.put(f"{slot}:attempt", identity, str(attempt))
                item["retried"] = earlier
        digest = hashlib.sha256(f"{identity}|{attempt}".encode()).hexdigest()[:16]
        spec["idempotency_key"] = f"{self.cfg.name}-{digest}"
        plan = await self.try_call(where, "plan_training_job", {"spec": spec})
        if plan is None:
            item.update(state="NOT STARTED", reason="plan_training_job refused the run (see the errors)")
            return
        if plan.get("needs_confirmation"):
            self.say(f"   {where}: needs the person's approval (plan_id {plan.get('plan_id')})")
        started = await self.try_call(where, "submit_training_job", {"plan_token": plan["plan_token"], "wait_s": 0})
        if started is None:
            item.update(state="NOT STARTED", reason="submit_training_job refused the run (see the errors)")
            return
        job_id = started["job_id"]
        item["job_id"] = job_id
        reused = earlier == job_id or bool(started.get("finished"))
        item["reused"] = reused
        self.ledger.put(slot, identity, job_id)
        self.track(job_id, reused=reused)
        try:
            await self.c.wait_job(job_id, where, self.cfg.run_wall_s + 120)
        except ToolCallError as exc:
            self.error(where, exc.message, tool="wait_for_job")
        await self.collect(item)

    async def collect(self, run: dict[str, Any]) -> None:
        """The run's final view, and its evaluation rows when it succeeded (its log's tail when it did not)."""
        chain = run["chain"]
        job = await self.try_call("runs", "get_job", {"job_id": run["job_id"]})
        if job is None:
            run.update(state="UNKNOWN", reason="get_job failed (see the errors)")
            return
        run.update({k: job.get(k) for k in ("state", "reason", "exit_code", "elapsed_s")})
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
                f"{chain['variant']} seed {chain['seed']} ({run['job_id']}) {job['state']}: "
                f"{job.get('reason') or 'no reason given'}; its chain ends here (rerun the study to try it again)",
            )
            return
        keys = [study.VALUE_KEY, "compute_flops", "compute_gpu_hours", "split", "ceiling", "device"]
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

    async def pilot(self) -> dict[str, dict[str, Any]]:
        """A short run of every variant (the first seed): that it runs at all, its compute per step, and where its
        curve rises (a fit's C_mid), from which the ladder's first rung is set."""
        cfg = self.cfg
        unit = cfg.budget_unit or "flops"
        key = study.COMPUTE_KEYS[unit]
        self.say(f"== pilot: {study.PILOT_STEPS} steps of each variant: its compute per step and where it rises")
        items = [
            {"chain": {"variant": v.name, "seed": cfg.seed}, "steps": study.PILOT_STEPS, "round": 0}
            for v in cfg.variants
        ]
        await self.run_jobs("pilot", items)
        out: dict[str, dict[str, Any]] = {}
        for item in items:
            name = item["chain"]["variant"]
            rows = item.get("rows") or []
            rate = study.per_step_rate(rows, key) if item.get("state") == "SUCCEEDED" else None
            if rate is None:
                if item.get("state") == "SUCCEEDED":
                    self.error("pilot", f"{name}: its metrics have no {key}; left out of the study")
                continue
            entry: dict[str, Any] = {
                "rate": rate,
                "job_id": item.get("job_id"),
                "compute": max(float(r[key]) for r in rows if isinstance(r.get(key), int | float)),
                "c_mid": None,
                "fit_id": None,
                "rows": rows,
            }
            points = study.curve_points(rows, key)
            if len(points) >= 8:
                fit = await self.try_call(
                    f"pilot {name}",
                    "fit_scaling_law",
                    {
                        "model": study.LAW,
                        "data": {"points": points, "columns": {"value": study.VALUE_KEY}},
                        "compute_unit": unit,
                        "bootstrap": 0,
                        "seed": 0,
                        "label": f"{name}: pilot",
                        **self.y_max_arg(rows),
                    },
                )
                if fit is not None:
                    entry.update(fit_id=fit["fit_id"], c_mid=fit["parameters"]["C_mid"]["value"])
            out[name] = entry
            mid = entry["c_mid"]
            self.say(
                f"   {name}: {rate:.4g} {unit} per step"
                + (f"; C_mid {mid:.3g} {unit} (pilot reached {entry['compute']:.3g})" if mid is not None else "")
            )
        return out

    def y_max_arg(self, rows: list[dict[str, Any]]) -> dict[str, float]:
        """fit_scaling_law's y_max: the task's ceiling when the recipe states it and no evaluation is above it (a
        fit's asymptote then cannot pass what no run can reach; where the data would put it higher, the fit says
        the asymptote ended at its bound, and predictions beyond the data widen to what the curve can still do)."""
        ceiling = self.ceiling if self.ceiling is not None else study.ceiling_of(rows)
        if ceiling is None or not 0 < ceiling <= 1:
            return {}
        values = [float(r[study.VALUE_KEY]) for r in rows if isinstance(r.get(study.VALUE_KEY), int | float)]
        return {"y_max": ceiling} if max(values, default=0.0) <= ceiling else {}

    async def scaling(self) -> None:
        cfg = self.cfg
        section = self.data.setdefault("scaling", {})
        mode = "exhaustive" if cfg.exhaustive else "adaptive"
        section.update(recipe=study.RECIPE, level=cfg.level, mode=mode)
        self.variant_of = {v.name: v for v in cfg.variants}
        self.ceiling = None
        pilot = await self.pilot()
        unit = cfg.budget_unit or "flops"
        key = study.COMPUTE_KEYS[unit]
        section.update(unit=unit, compute_key=key)
        variants = [v for v in cfg.variants if v.name in pilot]
        section["dropped_variants"] = [v.name for v in cfg.variants if v.name not in pilot]
        section["pilot"] = {
            v: {k: e[k] for k in ("rate", "job_id", "compute", "c_mid", "fit_id")} for v, e in pilot.items()
        }
        if len(variants) < 2:
            self.error(
                "scaling",
                f"{len(variants)} variant(s) passed the pilot ({', '.join(v.name for v in variants) or 'none'}); a "
                "comparison needs two: no RL study this time",
            )
            return
        self.ceiling = study.ceiling_of([r for e in pilot.values() for r in e["rows"]])
        design = study.design_ladder(
            {v.name: pilot[v.name]["rate"] for v in variants},
            {v.name: pilot[v.name]["c_mid"] for v in variants},
            {v.name: pilot[v.name]["compute"] for v in variants},
            unit=unit,
            compute_key=key,
            rungs=cfg.rungs,
        )
        rungs = [design.target] if cfg.exhaustive else design.rungs
        steps = {v: [s[-1]] for v, s in design.steps.items()} if cfg.exhaustive else design.steps
        section["design"] = self.describe_design(design, rungs, steps)
        self.say(f"== ladder ({mode}): {section['design']['rule']}")
        for name, s in steps.items():
            self.say(f"   {name}: {' -> '.join(str(x) for x in s)} steps per run x {cfg.seeds} seed(s)")
        chains = [
            {
                "variant": v.name,
                "seed": cfg.seed + s,
                "horizon": design.horizon[v.name],
                "segments": [],
                "rows": [],
            }
            for v in variants
            for s in range(cfg.seeds)
        ]
        section["chains"] = chains
        pilot_spent = sum(e["compute"] for e in pilot.values())
        budget = cfg.budget
        ladder: list[dict[str, Any]] = []
        stops: dict[str, dict[str, Any]] = {}
        section.update(ladder=ladder, stops=stops)
        active = [v.name for v in variants]
        end: dict[str, Any] = {"why": "failed", "text": "no round could be judged"}
        for index, compute in enumerate(rungs):
            live = [c for c in chains if c["variant"] in active and not c.get("failed")]
            cost = study.round_cost(rungs, index, len(live))
            spent = pilot_spent + self.chain_spent(chains, key)
            if budget is not None and spent + cost > budget * (1 + 1e-9):
                text = (
                    f"the budget ({budget:.3g} {unit}) is spent: {spent:.3g} so far, round {index + 1} needs "
                    f"{cost:.3g} more"
                )
                if index == 0:
                    raise StudyError(
                        f"--budget {budget:g} {unit}: the pilot used {pilot_spent:.3g} and the first round needs "
                        f"{cost:.3g}; give at least {pilot_spent + cost:.3g}, or fewer variants or seeds"
                    )
                end = {"why": "budget", "text": text}
                break
            round_no = index + 1
            self.say(f"== round {round_no}: {len(live)} run(s) to {compute:.3g} {unit} each")
            items = []
            for chain in live:
                last = chain["segments"][-1] if chain["segments"] else None
                item = {
                    "chain": chain,
                    "steps": steps[chain["variant"]][index],
                    "round": round_no,
                    "resume_from": last["job_id"] if last else None,
                }
                items.append(item)
            await self.run_jobs(f"round {round_no}", items)
            self.record_segments(items, round_no)
            rnd = await self.judge(round_no, compute, active, chains, design.target)
            ladder.append(rnd)
            for kind, names in (("below", rnd["stopped"]), ("tied", rnd["tied"]), ("futile", rnd["futile"])):
                for v in names:
                    stops[v] = {
                        "round": round_no,
                        "compute": compute,
                        "kind": kind,
                        "forecast": rnd["forecasts"][v],
                        "leader": rnd["leader"],
                        "reason": rnd["why"].get(v, rnd["note"]),
                    }
            active = rnd["continued"]
            self.say(f"   {rnd['note']}")
            if rnd["end"] is not None:
                end = {"why": rnd["end"], "text": rnd["note"]}
                break
            if index == len(rungs) - 1:
                end = {
                    "why": "target",
                    "text": f"{', '.join(active)} reached the target without one leading at {cfg.level:.0%}",
                }
        section["end"] = end
        self.draw_pending()
        spent = self.chain_spent(chains, key)
        exhaustive_equivalent = len(chains) * design.target
        section["spent"] = {
            "compute": spent,
            "pilot": pilot_spent,
            "unit": unit,
            "exhaustive_equivalent": exhaustive_equivalent,
            "share": spent / exhaustive_equivalent if exhaustive_equivalent > 0 else None,
            "budget": budget,
        }
        measured = self.measured_at_target(chains, key, design.target)
        section["measured_at_target"] = measured
        section["forecast_checks"] = study.forecast_checks(ladder, measured)
        await self.decide(ladder, stops, end, active, design.target, unit)
        self.say(
            f"== spent {spent:.3g} {unit} on the ladder ({section['spent']['share']:.0%} of running every variant x "
            f"seed to the target) + {pilot_spent:.3g} on the pilot"
        )
        await self.plots(ladder, stops, unit, design.target)
        await self.next_step(unit)

    def describe_design(
        self, design: study.LadderDesign, rungs: list[float], steps: dict[str, list[int]]
    ) -> dict[str, Any]:
        """The design as the report states it: rungs, steps, the rule, the ceiling, what compute counts, the stop
        rule."""
        cfg = self.cfg
        unit, key = design.unit, design.compute_key
        notes = self.recipe_notes()
        return {
            "unit": unit,
            "compute_key": key,
            "rungs": rungs,
            "target": design.target,
            "steps": steps,
            "horizon": design.horizon,
            "pilot": self.data["scaling"]["pilot"],
            "rule": design.rule
            + ("; --exhaustive: every run goes straight to the target, judged there once" if cfg.exhaustive else ""),
            "ceiling": self.ceiling,
            "ceiling_note": (
                "the best pass rate reachable on the held-out prompts (the share whose reference is the true sum), "
                "as the recipe logs it; fits take it as the metric's maximum"
                if self.ceiling is not None
                else "the recipe states no ceiling; fits take 1 as the metric's maximum"
            ),
            "compute_counts": notes.get("compute_flops" if unit == "flops" else "compute_gpu_hours")
            or f"the recipe's {key}",
            "stop_rule": study.stop_rule_text(cfg.level, self.margin),
            "level": cfg.level,
            "margin": self.margin,
            "margin_note": self.margin_note,
            "metric": study.VALUE_KEY,
            "metric_label": "eval pass rate",
        }

    def recipe_notes(self) -> dict[str, str]:
        notes = (self.recipe or {}).get("metric_notes") or {}
        if isinstance(notes, list):  # [[key, note], ...] or [{key, note}]
            pairs = [(n[0], n[1]) if isinstance(n, list | tuple) else (n.get("key"), n.get("note")) for n in notes]
            return {str(k): str(v) for k, v in pairs if k and v}
        return {str(k): str(v) for k, v in notes.items()} if isinstance(notes, dict) else {}

    @staticmethod
    def record_segments(items: list[dict[str, Any]], round_no: int) -> None:
        """Each run of a round onto its chain: the segment, and its evaluation rows when it succeeded (a chain whose
        run failed ends there)."""
        for item in items:
            chain = item["chain"]
            chain["segments"].append(
                {
                    "round": round_no,
                    "job_id": item.get("job_id"),
                    "steps": item["steps"],
                    "resumed_from": item.get("resume_from"),
                    "state": item.get("state"),
                    "reused": item.get("reused", False),
                    **({"retried": item["retried"]} if item.get("retried") else {}),
                }
            )
            if item.get("state") == "SUCCEEDED":
                chain["rows"] += item.get("rows") or []
            else:
                chain["failed"] = True

    @staticmethod
    def chain_spent(chains: list[dict[str, Any]], key: str) -> float:
        """Compute the chains' runs used: each chain's largest compute (a continued run counts from its resume)."""
        total = 0.0
        for chain in chains:
            values = [float(r[key]) for r in chain["rows"] if isinstance(r.get(key), int | float)]
            total += max(values, default=0.0)
        return total

    @staticmethod
    def measured_at_target(chains: list[dict[str, Any]], key: str, target: float) -> dict[str, float]:
        """Per variant that reached the target: the mean over its seeds of the evaluation there."""
        values: dict[str, list[float]] = {}
        for chain in chains:
            value = study.measured_at(chain["rows"], key, target)
            if value is not None:
                values.setdefault(chain["variant"], []).append(value)
        return {v: sum(xs) / len(xs) for v, xs in values.items()}

    async def judge(
        self, round_no: int, compute: float, active: list[str], chains: list[dict[str, Any]], target: float
    ) -> dict[str, Any]:
        """Fit each active variant on everything it has run (seeds pooled), forecast it at the target, compare the
        leader with the others there, and apply the stopping rule."""
        cfg = self.cfg
        unit, key = self.data["scaling"]["unit"], self.data["scaling"]["compute_key"]
        self.say(f"== round {round_no}: fits and forecasts at the target ({target:.3g} {unit})")
        forecasts: dict[str, dict[str, Any] | None] = {}
        fits: dict[str, dict[str, Any]] = {}
        for name in active:
            mine = [c for c in chains if c["variant"] == name and c["rows"]]
            points = [p for c in mine for p in study.curve_points(c["rows"], key, run=f"seed {c['seed']}")]
            where = f"fit {name} (round {round_no})"
            if len(points) < 8:
                self.error(where, f"{len(points)} evaluation points from {len(mine)} run(s): too few to fit")
                forecasts[name] = None
                continue
            fit = await self.try_call(
                where,
                "fit_scaling_law",
                {
                    "model": study.LAW,
                    "data": {"points": points, "columns": {"value": study.VALUE_KEY}},
                    "compute_unit": unit,
                    "bootstrap": cfg.bootstrap,
                    "seed": 0,
                    "label": f"{name}: round {round_no}",
                    **self.y_max_arg([r for c in mine for r in c["rows"]]),
                },
            )
            if fit is None:
                forecasts[name] = None
                continue
            fits[name] = trim_fit(fit)
            predicted = await self.try_call(
                where, "predict_scaling", {"fit_id": fit["fit_id"], "compute": [target], "level": cfg.level}
            )
            value = (predicted or {}).get("values") or []
            if not value or value[0].get("ci_low") is None:
                self.error(where, "predict_scaling gave no interval at the target (a fit without bootstrap draws?)")
                forecasts[name] = None
                continue
            v = value[0]
            forecasts[name] = {
                "fit_id": fit["fit_id"],
                **{k: v.get(k) for k in ("value", "ci_low", "ci_high", "pi_low", "pi_high", "extrapolated")},
                "points": len(points),
                "max_compute": max(p["compute"] for p in points),
            }
            self.say(
                f"   {name}: forecast {v['value']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}] on {len(points)} points"
            )
        # At the target a variant whose curve could not be fitted cannot be forecast later either: it is left out
        # of the decision (said so), not kept waiting for a round that does not come.
        at_target = compute >= target * (1 - 1e-9)
        unfitted = [v for v, f in forecasts.items() if f is None] if at_target else []
        call = study.judge_round({v: f for v, f in forecasts.items() if v not in unfitted}, self.margin)
        p_higher: dict[str, float | None] = {}
        judged = [v for v, f in forecasts.items() if f is not None]
        if call.leader is not None and len(judged) >= 2:
            ids = [forecasts[call.leader]["fit_id"]] + [  # type: ignore[index]
                forecasts[v]["fit_id"]  # type: ignore[index]
                for v in judged
                if v != call.leader
            ]
            compared = await self.try_call(
                f"compare (round {round_no})",
                "compare_scaling_fits",
                {"fit_ids": ids[:8], "level": cfg.level, "at_compute": target},
            )
            by_fit = {forecasts[v]["fit_id"]: v for v in judged}  # type: ignore[index]
            for pair in (compared or {}).get("pairs") or []:
                if pair.get("first") == ids[0] and pair.get("second") in by_fit:
                    p_higher[by_fit[pair["second"]]] = pair.get("p_first_higher_at")
        return {
            "round": round_no,
            "compute": compute,
            "at_target": at_target,
            "unfitted": unfitted,
            "active": list(active),
            "forecasts": forecasts,
            "fits": fits,
            "leader": call.leader,
            "p_leader_higher": p_higher,
            "stopped": call.stopped,
            "tied": call.tied,
            "futile": call.futile,
            "why": call.why,
            "continued": call.continued,
            "end": call.end,
            "note": call.note,
        }

    async def decide(
        self,
        ladder: list[dict[str, Any]],
        stops: dict[str, dict[str, Any]],
        end: dict[str, Any],
        active: list[str],
        target: float,
        unit: str,
    ) -> None:
        """The study's decision: the ladder's own when it ended with one variant or a tie within the margin, else
        compare_scaling_fits on the latest fits of the variants left (asymptote, then efficiency, as ScaleRL)."""
        cfg = self.cfg
        section = self.data["scaling"]
        decision: study.Decision | None = None
        if not ladder:
            section["decision"] = None
            return
        last = ladder[-1]
        if end["why"] == "one_leader" and last["leader"] is not None:
            decision = study.decide_forecast(
                last["leader"], ladder, stops, cfg.level, unit, target, self.margin, unfitted=last.get("unfitted") or []
            )
        else:
            latest = self.latest_fits(ladder, active)
            final = await self.compare_and_decide(latest)
            section["rounds"] = [final]
            if final.get("decision"):
                section["decision"] = final["decision"]
                self.say(f"   decision: {final['decision']['text']}")
                return
        section["decision"] = asdict(decision) if decision else None
        if decision is not None:
            self.say(f"   decision: {decision.text}")

    @staticmethod
    def latest_fits(ladder: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
        """Each variant's fit from the latest round that fitted it."""
        out: dict[str, dict[str, Any]] = {}
        for rnd in ladder:
            for name, fit in (rnd.get("fits") or {}).items():
                if name in names:
                    out[name] = fit
        return out

    async def compare_and_decide(self, fits: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """compare_scaling_fits on the fits (the best asymptote first, and the most efficient first when another
        fit is), then the decision from those probabilities."""
        cfg = self.cfg
        out: dict[str, Any] = {"round": "final", "variants": {n: {"full": f} for n, f in fits.items()}}
        fitted = {name: f["fit_id"] for name, f in fits.items()}
        variant_of_fit = {fit_id: name for name, fit_id in fitted.items()}
        if len(fitted) < 2:
            self.error("compare", f"{len(fitted)} variant(s) have a fit; a comparison needs two")
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
        return out

    async def plots(self, ladder: list[dict[str, Any]], stops: dict[str, Any], unit: str, target: float) -> None:
        """The ladder's picture (every run's curve, where each variant stopped and its forecast then), and
        plot_scaling_fit of each variant's latest fit up to the target."""
        from servers.loop.report import ladder_chart

        try:
            self.images["ladder.png"] = ladder_chart(self.data["scaling"])
        except Exception as exc:  # a picture that cannot be drawn must not end the study
            self.error("plot", f"the ladder picture could not be drawn: {type(exc).__name__}: {exc}")
        names = [v.name for v in self.cfg.variants]
        ids = [f["fit_id"] for f in self.latest_fits(ladder, names).values()]
        if not ids:
            return
        try:
            info, png = await self.c.call_image(
                "plot_scaling_fit", {"fit_ids": ids[:6], "extrapolate_to": target, "level": self.cfg.level}
            )
        except ToolCallError as exc:
            self.error("plot", exc.message, tool="plot_scaling_fit")
            return
        if png is None:
            self.error("plot", "plot_scaling_fit returned no PNG image", tool="plot_scaling_fit")
            return
        self.images["fit_full.png"] = png
        self.data["scaling"].setdefault("plots", {})["fit_full.png"] = info

    async def next_step(self, unit: str) -> None:
        """What the loop would run next, with the chosen (or leading) variant's prediction there."""
        section = self.data["scaling"]
        decision = section.get("decision")
        if decision is None:
            section["next"] = {
                "text": "Fix what failed (see the errors) and run the study again: nothing to compare yet."
            }
            return
        name = decision["variant"] or decision["leading_variant"]
        fit = self.latest_fits(section.get("ladder") or [], [name]).get(name)
        target = section["design"]["target"]
        prediction = None
        if fit:
            prediction = await self.try_call(
                "next",
                "predict_scaling",
                {"fit_id": fit["fit_id"], "compute": [target * NEXT_COMPUTE_FACTOR], "level": self.cfg.level},
            )
        if decision["kind"] == "none":
            text = (
                f"More seeds of the variants left (this study ran {self.cfg.seeds} per variant), or a target further "
                f"out (--rungs {self.cfg.rungs + 1})."
            )
        else:
            text = f"Scale {name}: one run at {NEXT_COMPUTE_FACTOR:g}x the target compute."
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
            if cfg.overlap == "on" or (cfg.overlap == "auto" and run.gpu_count >= cfg.tp):
                await run.overlap()
            elif cfg.overlap == "auto":
                run.skip_overlap()
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
