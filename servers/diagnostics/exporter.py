"""dcgm-exporter (Prometheus text exposition format): fetch, parse, summarise per GPU. Plain module.

parse_prometheus_text never raises: lines it cannot read are skipped and counted (``skipped_lines`` on the list it
returns). summarise_dcgm maps the DCGM metrics of each GPU into a GpuSnapshot and judges it with health.evaluate, so
the findings follow the same rules as nvidia-smi and NVML input; a non-zero Xid metric adds an xid_reported finding.
scrape fetches a metrics URL with bounded time and size, only when the URL is one the person allowed (the setting
LLM_INFRA_MCP_EXPORTER_URLS, see `check_allowed`), and raises InputError for anything that is not a 200 answer of
Prometheus text. Nothing of a response that is not Prometheus text is quoted back (the URL could be any local service).
summarise_dcgm lists at most MAX_GPUS GPUs and MAX_METRICS metrics per GPU, counting the rest.
"""

from __future__ import annotations

import http
import math
import re
from collections.abc import Sequence
from typing import Any

import anyio
from pydantic import Field

from servers.core import ENV_PREFIX
from servers.core.errors import InputError
from servers.core.models import Model
from servers.diagnostics.bounds import MAX_NOTES, MAX_STR, cap_notes, clip, clip_str, fit, pick, scaled
from servers.diagnostics.findings import ATTENTION_RANK, Status
from servers.diagnostics.health import evaluate
from servers.diagnostics.smi import decode_clock_events, normalise_bus_id
from servers.diagnostics.snapshot import GpuHealth, GpuSnapshot

DEFAULT_MAX_BYTES = 8 * 2**20
ALLOW_SETTING = ENV_PREFIX + "EXPORTER_URLS"
MAX_GPUS = 64  # GPUs one summary lists (an exporter serves one node); status and counts cover them all
MAX_METRICS = 128  # DCGM metrics listed per GPU (dcgm-exporter's default set has about 40)
MAX_METRIC_NAME = 128
PROMETHEUS_TYPES = ("text/plain", "application/openmetrics-text")


class Sample(Model):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float = Field(description="NaN and +/-Inf are kept as floats")
    timestamp_ms: int | None = None


class SampleList(list[Sample]):
    """A list of samples that also says how many lines could not be read."""

    skipped_lines: int = 0
    skipped_examples: list[str]

    def __init__(self, samples: list[Sample] | None = None) -> None:
        super().__init__(samples or [])
        self.skipped_lines = 0
        self.skipped_examples = []


# ---------------------------------------------------------------------------------------------------------------------
# Prometheus text format

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_FLOAT = re.compile(r"^[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)$")
_SPECIAL = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_value(token: str) -> float | None:
    special = _SPECIAL.get(token.lower())
    if special is not None:
        return special
    if len(token) > 64 or not _FLOAT.match(token):
        return None
    return float(token)


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int] | None:
    """Labels from just after '{'; returns (labels, position after '}') or None when malformed."""
    labels: dict[str, str] = {}
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None:
            return None
        name = match.group(0)
        pos = match.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n or line[pos] != "=":
            return None
        pos += 1
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n or line[pos] != '"':
            return None
        pos += 1
        chars: list[str] = []
        while True:
            if pos >= n:
                return None
            ch = line[pos]
            if ch == "\\":
                if pos + 1 >= n:
                    return None
                nxt = line[pos + 1]
                chars.append(_ESCAPES.get(nxt, "\\" + nxt))
                pos += 2
                continue
            if ch == '"':
                pos += 1
                break
            chars.append(ch)
            pos += 1
        labels[name] = "".join(chars)
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
            continue
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        return None


def _parse_sample(line: str) -> Sample | None:
    match = _METRIC_NAME.match(line)
    if match is None:
        return None
    name = match.group(0)
    pos = match.end()
    labels: dict[str, str] = {}
    brace = pos
    while brace < len(line) and line[brace] in " \t":  # "tokens may be separated by any number of blanks"
        brace += 1
    if brace < len(line) and line[brace] == "{":
        pos = brace
        parsed = _parse_labels(line, pos + 1)
        if parsed is None:
            return None
        labels, pos = parsed
    rest = line[pos:]
    if rest and rest[0] not in " \t":
        return None
    tokens = rest.split()
    if len(tokens) not in (1, 2):
        return None
    value = _parse_value(tokens[0])
    if value is None:
        return None
    timestamp = None
    if len(tokens) == 2:
        if not re.fullmatch(r"-?\d{1,19}", tokens[1]):
            return None
        timestamp = int(tokens[1])
    return Sample(name=name, labels=labels, value=value, timestamp_ms=timestamp)


