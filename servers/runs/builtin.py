"""The bundled run readers, in detection order: the more specific sources first (a TRL output directory holds
TensorBoard event files too, so TRL is asked before TensorBoard; a W&B export is a CSV, asked before nothing else
claims CSVs). Each names its module's detect and read functions by "module:attr", imported when first used."""

from servers.runs.registry import ReaderInfo, register

BUILTIN: tuple[ReaderInfo, ...] = (
    ReaderInfo(
        "trl",
        "a TRL/transformers Trainer output directory or checkpoint (trainer_state.json with log_history), or that file",
        "servers.runs.trl:detect",
        "servers.runs.trl:read",
    ),
    ReaderInfo(
        "verl",
        'verl\'s file logger output: JSON lines {"step": N, "data": {...}} (VERL_FILE_LOGGER_PATH), a .jsonl file',
        "servers.runs.verl:detect",
        "servers.runs.verl:read",
    ),
    ReaderInfo(
        "suite",
        'this suite\'s metrics file: JSON lines {"step": N, "time": t, key: value, ...} (a job\'s metrics.jsonl)',
        "servers.runs.suite:detect",
        "servers.runs.suite:read",
    ),
    ReaderInfo(
        "wandb",
        "a W&B offline run (WANDB_MODE=offline): wandb/offline-run-*/, its run-*.wandb file, or the wandb/ "
        "directory (its latest run); or an exported history (.csv or .parquet with a _step column)",
        "servers.runs.wandb_reader:detect",
        "servers.runs.wandb_reader:read",
        package="wandb",
    ),
    ReaderInfo(
        "mlflow",
        "an MLflow run: mlflow+http://HOST:PORT/RUN_ID or the UI's http://HOST:PORT/#/experiments/E/runs/RUN_ID "
        "(a tracking server on an allowed host), or a local store (mlruns/ or a run folder in it, mlflow.db, "
        "sqlite:///mlflow.db); ?run=RUN_ID picks a run, else the latest is read",
        "servers.runs.mlflow_reader:detect",
        "servers.runs.mlflow_reader:read",
        package="mlflow",
    ),
    ReaderInfo(
        "tensorboard",
        "a directory of TensorBoard event files (*tfevents*, searched recursively) or one event file",
        "servers.runs.tensorboard:detect",
        "servers.runs.tensorboard:read",
        package="tensorboard",
    ),
)


def register_all() -> None:
    for info in BUILTIN:
        register(info, replace=True)
