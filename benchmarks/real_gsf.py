"""A large GSF file made of real EM302 ping records: the EX1811 sample's 50 pings, repeated.

Synthetic files have one ping layout throughout; real ones do not. The EX1811 sample (EM302,
exported by CARIS HIPS, GSF 03.07) has 14 subrecords per ping, including a Kongsberg sensor
subrecord and an intensity series whose size changes from ping to ping, and 4 of its 50 pings
carry no scale-factor table (they use the one before). This module repeats those ping records
byte for byte, shifting only the ping time and position of each repetition, until the file
reaches the requested size: every subrecord stays as the sonar and HIPS wrote it.

The sample is read in place from ``$PFM_DASK_GSF_SAMPLES`` or ``../shared/data/gsf`` (never
copied into the repository); the file is built at run time into a cache directory.

    python -m benchmarks.real_gsf [--mb 100] [--out DIR]     # build (or find) the file
"""

from __future__ import annotations

import argparse
import os
import struct
from pathlib import Path

import numpy as np

from ._report import DATA_DIR

__all__ = ["SAMPLE_NAME", "build", "cached_file", "find_sample", "samples_dir", "survey"]

SAMPLE_NAME = "ukho-gsfpy__0059_20181102_212138_EX1811_MB_EM302.gsf.mb121"
_REPO = Path(__file__).resolve().parent.parent

# Offsets in the ping record's data part (docs/gsf-format.md §3; longitude before latitude).
_TIME_SEC, _LON, _LAT = 0, 8, 12
_KEEP_RECORDS = (1, 3, 4)   # header, sound velocity profile, processing parameters
_PING = 2
#: hours between the starts of two lines of :func:`survey` (a 40 MB line runs about 1.5 h)
LINE_HOURS = 4


def samples_dir() -> Path:
    """Where the real samples are: ``$PFM_DASK_GSF_SAMPLES`` or ``../shared/data/gsf``."""
    return Path(os.environ.get("PFM_DASK_GSF_SAMPLES", _REPO.parent / "shared" / "data" / "gsf"))


def find_sample() -> Path | None:
    """The EX1811 EM302 sample, or None when the samples are not on this machine."""
    p = samples_dir() / SAMPLE_NAME
    return p if p.is_file() else None


def _records(blob: bytes):
    """(record id, header bytes, data bytes) of every record, by a plain size-word walk."""
    pos = 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        hdr = 12 if word & 0x8000_0000 else 8
        yield word & 0x3F_FFFF, blob[pos:pos + hdr], blob[pos + hdr:pos + hdr + size]
        pos += hdr + size


def _drop_subrecords(data: bytes, ids) -> bytes:
    """The ping data part without the subrecords whose id is in ``ids`` (re-padded to 4)."""
    out = bytearray(data[:56])
    p, end = 56, len(data)
    while end - p > 4:
        (word,) = struct.unpack_from(">I", data, p)
        sid, size = word >> 24, word & 0xFF_FFFF
        stop = min(p + 4 + size, end)
        if sid not in ids:
            out += data[p:stop]
        p = stop
    out += data[p:]
    out += b"\0" * (-len(out) % 4)
    return bytes(out)


