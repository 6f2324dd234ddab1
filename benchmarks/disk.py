"""Raw sequential bandwidth of the disk that holds the output: the ceiling a writer can reach.

Writes ``nbytes`` with plain 4 MiB ``os.write`` calls and an fsync (the same write loop as
``bench_pfm_write``), then reads the file back after asking the kernel to drop it from the
page cache (``posix_fadvise(DONTNEED)``, which works for clean pages without root), and, where
the file system allows it, once more with ``O_DIRECT``, which bypasses the cache for certain.
The best of ``runs`` is kept for each. ``drop_cache(paths)`` is public so that a benchmark
can make its inputs come from the disk again.

    python -m benchmarks.disk [--mb 1024] [--dir benchmarks/_work]
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from pathlib import Path

__all__ = ["sequential_bandwidth", "drop_cache"]

CHUNK = 4 << 20


def drop_cache(paths) -> None:
    """Ask the kernel to forget the cached pages of ``paths`` (best effort, no root needed)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)


def _write(path: Path, nbytes: int) -> float:
    buf = os.urandom(CHUNK)  # incompressible, in case the storage compresses
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[: min(CHUNK, left)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _read_buffered(path: Path) -> tuple[float, int]:
    drop_cache([path])
    buf = bytearray(CHUNK)
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while True:
            k = fh.readinto(buf)
            if not k:
                break
            n += k
    return time.perf_counter() - t0, n


def _read_direct(path: Path) -> tuple[float, int] | None:
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    n = 0
    try:
        t0 = time.perf_counter()
        while True:
            k = os.preadv(fd, [buf], n)
            if not k:
                break
            n += k
        return time.perf_counter() - t0, n
    except OSError:
        return None
    finally:
        os.close(fd)
        buf.close()


def sequential_bandwidth(directory: str | os.PathLike, nbytes: int = 1 << 30, runs: int = 2) -> dict:
    """Sequential write (with fsync) and cold read rates of ``directory``'s disk, MB/s (best run)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "disk-bandwidth.tmp"
    writes, reads, directs = [], [], []
    try:
        for _ in range(runs):
            writes.append(_write(path, nbytes))
            t, n = _read_buffered(path)
            reads.append(t)
            got = _read_direct(path)
            if got is not None:
                directs.append(got[0])
    finally:
        path.unlink(missing_ok=True)
    mb = nbytes / 1e6
    out = {"directory": str(d.resolve()), "bytes": nbytes, "runs": runs,
           "write_mb_per_s": mb / min(writes), "write_s": writes,
           "read_mb_per_s": mb / min(reads), "read_s": reads,
           "read_method": "posix_fadvise(DONTNEED) then buffered 4 MiB reads"}
    if directs:
        out["read_direct_mb_per_s"] = mb / min(directs)
        out["read_direct_s"] = directs
    try:
        st = os.statvfs(d)
        out["free_bytes"] = st.f_bavail * st.f_frsize
    except OSError:
        pass
    out["device"] = _device_of(d)
    return out


def _device_of(d: Path) -> str | None:
    """The mount's source device and file system type from /proc/mounts (Linux), if found."""
    try:
        best = ("", None)
        target = str(d.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            src, mnt, fstype = line.split()[:3]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, f"{src} ({fstype}) on {mnt}")
        return best[1]
    except OSError:
        return None


def main(argv=None) -> dict:
    from ._report import BENCH_DIR

    ap = argparse.ArgumentParser(prog="python -m benchmarks.disk", description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=1024.0)
    ap.add_argument("--dir", type=Path, default=BENCH_DIR / "_work")
    a = ap.parse_args(argv)
    res = sequential_bandwidth(a.dir, int(a.mb * 2**20))
    print(f"write {res['write_mb_per_s']:.0f} MB/s, read {res['read_mb_per_s']:.0f} MB/s"
          + (f", O_DIRECT read {res['read_direct_mb_per_s']:.0f} MB/s" if "read_direct_mb_per_s" in res else "")
          + f" ({res['device']})")
    return res


if __name__ == "__main__":
    main()
