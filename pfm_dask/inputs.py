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
import stat
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


_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _special(path: Path) -> str | None:
    """What ``path`` is when it is a FIFO, socket or device (reading one can block forever),
    else None (a regular file, a folder, or something the load will report as unreadable)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((what for test, what in _SPECIAL if test(mode)), None)


def _skip_special(path: Path, problems: list[str] | None) -> bool:
    what = _special(path)
    if what is not None and problems is not None:
        problems.append(f"{path}: {what}, not a regular file: skipped, never opened")
    return what is not None


def _walk(directory: Path, problems: list[str] | None = None) -> list[Path]:
    """GSF-named files under ``directory``, sorted, a folder's own files before its
    subfolders'. Linked folders are followed, each searched once (no loops); a folder that
    cannot be read, and special files named like GSF, go to ``problems``."""
    found: list[Path] = []
    searched: set[tuple[int, int]] = set()

    def search(folder: Path) -> None:
        try:
            st = os.stat(folder)
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            if problems is not None:
                problems.append(f"{folder}: cannot read the folder ({err.strerror or err}): the "
                                "files in it were not searched")
            return
        if (st.st_dev, st.st_ino) in searched:
            return
        searched.add((st.st_dev, st.st_ino))
        subfolders = []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            path = folder / e.name
            if is_dir:
                subfolders.append(path)
            elif _is_gsf_name(e.name) and not _skip_special(path, problems):
                found.append(path)
        for sub in subfolders:
            search(sub)

    search(directory)
    return found


def _expand_one(item: str, base: Path, seen_lists: set[Path],
                listed_in: Path | None = None, problems: list[str] | None = None) -> list[Path]:
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
                                       list_path, problems))
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
            if mp.is_dir():
                out.extend(_walk(mp, problems))
            elif not _skip_special(mp, problems):
                out.append(mp)
        return out
    if path.is_dir():
        return _walk(path, problems)
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
    return [] if _skip_special(path, problems) else [path]


def expand_inputs(items: Iterable[str | os.PathLike], *, base: str | os.PathLike | None = None,
                  keep_duplicates: bool = False, problems: list[str] | None = None) -> list[Path]:
    """Expand files, directories, globs and ``@list`` files into absolute, unique paths.

    ``keep_duplicates=True`` keeps a file named twice (say by a directory and a glob) at each
    place, for the load to drop the repeats and report them (``pfm-dask load`` does this).
    ``problems``: where to add a line for each folder that could not be searched and each
    FIFO, socket or device named like GSF (skipped, never opened), for the load's report.
    """
    base_dir = Path(base) if base is not None else Path.cwd()
    out: list[Path] = []
    seen: set = set()
    for item in items:
        for p in _expand_one(os.fspath(item), base_dir, set(), None, problems):
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