def build(path, *, sample=None, mb: float = 100.0, repeats: int | None = None,
          dt_s: int = 360, dlat_deg: float = 0.01, drop: dict | None = None,
          dlon_deg: float = 0.0, t0_s: int = 0) -> dict:
    """Write a GSF file of the sample's ping records repeated, each repetition moved on.

    Repetition ``r`` adds ``t0_s + r * dt_s`` seconds to every ping time, ``r * dlat_deg``
    degrees to every latitude and ``dlon_deg`` to every longitude (the whole file: a line
    beside another); nothing else changes. ``repeats`` (default: enough for ``mb``
    megabytes) sets the count. ``drop`` maps a ping index within the sample (0-49) to the
    subrecord ids removed from that ping in every repetition, to make optional arrays
    absent (tests). The header, sound velocity profile and processing parameters records are
    kept once; the sample's 73,695 attitude records are left out, so the file is pings only.
    Returns a summary (path, bytes, pings, repeats).
    """
    sample = Path(sample) if sample is not None else find_sample()
    if sample is None:
        raise FileNotFoundError(f"{SAMPLE_NAME} not found in {samples_dir()} "
                                "(set PFM_DASK_GSF_SAMPLES)")
    blob = sample.read_bytes()
    head, pings = [], []
    for rid, hdr, data in _records(blob):
        if rid == _PING:
            if hdr[4] & 0x80:
                raise ValueError("checksummed ping records are not expected in the sample")
            pings.append(data)
        elif rid in _KEEP_RECORDS and not pings:
            head.append(hdr + data)
    drop = drop or {}
    pings = [_drop_subrecords(d, drop[k]) if k in drop else d for k, d in enumerate(pings)]
    frames = [struct.pack(">II", len(d), _PING) + d for d in pings]
    cycle = sum(len(f) for f in frames)
    if repeats is None:
        repeats = max(1, -(-int(mb * 1e6 - sum(map(len, head))) // cycle))
    # One repetition as a byte array; its time and position fields as big-endian views.
    rec = np.frombuffer(b"".join(frames), dtype=np.uint8).copy()
    at = np.cumsum([0] + [len(f) for f in frames[:-1]]) + 8
    sec = np.array([struct.unpack_from(">I", d, _TIME_SEC)[0] for d in pings], np.int64)
    lat = np.array([struct.unpack_from(">i", d, _LAT)[0] for d in pings], np.int64)
    lon = np.array([struct.unpack_from(">i", d, _LON)[0] for d in pings], np.int64)
    dlat = round(dlat_deg * 1e7)
    if dlon_deg:
        _put(rec, at + _LON, lon + round(dlon_deg * 1e7), ">i4")
    if (lat + (repeats - 1) * dlat).max() > 900_000_000:
        raise ValueError("the repeats would move the latitude past 90 degrees")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as fh:
        for h in head:
            fh.write(h)
        for r in range(repeats):
            _put(rec, at + _TIME_SEC, sec + t0_s + r * dt_s, ">u4")
            _put(rec, at + _LAT, lat + r * dlat, ">i4")
            fh.write(rec.tobytes())
    os.replace(tmp, path)
    return {"path": str(path), "bytes": path.stat().st_size, "pings": repeats * len(pings),
            "repeats": repeats, "sample": sample.name, "sample_pings": len(pings)}


def _put(u8: np.ndarray, at: np.ndarray, values: np.ndarray, dtype: str) -> None:
    """Write ``values`` as 4-byte big-endian integers at byte offsets ``at`` of ``u8``."""
    b = np.asarray(values).astype(dtype).view(np.uint8).reshape(-1, 4)
    u8[at[:, None] + np.arange(4)] = b


def cached_file(mb: float = 100.0, *, data_dir: Path = DATA_DIR, quiet: bool = False
                ) -> tuple[Path, dict] | None:
    """The real-derived file of at least ``mb`` MB, built on first use; None without the sample."""
    sample = find_sample()
    if sample is None:
        return None
    path = Path(data_dir) / f"ex1811_em302_repeated_{mb:g}MB_v1.gsf"
    if path.is_file() and path.stat().st_size >= mb * 1e6 \
            and path.stat().st_mtime >= sample.stat().st_mtime:
        return path, {"path": str(path), "bytes": path.stat().st_size, "sample": sample.name}
    if not quiet:
        print(f"building {path} from {sample.name} ...", flush=True)
    return path, build(path, sample=sample, mb=mb)


def survey(files: int = 8, mb: float = 40.0, *, data_dir: Path = DATA_DIR,
           dlon_deg: float = 0.035, quiet: bool = False) -> Path | None:
    """A folder of ``files`` real-derived lines of about ``mb`` MB each, side by side: line
    ``k`` is :func:`build`'s file moved ``k * dlon_deg`` degrees east (0.035: about 3.7 km at
    the sample's 17.8 N, so each of its 4.5 km wide swaths overlaps the next), its pings
    :data:`LINE_HOURS` after line ``k - 1``'s. Built on first use; None without the sample."""
    sample = find_sample()
    if sample is None:
        return None
    out = Path(data_dir) / f"ex1811_em302_lines_{files}x{mb:g}MB_v1"
    for k in range(files):
        path = out / f"line_{k:02d}.gsf"
        if path.is_file() and path.stat().st_mtime >= sample.stat().st_mtime:
            continue
        if not quiet:
            print(f"building {path} from {sample.name} ...", flush=True)
        build(path, sample=sample, mb=mb, dlon_deg=k * dlon_deg, t0_s=k * LINE_HOURS * 3600)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.real_gsf",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--out", type=Path, default=DATA_DIR)
    a = ap.parse_args(argv)
    got = cached_file(a.mb, data_dir=a.out)
    if got is None:
        print(f"skipped: {SAMPLE_NAME} not found in {samples_dir()} (set PFM_DASK_GSF_SAMPLES)")
        return 0
    print(got[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
