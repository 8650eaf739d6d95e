"""The environment policy of training jobs: which variables a job may set, and to what.

One rule for every backend: training.plan checks every spec with `check_env` before any backend sees it, and the
Slurm backend checks the variables of its batch script again with `env_refusal`. Plain module, standard library and
servers.core only.
"""

import re

from servers.core.errors import InputError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A job may set only variables that tune the libraries a training run uses, or its own (JOB_*). An allow-list:
# a deny list always misses one (GCONV_PATH, PYTHONWARNINGS importing a module, NCCL_NET_PLUGIN loading a
# library, PET_* driving torchrun...).
ALLOWED_ENV_PREFIXES = (
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "GLOO_",
    "NVTE_",
    "JOB_",
)
ALLOWED_ENV_NAMES = frozenset(
    {"TOKENIZERS_PARALLELISM", "PYTHONHASHSEED", "PYTHONFAULTHANDLER", "TZ", "NVIDIA_TF32_OVERRIDE"}
)
# The job's own variables: only its script reads them, and the script can open any path itself, so they may hold
# paths (JOB_DATA_FILE=/data/x); every other variable is read by a library.
OWN_ENV_PREFIX = "JOB_"
# Inside those prefixes, what still changes which code runs or what the launcher decides: torchrun's own
# variables, devices, the toolchain.
DENIED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "TORCH_HOME",
        "TORCH_CUDA_ARCH_LIST",
        "NCCL_SOCKET_IFNAME_OVERRIDE",
    }
)
DENIED_ENV_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_", "NCCL_RAS_")  # NCCL_RAS_*: a listening socket
# Variables the libraries read as a file, folder, library, pipe or socket they write, read or load: a job may not
# set them, whatever the value (a path outside the job's folders escapes the roots and the log cap, a library
# runs code). Known names, by library; the name rules below also catch most of them, and the ones to come.
PATH_VALUED_ENV = frozenset(
    {
        # NCCL
        "NCCL_DEBUG_FILE",
        "NCCL_TOPO_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "NCCL_TOPO_DUMP_FILE_RANK",
        "NCCL_GRAPH_FILE",
        "NCCL_GRAPH_DUMP_FILE",
        "NCCL_GRAPH_DUMP_FILE_RANK",
        "NCCL_CONF_FILE",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_TUNER_CONFIG_FILE",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_ENV_PLUGIN",
        "NCCL_PROXY_PROFILE",
        "NCCL_IBVERBS_LIB",
        "NCCL_LIBIBVERBS_SO",
        # torch
        "TORCH_LOGS_OUT",
        "TORCH_TRACE",
        "TORCH_COMPILE_DEBUG_DIR",
        "TORCH_EXTENSIONS_DIR",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",  # dumps to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (default /tmp/nccl_trace_rank_)
        "TORCH_FR_DUMP_TEMP_FILE",
        "PYTORCH_TUNABLEOP_FILENAME",
        "PYTORCH_TUNABLEOP_UNTUNED_FILENAME",
        "PYTORCH_KERNEL_CACHE_PATH",
        # CUDA, cuDNN, cuBLAS
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY",
        "CUDA_CACHE_PATH",
        "CUDA_INJECTION64_PATH",
        "CUDA_COREDUMP_FILE",
        "CUDA_COREDUMP_PIPE",
        "CUDA_LOG_FILE",
        "CUDNN_LOGDEST_DBG",
        "CUBLAS_LOGDEST_DBG",
        # OpenMP, Intel OpenMP, MKL
        "OMP_TOOL",
        "OMP_TOOL_LIBRARIES",
        "OMP_TOOL_VERBOSE_INIT",
        "KMP_STATS_FILE",
        "KMP_CPUINFO_FILE",
        "MKL_VERBOSE_OUTPUT_FILE",
    }
)
# Words of a name (split at '_') that say it holds a path, anywhere in it (NCCL_GRAPH_DUMP_FILE, CUDA_CACHE_PATH,
# NCCL_LIBIBVERBS_SO), or only as its last word (TORCH_LOGS_OUT, TORCH_TRACE: TORCH_NCCL_TRACE_BUFFER_SIZE is a
# number). Not SOCKET (NCCL_SOCKET_IFNAME is an interface) nor CONFIG (CUBLAS_WORKSPACE_CONFIG=:4096:8): their
# values are checked like every other.
PATH_NAME_WORDS = frozenset(
    {
        "FILE",
        "FILES",
        "FILENAME",
        "FILENAMES",
        "DIR",
        "DIRS",
        "DIRECTORY",
        "DIRECTORIES",
        "FOLDER",
        "PATH",
        "PATHS",
        "LIB",
        "LIBS",
        "LIBRARY",
        "LIBRARIES",
        "SO",
        "PLUGIN",
        "PLUGINS",
        "PRELOAD",
        "HOME",
        "ROOT",
        "PREFIX",
        "CONF",
        "DUMP",
        "PIPE",
        "LOGDEST",
    }
)
PATH_NAME_LAST_WORDS = frozenset({"OUT", "OUTPUT", "TRACE", "TRACES", "LOG", "DEST"})
# Names the word rules would catch whose value is a plain setting, never a path (their values are still checked).
PLAIN_VALUED_ENV = frozenset(
    {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "KMP_DUPLICATE_LIB_OK"}
)
# Variables whose plain values hold a '/' of their own: accepted in that form only.
ENV_VALUE_FORMS: dict[str, tuple[re.Pattern[str], str]] = {
    "TZ": (
        re.compile(r"(?!.*\.\.)[A-Za-z0-9_+<-][A-Za-z0-9_+,.:<>/-]{0,127}"),
        "a zone name such as UTC or Europe/Paris, or a POSIX TZ string (no leading '/' or ':', no '..')",
    ),
    "NCCL_IB_ADDR_RANGE": (
        re.compile(r"[0-9A-Fa-f.:]{2,45}/[0-9]{1,3}"),
        "an address range such as 10.0.0.0/16",
    ),
}
# Control characters (C0, DEL, C1) and the Unicode line and paragraph separators: never in a library's setting.
ENV_VALUE_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _path_word(key: str) -> str | None:
    """Why `key` names a path, by its name (`PATH_VALUED_ENV`, `PATH_NAME_WORDS`, `PATH_NAME_LAST_WORDS`), or None."""
    if key in PATH_VALUED_ENV:
        return "a variable its library takes as a path"
    if key in PLAIN_VALUED_ENV:
        return None
    words = key.split("_")
    word = next((w for w in words[1:] if w in PATH_NAME_WORDS), None)
    if word is None and len(words) > 1 and words[-1] in PATH_NAME_LAST_WORDS:
        word = words[-1]
    return f"{word!r} in its name" if word is not None else None