def parse_prometheus_text(text: str) -> SampleList:
    """Samples of a Prometheus text exposition (HELP/TYPE/comments skipped); unreadable lines are counted."""
    samples = SampleList()
    if not isinstance(text, str):
        return samples
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _parse_sample(line)
        if sample is None:
            samples.skipped_lines += 1
            if len(samples.skipped_examples) < 3:
                samples.skipped_examples.append(line[:120])
            continue
        samples.append(sample)
    return samples


# ---------------------------------------------------------------------------------------------------------------------
# DCGM summary


class ExporterGpu(Model):
    hostname: str | None = None
    gpu: str | None = Field(default=None, description="The exporter's gpu label (the GPU index on that host)")
    uuid: str | None = None
    model_name: str | None = None
    pci_bus_id: str | None = None
    metrics: dict[str, float | None] = Field(
        default_factory=dict,
        description=f"The DCGM values read for this GPU, by DCGM field name; NaN/Inf as None; at most {MAX_METRICS}",
    )
    metrics_omitted: int = Field(default=0, description="DCGM metrics read for this GPU but not listed")
    tensor_active: float | None = Field(default=None, description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, 0-1")
    nvlink_bandwidth_total: float | None = Field(default=None, description="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
    health: GpuHealth


class ExporterSummary(Model):
    samples: int = Field(description="Samples read")
    dcgm_samples: int = Field(description="Samples of DCGM_FI_* metrics")
    skipped_lines: int = Field(default=0, description="Lines that were not valid Prometheus text")
    status: Status = Field(description="The worst GPU status")
    counts: dict[str, int] = Field(default_factory=dict, description="GPUs per status, listed or not")
    gpus: list[ExporterGpu] = Field(description=f"At most {MAX_GPUS}, those not healthy first; see gpus_omitted")
    gpus_omitted: int = Field(default=0, description="GPUs summarised but not listed")
    warnings: list[str] = Field(default_factory=list)
    text: str = Field(description="A short human summary")


_STATUS_ORDER = ATTENTION_RANK

# DCGM field -> (GpuSnapshot field, kind)
_SNAPSHOT_FIELDS: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", "float"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("memory_temperature_c", "float"),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": ("temperature_slowdown_c", "float"),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": ("temperature_shutdown_c", "float"),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": ("temperature_max_operating_c", "float"),
    "DCGM_FI_DEV_POWER_USAGE": ("power_draw_w", "float"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_w", "float"),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_w", "float"),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_gpu_pct", "float"),
    "DCGM_FI_DEV_FB_USED": ("memory_used_mib", "float"),
    "DCGM_FI_DEV_FB_TOTAL": ("memory_total_mib", "float"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_volatile_uncorrectable_total", "int"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_aggregate_uncorrectable_total", "int"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_volatile_correctable_total", "int"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_aggregate_correctable_total", "int"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", "int"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", "int"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped_rows_failure", "bool"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped_rows_pending", "bool"),
    "DCGM_FI_DEV_RETIRED_SBE": ("retired_pages_sbe", "int"),
    "DCGM_FI_DEV_RETIRED_DBE": ("retired_pages_dbe", "int"),
    "DCGM_FI_DEV_RETIRED_PENDING": ("retired_pages_pending", "bool"),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_gen_current", "int"),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("pcie_gen_max", "int"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_width_current", "int"),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("pcie_width_max", "int"),
    "DCGM_FI_DEV_PERSISTENCE_MODE": ("persistence_mode", "bool"),
    "DCGM_FI_DEV_XID_ERRORS": ("xid_errors", "int"),
}
_CLOCK_REASON_FIELDS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
_EXTRA_FIELDS = {
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "nvlink_bandwidth_total",
}
_FIELD_PREFIX = ("DCGM_FI_", "DCGM_EXP_")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _gpu_key(labels: dict[str, str]) -> tuple[str, str] | None:
    host = clip_str(labels.get("Hostname") or labels.get("hostname") or "")
    ident = labels.get("UUID") or labels.get("uuid")
    if ident:
        return host, clip_str(ident)
    gpu = labels.get("gpu")
    if gpu is not None and gpu != "":
        return host, f"gpu:{clip_str(gpu)}"
    bus = labels.get("pci_bus_id")
    if bus:
        return host, f"pci:{clip_str(bus)}"
    return None


