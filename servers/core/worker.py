"""The process that does a job's work: `python -m servers.core.worker JOB_DIR`.

Started by the supervisor in a process group of its own, in the job's run/ folder (JobFiles.run_dir), with
stdout and stderr going to logs/main.log.
It imports the job kind's work function named in job.json, calls it with the spec and a JobContext, and
writes result.json on success or error.json (type and message of the exception) on failure.
"""

import importlib
import os
import sys
import traceback
from pathlib import Path

from servers.core.jobfiles import JobContext, JobFiles, atomic_write_json, read_json


def _state_channel() -> int | None:
    """The supervisor's pipe for engine states (engine_state.py), taken out of the environment and kept from every
    process the work starts: only this process reports."""
    from servers.core.engine_state import STATE_FD_ENV

    value = os.environ.pop(STATE_FD_ENV, None)
    if value is None or not value.isdigit():
        return None
    fd = int(value)
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return None
    return fd


def main(argv: list[str]) -> int:
    files = JobFiles(Path(argv[0]).resolve())
    descriptor = read_json(files.descriptor, 1024 * 1024)
    if not isinstance(descriptor, dict):
        print(f"worker: cannot read {files.descriptor}", file=sys.stderr)
        return 2
    ctx = JobContext(descriptor["id"], descriptor["kind"], files, state_fd=_state_channel())
    module_name, _, function_name = descriptor["entry"].partition(":")
    if descriptor.get("network") == "isolated":
        # Before the work is imported: a user namespace can be entered only while the process has one thread.
        from servers.core import netns

        try:
            netns.enter()
        except netns.IsolationError as exc:
            message = f"could not isolate the job's network: {exc.strerror}; LLM_INFRA_MCP_JOB_NETWORK=host skips it"
            atomic_write_json(files.error, {"type": "IsolationError", "message": message})
            print(f"worker: {message}", file=sys.stderr)
            return 1
        for key, value in netns.LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
    try:
        work = getattr(importlib.import_module(module_name), function_name)
        result = work(descriptor["spec"], ctx)
        atomic_write_json(files.result, result if result is not None else {})
        return 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code != 0:
            atomic_write_json(files.error, {"type": "SystemExit", "message": f"the work exited with code {code}"})
        else:
            atomic_write_json(files.result, {})
        return code
    except BaseException as exc:  # everything else is the work failing; the traceback goes to the log
        traceback.print_exc()
        atomic_write_json(files.error, {"type": type(exc).__name__, "message": str(exc)[:4000]})
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
