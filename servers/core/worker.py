"""The process that does a job's work: `python -m servers.core.worker JOB_DIR`.

Started by the supervisor in a process group of its own, in the job's run/ folder (JobFiles.run_dir), with
stdout and stderr going to logs/main.log.
It imports the job kind's work function named in job.json, calls it with the spec and a JobContext, and
writes result.json on success or error.json (type and message of the exception) on failure.

The job's end is recorded once this process is gone, so it leaves quickly (`quick_exit`): the interpreter's own
teardown of every imported module takes ~60 ms and is skipped when nothing else of the work still runs here.
"""

import atexit
import gc
import importlib
import io
import os
import sys
import threading
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


def quick_exit(code: int) -> None:
    """Exit with `code` as a normal exit would end the work, without the interpreter's teardown: the atexit
    handlers run and every open file is flushed, then os._exit. Where a thread of the work other than a daemon is
    still running, a normal exit waits for it: then this returns and the caller exits normally."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    files = [f for f in gc.get_objects() if isinstance(f, io.TextIOWrapper | io.BufferedWriter | io.BufferedRandom)]
    for text_first in (True, False):  # text layers first: they write into their buffers
        for f in files:
            if isinstance(f, io.TextIOWrapper) is text_first:
                try:
                    if not f.closed:
                        f.flush()
                except (OSError, ValueError):
                    pass
    os._exit(code)


def main(argv: list[str]) -> int:
    """The work, then a quick exit (never returns unless a thread of the work still runs)."""
    code = _work(argv)
    quick_exit(code)
    return code


def _work(argv: list[str]) -> int:
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
        import traceback

        traceback.print_exc()
        atomic_write_json(files.error, {"type": type(exc).__name__, "message": str(exc)[:4000]})
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