def _label(labels: dict[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return clip_str(value, MAX_STR)
    return None


def _convert(value: float, kind: str) -> float | int | bool | None:
    finite = _finite(value)
    if finite is None:
        return None
    if kind == "float":
        return finite
    if kind == "bool":
        return finite != 0
    if abs(finite) > 2**62:
        return None
    return int(finite)


def summarise_dcgm(
    samples: list[Sample], *, skipped_lines: int | None = None, interconnect_expected: str | None = None
) -> ExporterSummary:
    """Per-GPU snapshot, health and extra metrics from dcgm-exporter samples (other metrics are ignored)."""
    skipped = skipped_lines if skipped_lines is not None else getattr(samples, "skipped_lines", 0)
    warnings: list[str] = []
    groups: dict[tuple[str, str], list[Sample]] = {}
    dcgm = 0
    unlabelled = 0
    for sample in samples:
        if not sample.name.startswith(_FIELD_PREFIX):
            continue
        dcgm += 1
        key = _gpu_key(sample.labels)
        if key is None:
            unlabelled += 1
            continue
        groups.setdefault(key, []).append(sample)
    if skipped:  # not quoted: lines that are not Prometheus text may come from anything
        warnings.append(f"{skipped} line(s) were not valid Prometheus text and were skipped")
    if unlabelled:
        warnings.append(f"{unlabelled} DCGM sample(s) had no gpu/UUID label and were not attributed to a GPU")

    gpus: list[ExporterGpu] = []
    for (host, _), group in groups.items():
        labels: dict[str, str] = {}
        for sample in group:
            for k, v in sample.labels.items():
                labels.setdefault(k, v)
        values: dict[str, object] = {}
        metrics: dict[str, float | None] = {}
        metrics_omitted = 0
        extras: dict[str, float | None] = {}
        clock_mask: int | None = None
        for sample in group:
            if sample.name not in metrics:
                if len(metrics) < MAX_METRICS and len(sample.name) <= MAX_METRIC_NAME:
                    metrics[sample.name] = _finite(sample.value)
                else:
                    metrics_omitted += 1
            if sample.name in _SNAPSHOT_FIELDS:
                field, kind = _SNAPSHOT_FIELDS[sample.name]
                converted = _convert(sample.value, kind)
                if converted is not None:
                    values.setdefault(field, converted)
            elif sample.name in _CLOCK_REASON_FIELDS:
                converted = _convert(sample.value, "int")
                if isinstance(converted, int) and converted >= 0 and clock_mask is None:
                    clock_mask = converted
            elif sample.name in _EXTRA_FIELDS:
                extras.setdefault(_EXTRA_FIELDS[sample.name], _finite(sample.value))
        index = clip(labels.get("gpu"), 32)
        bus_label = labels.get("pci_bus_id")
        snapshot = GpuSnapshot(
            index=int(index) if index is not None and index.isascii() and index.isdigit() and len(index) < 6 else None,
            name=_label(labels, "modelName"),
            uuid=_label(labels, "UUID", "uuid"),
            pci_bus_id=normalise_bus_id(bus_label) if bus_label and len(bus_label) <= 64 else None,
            driver_version=_label(labels, "DCGM_FI_DRIVER_VERSION"),
            clock_events=decode_clock_events(clock_mask) if clock_mask is not None else {},
            **values,  # type: ignore[arg-type]
        )
        health = evaluate(snapshot, interconnect_expected=interconnect_expected)
        gpus.append(
            ExporterGpu(
                hostname=host or None,
                gpu=index,
                uuid=snapshot.uuid,
                model_name=snapshot.name,
                pci_bus_id=snapshot.pci_bus_id,
                metrics=metrics,
                metrics_omitted=metrics_omitted,
                tensor_active=extras.get("tensor_active"),
                nvlink_bandwidth_total=extras.get("nvlink_bandwidth_total"),
                health=health,
            )
        )
    gpus.sort(key=lambda g: (g.hostname or "", g.health.gpu.index if g.health.gpu.index is not None else 1 << 30))
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.health.status] = counts.get(g.health.status, 0) + 1
    worst = max((g.health.status for g in gpus), key=lambda s: _STATUS_ORDER[s], default="unknown")
    if not gpus:
        reason = (
            "no DCGM metrics were found (is this a dcgm-exporter /metrics endpoint?)"
            if dcgm == 0
            else "DCGM metrics were found but none carried a gpu or UUID label"
        )
        warnings.insert(0, reason)

    def build(scale: float) -> ExporterSummary:
        listed, omitted = pick(gpus, scaled(MAX_GPUS, scale), lambda g: _STATUS_ORDER[g.health.status])
        if not gpus:
            text = warnings[0]
        else:
            lines = [
                f"{len(gpus)} GPU(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; worst {worst}"
            ]
            for g in listed:
                where = f"{g.hostname + ' ' if g.hostname else ''}GPU {g.gpu if g.gpu is not None else g.uuid}"
                problems = [f"{f.severity}: {f.what}" for f in g.health.findings if f.severity != "info"]
                lines.append(f"- {where}: {g.health.status}" + (f" ({'; '.join(problems)})" if problems else ""))
            if omitted:
                lines.append(f"- {omitted} more GPU(s) counted above but not listed (those not healthy come first)")
            text = "\n".join(lines)
        return ExporterSummary(
            samples=len(samples),
            dcgm_samples=dcgm,
            skipped_lines=skipped,
            status=worst,
            counts=counts,
            gpus=listed,
            gpus_omitted=omitted,
            warnings=cap_notes(warnings, scaled(MAX_NOTES, scale)),
            text=text,
        )

    return fit(build)


# ---------------------------------------------------------------------------------------------------------------------
# fetching


def _check_url(url: str) -> Any:
    import httpx  # here, not at the top: the server imports this module at start-up

    if not isinstance(url, str) or not url.strip():
        raise InputError("url: a metrics URL is required, e.g. http://node-7:9400/metrics")
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise InputError(f"url: {clip_str(url, 200)!r} is not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise InputError(
            f"url: only http and https URLs can be scraped, not {clip_str(parsed.scheme, 20) or 'a scheme-less'} URL "
            f"{clip_str(url, 200)!r}"
        )
    if not parsed.host:
        raise InputError(f"url: {clip_str(url, 200)!r} has no host")
    if parsed.userinfo:
        raise InputError("url: a user name or password in the URL is not accepted (nor needed by dcgm-exporter)")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InputError(f"url: port {parsed.port} is outside 1-65535 (dcgm-exporter listens on 9400)")
    return parsed


def _shown(url: Any) -> str:
    """scheme://host:port/path of a parsed URL, for messages (no query, no user info)."""
    host = f"[{url.host}]" if ":" in url.host else url.host
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{host}{port}{url.path}"


def _effective_port(url: Any) -> int:
    return url.port if url.port is not None else (443 if url.scheme == "https" else 80)


def check_allowed(url: str, allowed: Sequence[str]) -> Any:
    """The parsed URL when `allowed` (the setting exporter_urls) permits it, else InputError saying what to set.

    An entry permits a URL with exactly its scheme, host and port (80/443 when not written) whose path is the entry's
    path or lies below it, segment by segment (/metrics permits /metrics and /metrics/x, not /metricsx); its query
    is free. A URL with user info, dot segments or encoded slashes is refused whatever the list says.
    """
    import httpx

    target = _check_url(url)
    path = target.path
    raw_path = target.raw_path.split(b"?", 1)[0].lower()
    if b"%2f" in raw_path or b"%5c" in raw_path or "\\" in path or any(s in (".", "..") for s in path.split("/")):
        raise InputError("url: the path must not hold '.' or '..' segments or encoded slashes")
    for entry in allowed:
        try:
            rule = httpx.URL(entry)
        except (httpx.InvalidURL, ValueError, TypeError):
            continue
        if (rule.scheme, rule.host.lower(), _effective_port(rule)) != (
            target.scheme,
            target.host.lower(),
            _effective_port(target),
        ):
            continue
        base = rule.path.rstrip("/")
        if not base or path == base or path.startswith(base + "/"):
            return target
    how = (
        f"to allow it, add it (or a prefix: scheme://host:port/path) to the setting {ALLOW_SETTING} (URLs separated "
        "by commas) where the server is configured, and restart the server"
    )
    if not allowed:
        raise InputError(f"url: reading exporters is switched off ({ALLOW_SETTING} is empty); {how}")
    listed = ", ".join(clip_str(a, 100) for a in list(allowed)[:10]) + (" ..." if len(allowed) > 10 else "")
    raise InputError(f"url: {clip_str(_shown(target), 300)} is not an allowed exporter URL; accepted: {listed}; {how}")


def _socket_failure(exc: BaseException) -> bool:
    """An OS-level connect failure, alone or grouped (anyio's happy-eyeballs connect raises exception groups)."""
    if isinstance(exc, OSError | OverflowError):
        return True
    inner = getattr(exc, "exceptions", None)
    return isinstance(inner, tuple) and bool(inner) and all(_socket_failure(e) for e in inner)


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


async def scrape(url: str, *, allowed: Sequence[str], timeout_s: float = 10, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """GET a metrics URL that `allowed` permits (see check_allowed); the body as text. InputError for a URL not
    allowed or not valid, a non-200 answer, a body that is not text (Content-Type other than text/plain or
    OpenMetrics), a timeout or too much data. No error quotes the response.

    The whole exchange (connect, headers, body) must finish within timeout_s. Proxies from the environment are not
    used: exporters are reached on the cluster network. Redirects are not followed (they could lead anywhere).
    """
    import httpx

    target = check_allowed(url, allowed)
    shown = clip_str(_shown(target), 300)
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s <= 600):
        raise InputError(f"timeout_s must be between 0 and 600 seconds, not {timeout_s!r}")
    if not (isinstance(max_bytes, int) and max_bytes > 0):
        raise InputError(f"max_bytes must be a positive integer, not {max_bytes!r}")
    chunks: list[bytes] = []
    try:
        with anyio.fail_after(timeout_s):
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), trust_env=False, follow_redirects=False) as client,
                client.stream("GET", target, headers={"Accept": "text/plain"}) as response,
            ):
                status = response.status_code
                if status != 200:
                    try:
                        phrase = http.HTTPStatus(status).phrase
                    except ValueError:
                        phrase = "unknown status"
                    moved = " (a redirect; redirects are not followed)" if 300 <= status < 400 else ""
                    raise InputError(f"{shown} answered HTTP {status} {phrase}{moved}")
                kind = _media_type(response.headers.get("content-type", ""))
                if kind and kind not in PROMETHEUS_TYPES:
                    named = kind if re.fullmatch(r"[a-z0-9.+-]{1,40}/[a-z0-9.+-]{1,40}", kind) else "another type"
                    raise InputError(
                        f"{shown} answered with {named}, not Prometheus text exposition (text/plain); its body is "
                        "not read"
                    )
                declared = response.headers.get("content-length", "")
                if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > max_bytes:
                    raise InputError(
                        f"the response from {shown} is larger than {max_bytes} bytes ({declared} declared)"
                    )
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise InputError(
                            f"the response from {shown} is larger than {max_bytes} bytes; not read further"
                        )
                    chunks.append(chunk)
    except (TimeoutError, httpx.TimeoutException):
        raise InputError(f"{shown} did not answer within {timeout_s:g} s") from None
    except httpx.ConnectError as exc:
        raise InputError(f"could not connect to {shown}: {clip_str(str(exc), 200) or 'connection failed'}") from None
    except httpx.HTTPError as exc:  # protocol errors may quote the response: name the kind only
        raise InputError(f"could not fetch {shown}: {type(exc).__name__} (not a well-formed HTTP answer)") from None
    except InputError:
        raise
    except Exception as exc:
        if not _socket_failure(exc):
            raise
        raise InputError(f"could not connect to {shown} ({type(exc).__name__})") from None
    return b"".join(chunks).decode("utf-8", errors="replace")


