"""Where the project's data folders are, and the one check that keeps file inputs inside allowed roots."""

import os
from collections.abc import Iterable
from pathlib import Path

from servers.core.errors import InputError

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _data_dir(name: str) -> Path:
    # A checkout keeps the folders at the top level; the wheel carries them under servers/_data.
    for candidate in (_PACKAGE_DIR.parent / name, _PACKAGE_DIR / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"the {name}/ folder is neither beside the package nor inside it ({_PACKAGE_DIR})")


def resources_dir() -> Path:
    """The folder whose files are served as MCP resources."""
    return _data_dir("resources")


def prompts_dir() -> Path:
    """The folder whose markdown files are served as MCP prompts."""
    return _data_dir("prompts")


def _fs_limits(root: Path) -> tuple[int, int]:
    """The file system's longest file name and longest path, in bytes (POSIX defaults where it cannot say)."""
    try:
        return os.pathconf(root, "PC_NAME_MAX"), os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return 255, 4096


def _resolved_roots(roots: Iterable[Path]) -> list[Path]:
    resolved = []
    for root in roots:
        try:
            resolved.append(Path(root).expanduser().resolve())
        except (OSError, RuntimeError):
            # A root that cannot be resolved (a symlink loop) holds no file; the others still serve.
            continue
    return resolved


def resolve_inside_roots(path: str | os.PathLike[str], roots: Iterable[Path], *, what: str = "path") -> Path:
    """Resolve `path` (symlinks and `..` included) and require it to lie inside one of `roots`.

    Relative paths are taken relative to the first root. Raises InputError naming the roots otherwise, and for a
    path that cannot be resolved (a name too long for the file system, a symlink loop, an unknown `~user`). The
    error never says where a path outside the roots leads: that would show the caller files it may not read.
    """
    given = list(roots)
    roots = _resolved_roots(given)
    if not roots:
        if given:
            raise InputError(
                f"none of the allowed roots can be resolved ({', '.join(str(r) for r in given)}), so no {what} can be "
                "read; fix LLM_INFRA_MCP_ALLOWED_ROOTS"
            )
        raise InputError(f"no allowed roots are configured, so no {what} can be read (set LLM_INFRA_MCP_ALLOWED_ROOTS)")
    listed = ", ".join(str(r) for r in roots)
    text = os.fspath(path)
    if "\x00" in text:
        raise InputError(f"{what} contains a NUL byte; accepted: a file path inside the allowed roots ({listed})")
    name_max, path_max = _fs_limits(roots[0])
    try:
        encoded = os.fsencode(text)
    except UnicodeError:
        raise InputError(f"{what} is not valid text for a file name; accepted: a file path inside ({listed})") from None
    if len(encoded) > path_max:
        raise InputError(f"{what} is {len(encoded)} bytes long; accepted: at most {path_max} bytes")
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > name_max:
        raise InputError(
            f"{what} has a component of {longest} bytes; accepted: file and folder names of at most {name_max} bytes"
        )
    try:
        raw = Path(text).expanduser()
    except RuntimeError:  # `~someone` for a user this machine does not know
        raise InputError(f"{what} {text!r} starts with an unknown ~user; accepted: a path inside ({listed})") from None
    try:
        resolved = (raw if raw.is_absolute() else roots[0] / raw).resolve()
    except RuntimeError:  # Python < 3.13: a symlink loop
        raise InputError(f"{what} {text!r} cannot be resolved: it runs into a symlink loop") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"{what} {text!r} cannot be resolved: {reason}") from None
    for root in roots:
        if resolved == root or resolved.is_relative_to(root):
            if len(os.fsencode(str(resolved))) > path_max:
                raise InputError(f"{what} {text!r} resolves to a path longer than {path_max} bytes")
            return resolved
    raise InputError(
        f"{what} {text!r} is outside the allowed roots ({listed}); "
        "move the file under one of them or add a root with LLM_INFRA_MCP_ALLOWED_ROOTS"
    )