def env_refusal(key: str, value: str | None = None) -> str | None:
    """Why a job may not set `key` (to `value`, when given), or None if it may. The one rule of every backend:
    training.plan checks every spec with it (check_env) before any backend sees the spec, and the Slurm backend
    checks its batch script's variables with it again.

    The name: on the allow-list (prefixes of the libraries a run tunes, or the job's own JOB_*), not the launcher's
    (CUDA_VISIBLE_DEVICES, TORCHELASTIC_*...), and, unless JOB_*, not a file, folder, library, pipe or socket
    (`PATH_VALUED_ENV`, or a word of `PATH_NAME_WORDS` in it, or one of `PATH_NAME_LAST_WORDS` last). The value,
    unless JOB_*: no control character, and nothing that reads as a path ('/' anywhere, or a leading '~' or '.'),
    but in the forms of `ENV_VALUE_FORMS` (TZ=Europe/Paris). A JOB_* variable is read by the job's script alone,
    which can open any path itself: it may hold paths (no NUL byte)."""
    if not ENV_NAME.fullmatch(key):
        return "not a valid name: a letter or '_', then letters, digits and '_' (at most 128)"
    if key in DENIED_ENV or key.startswith(DENIED_ENV_PREFIXES):
        return (
            "it would change which code runs, what the launcher decides or what the job exposes (devices, the "
            "toolchain, torchrun's variables, NCCL's RAS socket)"
        )
    if not (key in ALLOWED_ENV_NAMES or key.startswith(ALLOWED_ENV_PREFIXES)):
        return "not on the allow-list"
    own = key.startswith(OWN_ENV_PREFIX)
    if not own and (word := _path_word(key)) is not None:
        return (
            f"it names a file, folder, library, pipe or socket ({word}), which the library would write, read or "
            "load wherever it points, outside the job's folders and the log cap"
        )
    if value is None:
        return None
    if "\x00" in value:
        return "its value contains a NUL byte"
    if own:
        return None
    shown = repr(value if len(value) <= 80 else value[:77] + "...")
    if ENV_VALUE_CONTROL.search(value):
        return f"its value {shown} contains a control character or a line separator"
    form = ENV_VALUE_FORMS.get(key)
    if form is not None:
        return None if form[0].fullmatch(value) else f"its value {shown} is not {form[1]}"
    if "/" in value or value.startswith(("~", ".")):
        return (
            f"its value {shown} reads as a path ('/', or a leading '~' or '.'): a library setting is a plain value "
            "(a path belongs in a JOB_* variable, which only the script reads)"
        )
    return None


def check_env(env: dict[str, str]) -> None:
    """InputError naming every variable of `env` a job may not set, why, and what is accepted (`env_refusal`)."""
    problems = []
    for key, value in env.items():
        why = env_refusal(key, value)
        if why is not None:
            problems.append(f"env: {key!r} may not be set by a job: {why}")
    if problems:
        accepted = ", ".join(f"{p}*" for p in ALLOWED_ENV_PREFIXES) + ", " + ", ".join(sorted(ALLOWED_ENV_NAMES))
        words, last = ", ".join(sorted(PATH_NAME_WORDS)), ", ".join(sorted(PATH_NAME_LAST_WORDS))
        forms = " and ".join(f"{k} as {d}" for k, (_, d) in ENV_VALUE_FORMS.items())
        raise InputError(
            "\n".join(problems) + f"\naccepted: {accepted}; not CUDA_VISIBLE_DEVICES, TORCHELASTIC_*, NCCL_RAS_*; "
            f"outside JOB_*, no name holding {words} or ending in {last} (a file, folder or library; "
            f"{', '.join(sorted(PLAIN_VALUED_ENV))} are plain settings), and no value with a control character, a "
            f"'/' or a leading '~' or '.' (except {forms}); put the script's own settings, paths included, in JOB_* "
            "variables or its args"
        )
