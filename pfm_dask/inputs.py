"""Turn what the user typed into the ordered list of input files of a load.

Inputs may be files, directories (searched recursively), glob patterns, or
``@list.txt`` files holding one input per line (``#`` at the start of a line or
after a blank starts a comment). A named path that does not exist is refused
(:class:`ConfigError`: a typo, before any work); one that exists but cannot be
read is kept for the load to report. Duplicates (the same file reached twice,
by any name: same device and inode) are dropped, keeping the first. The order
is stable — the order given, with each directory's and glob's matches sorted by
path — because it becomes the file numbers in the PFM ``.ctl``.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Iterable

from .errors import ConfigError

__all__ = ["expand_inputs", "read_polygon", "file_key", "GSF_SUFFIXES"]

# Names that look like GSF when a directory is searched. Explicit files are
# taken whatever their name.
GSF_SUFFIXES = (".gsf", ".mb121")
_GLOB_CHARS = set("*?[")
# in an @list file, '#' at the start of a line or after a blank starts a comment
# (one inside a name, as in 'line#2.gsf', does not)
_COMMENT = re.compile(r"(^|\s)#.*$")


def file_key(path: str | os.PathLike) -> tuple[int, int] | str:
    """What makes two names one file: its device and inode where it can be looked up (so
    hard links, symbolic links and every spelling agree), else its resolved path."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        try:
            return os.path.realpath(path)
        except OSError:
            return os.path.abspath(path)


def _is_gsf_name(name: str) -> bool:
    low = name.lower()
    return low.endswith(GSF_SUFFIXES) or ".gsf." in low


def _walk(directory: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for f in sorted(files):
            if _is_gsf_name(f):
                found.append(Path(root) / f)
    return found


def _expand_one(item: str, base: Path, seen_lists: set[Path],
                listed_in: Path | None = None) -> list[Path]:
    if item.startswith("@"):
        list_path = (base / item[1:]).resolve()
        if list_path in seen_lists:
            raise ConfigError("list file includes itself", path=list_path)
        try:
            text = list_path.read_text()
        except OSError as err:
            raise ConfigError(f"cannot read list file: {err.strerror}", path=list_path) from err
        out = []
        for line in text.splitlines():
            line = _COMMENT.sub("", line).strip()
            if line:
                out.extend(_expand_one(line, list_path.parent, seen_lists | {list_path},
                                       list_path))
        return out
    path = Path(item)
    if not path.is_absolute():
        path = base / path
    if any(c in item for c in _GLOB_CHARS):
        matches = sorted(glob.glob(str(path), recursive=True))
        if not matches:
            raise ConfigError("pattern matches no file", path=item)
        out = []
        for m in matches:
            mp = Path(m)
            out.extend(_walk(mp) if mp.is_dir() else [mp])
        return out
    if path.is_dir():
        return _walk(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        # a name the user gave that is not there is a typo, not damage: refuse the run
        dangling = " (a symbolic link to a missing file)" if os.path.islink(path) else ""
        listed = f" (listed in {listed_in})" if listed_in is not None else ""
        raise ConfigError(f"no such file or directory{dangling}{listed}",
                          path=os.path.abspath(path)) from None
    except OSError:
        pass  # unreadable (a link loop, no permission): the load reports it as a problem file
    return [path]


def expand_inputs(items: Iterable[str | os.PathLike], *, base: str | os.PathLike | None = None,
                  keep_duplicates: bool = False) -> list[Path]:
    """Expand files, directories, globs and ``@list`` files into absolute, unique paths.

    ``keep_duplicates=True`` keeps a file named twice (say by a directory and a glob) at each
    place, for the load to drop the repeats and report them (``pfm-dask load`` does this).
    """
    base_dir = Path(base) if base is not None else Path.cwd()
    out: list[Path] = []
    seen: set = set()
    for item in items:
        for p in _expand_one(os.fspath(item), base_dir, set()):
            p = Path(os.path.abspath(p))
            key = file_key(p)
            if key in seen and not keep_duplicates:
                continue
            seen.add(key)
            out.append(p)
    if not out:
        raise ConfigError("no input files found")
    return out


def read_polygon(path: str | os.PathLike) -> tuple[tuple[float, float], ...]:
    """A polygon file: one ``lat, lon`` (or ``lat lon``) point per line, ``#`` comments."""
    pts = []
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read polygon file: {err.strerror}", path=path) from err
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").split()
        try:
            lat, lon = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            raise ConfigError(f"line {n}: expected 'lat, lon', got {line!r}", path=path) from None
        if not (-90 <= lat <= 90 and -180 <= lon <= 360):
            raise ConfigError(f"line {n}: point ({lat}, {lon}) is not a latitude/longitude",
                              path=path)
        pts.append((lat, lon))
    if len(pts) >= 2 and pts[0] == pts[-1]:
        pts.pop()
    if len(pts) < 3:
        raise ConfigError(f"a polygon needs at least 3 points, found {len(pts)}", path=path)
    return tuple(pts)
