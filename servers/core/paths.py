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


def resolve_inside_roots(path: str | os.PathLike[str], roots: Iterable[Path], *, what: str = "path") -> Path:
    """Resolve `path` (symlinks and `..` included) and require it to lie inside one of `roots`.

    Relative paths are taken relative to the first root. Raises InputError naming the roots otherwise.
    """
    roots = [Path(r).resolve() for r in roots]
    if not roots:
        raise InputError(f"no allowed roots are configured, so no {what} can be read (set LLM_INFRA_MCP_ALLOWED_ROOTS)")
    raw = Path(os.fspath(path)).expanduser()
    if "\x00" in str(raw):
        raise InputError(f"{what} contains a NUL byte")
    resolved = (raw if raw.is_absolute() else roots[0] / raw).resolve()
    for root in roots:
        if resolved == root or resolved.is_relative_to(root):
            return resolved
    listed = ", ".join(str(r) for r in roots)
    raise InputError(
        f"{what} {str(path)!r} resolves to {resolved}, which is outside the allowed roots ({listed}); "
        "move the file under one of them or add a root with LLM_INFRA_MCP_ALLOWED_ROOTS"
    )