def check_exposition(samples: SampleList, body: str) -> None:
    """InputError when a body is not Prometheus text: nothing readable in it, or more unreadable lines than samples.
    Nothing of the body is quoted."""
    if samples.skipped_lines and samples.skipped_lines >= max(1, len(samples)):
        raise InputError(
            f"the response is not Prometheus text exposition ({samples.skipped_lines} unreadable line(s), "
            f"{len(samples)} sample(s)); nothing of it is shown. Is the URL a dcgm-exporter /metrics endpoint?"
        )
    if not samples and "\x00" in body:
        raise InputError("the response is binary, not Prometheus text exposition; nothing of it is shown")


async def read_exporter(
    url: str,
    *,
    allowed: Sequence[str],
    timeout_s: float = 10,
    max_bytes: int = DEFAULT_MAX_BYTES,
    interconnect_expected: str | None = None,
) -> ExporterSummary:
    """scrape + parse_prometheus_text + check_exposition + summarise_dcgm."""
    body = await scrape(url, allowed=allowed, timeout_s=timeout_s, max_bytes=max_bytes)
    samples = await anyio.to_thread.run_sync(parse_prometheus_text, body)
    check_exposition(samples, body)
    return await anyio.to_thread.run_sync(lambda: summarise_dcgm(samples, interconnect_expected=interconnect_expected))
