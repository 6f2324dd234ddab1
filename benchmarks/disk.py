"""Raw sequential bandwidth of the disk that holds the output: the ceiling a writer can reach.

Writes ``nbytes`` with plain 4 MiB ``os.write`` calls and an fsync (the same write loop as
``bench_pfm_write``), then reads the file back after asking the kernel to drop it from the
page cache (``posix_fadvise(DONTNEED)``, which works for clean pages without root), and, where
the file system allows it, once more with ``O_DIRECT``, which bypasses the cache for certain;
then writes it once more with ``O_DIRECT`` (``write_direct_mb_per_s``: the disk's rate without
the page cache's). The best of ``runs`` is kept for each. ``drop_cache(paths)`` is public so that a benchmark
can make its inputs come from the disk again.

On a virtual machine whose balloon driver reports free pages to the host (Linux
``page_reporting``, as on this project's VM), a write is fast into page-cache pages freed a
moment before (the second run reuses the first's) and several times slower into pages the
host has taken back, which it must back again on first touch. The write is then measured a
last time after the freed pages have been reported (``write_settled_mb_per_s``; see
docs/performance.md, "Fresh pages on this VM"). ``reported_kib()`` reads the host's count.

    python -m benchmarks.disk [--mb 1024] [--dir benchmarks/_work]
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from pathlib import Path

__all__ = ["sequential_bandwidth", "drop_cache", "reported_kib", "settle_pages"]

CHUNK = 4 << 20
#: what an ``O_DIRECT`` write's offsets and lengths are multiples of (the usual logical block
#: sizes, 512 B and 4 KiB, divide it)
DIRECT_BLOCK = 4096
#: the guest kernel's count of free memory reported to the host (a ``page_reporting`` module
#: parameter of some VM kernels; absent elsewhere)
REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")


def reported_kib() -> int | None:
    """KiB of free memory this machine has reported to its host so far, or None if it has no
    such count (no free page reporting, or not a VM)."""
    try:
        return int(REPORTED_KIB.read_text())
    except (OSError, ValueError):
        return None


def settle_pages(quiet_s: float = 2.0, timeout_s: float = 20.0, poll_s: float = 0.25) -> float:
    """Wait until the host has taken back the memory freed so far: until the reported count
    has not grown for ``quiet_s`` (at most ``timeout_s``). Returns the seconds waited (0 on a
    machine without the count)."""
    last = reported_kib()
    if last is None:
        return 0.0
    t0 = time.perf_counter()
    still = t0
    while time.perf_counter() - t0 < timeout_s:
        time.sleep(poll_s)
        now = reported_kib()
        if now is not None and now != last:
            last, still = now, time.perf_counter()
        elif time.perf_counter() - still >= quiet_s:
            break
    return time.perf_counter() - t0


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


def _write_direct(path: Path, nbytes: int) -> tuple[float, int] | None:
    """The same write with ``O_DIRECT`` (whole 4 KiB blocks from a page-aligned buffer, then an
    fsync): no page-cache page is allocated or copied into, so it is the disk's own rate where
    a buffered write pays for fresh pages. None where the file system refuses it."""
    flag = getattr(os, "O_DIRECT", None)
    nbytes -= nbytes % DIRECT_BLOCK
    if flag is None or nbytes <= 0:
        return None
    buf = mmap.mmap(-1, CHUNK)  # page-aligned
    buf.write(os.urandom(CHUNK))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError:
        buf.close()
        return None
    try:
        view = memoryview(buf)
        t0 = time.perf_counter()
        done = 0
        while done < nbytes:
            done += os.write(fd, view[: min(CHUNK, nbytes - done)])
        os.fsync(fd)
        return time.perf_counter() - t0, done
    except OSError:
        return None
    finally:
        os.close(fd)
        view.release()
        buf.close()


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


def sequential_bandwidth(directory: str | os.PathLike, nbytes: int = 1 << 30, runs: int = 2,
                         settled: bool = True) -> dict:
    """Sequential write (with fsync) and cold read rates of ``directory``'s disk, MB/s (best run).

    ``settled`` (where the machine reports free pages to a host): one more write once the
    freed pages have been taken back, ``write_settled_mb_per_s``, with the KiB reported
    while it ran."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "disk-bandwidth.tmp"
    writes, reads, directs, direct_writes = [], [], [], []
    late = None
    try:
        for _ in range(runs):
            writes.append(_write(path, nbytes))
            t, n = _read_buffered(path)
            reads.append(t)
            got = _read_direct(path)
            if got is not None:
                directs.append(got[0])
        # after the buffered runs, so that the second of them still reuses the first's pages
        for _ in range(runs):
            path.unlink(missing_ok=True)
            got = _write_direct(path, nbytes)
            if got is not None:
                direct_writes.append(got)
        path.unlink(missing_ok=True)
        if settled and reported_kib() is not None:
            waited = settle_pages()
            k0 = reported_kib()
            t_settled = _write(path, nbytes)
            k1 = reported_kib()
            late = {"write_settled_mb_per_s": nbytes / 1e6 / t_settled,
                    "write_settled_s": t_settled, "settle_wait_s": waited,
                    "reported_kib_during_write": None if k0 is None or k1 is None else k1 - k0}
    finally:
        path.unlink(missing_ok=True)
    mb = nbytes / 1e6
    out = {"directory": str(d.resolve()), "bytes": nbytes, "runs": runs,
           "write_mb_per_s": mb / min(writes), "write_s": writes,
           "read_mb_per_s": mb / min(reads), "read_s": reads,
           "read_method": "posix_fadvise(DONTNEED) then buffered 4 MiB reads"}
    if late is not None:
        out.update(late)
    if directs:
        out["read_direct_mb_per_s"] = mb / min(directs)
        out["read_direct_s"] = directs
    if direct_writes:
        out["write_direct_mb_per_s"] = max(n / 1e6 / t for t, n in direct_writes)
        out["write_direct_s"] = [t for t, _ in direct_writes]
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
    print(f"write {res['write_mb_per_s']:.0f} MB/s"
          + (f" ({res['write_settled_mb_per_s']:.0f} MB/s into pages the host took back)"
             if "write_settled_mb_per_s" in res else "") + f", read {res['read_mb_per_s']:.0f} MB/s"
          + (f", O_DIRECT read {res['read_direct_mb_per_s']:.0f} MB/s" if "read_direct_mb_per_s" in res else "")
          + (f", O_DIRECT write {res['write_direct_mb_per_s']:.0f} MB/s"
             if "write_direct_mb_per_s" in res else "")
          + f" ({res['device']})")
    return res


if __name__ == "__main__":
    main()
