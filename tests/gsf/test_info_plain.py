"""``gsf.info`` without numba (``gsf._summary``): the kernels' ``GsfFile.info`` and libgsf agree.

``gsf-info`` frames records and walks pings in Python; a load frames and walks them with numba
kernels. Both must give the same dict, damage reports included, on every real sample, on a
synthetic file, and on truncated and corrupted copies of them (written to ``tmp_path``). The
independent reference is libgsf through gsfpy: every record read with ``gsfRead``, whose
return value (bytes read) gives the byte offset where libgsf stops on damage.
"""

from __future__ import annotations

import struct
from collections import Counter

import pytest

from pfm_dask import gsf
from pfm_dask.errors import GsfError
from pfm_dask.gsf._framing import scan_records

from .test_framing import slow_walk

gsfpy = pytest.importorskip("gsfpy")

_NAMES = {1: "HEADER", 2: "SWATH_BATHYMETRY_PING", 3: "SOUND_VELOCITY_PROFILE",
          4: "PROCESSING_PARAMETERS", 5: "SENSOR_PARAMETERS", 6: "COMMENT", 7: "HISTORY",
          8: "NAVIGATION_ERROR", 9: "SWATH_BATHY_SUMMARY", 10: "SINGLE_BEAM_PING",
          11: "HV_NAVIGATION_ERROR", 12: "ATTITUDE"}
_END_OF_FILE = -23      # GSF_READ_TO_END_OF_FILE: the walk reached the end, no damage


def libgsf_walk(path) -> dict:
    """Every record libgsf reads from ``path``: counts by name, each ping's beams, time and
    position (P1 undone), the byte offset where it stopped and its error code there."""
    from ctypes import byref

    from gsfpy import open_gsf
    from gsfpy.enums import RecordType
    from gsfpy3_08.bindings import gsfIntError, gsfRead
    from gsfpy3_08.gsfDataID import c_gsfDataID
    from gsfpy3_08.gsfRecords import c_gsfRecords

    with open(path, "rb") as fh:
        (hsize,) = struct.unpack(">I", fh.read(4))
    counts, pings, pos = Counter({"HEADER": 1}), [], 8 + hsize   # open reads the header
    with open_gsf(str(path)) as f:       # closed before the next one is opened (P2)
        while True:
            did, rec = c_gsfDataID(), c_gsfRecords()
            got = gsfRead(f._handle, RecordType.GSF_NEXT_RECORD, byref(did), byref(rec))
            if got < 0:
                return {"counts": dict(counts), "pings": pings, "stop": pos,
                        "error": gsfIntError()}
            pos += got
            counts[_NAMES[int(did.recordID)]] += 1
            if int(did.recordID) == 2:
                p = rec.mb_ping
                pings.append((int(p.number_beams), int(p.ping_time.tv_sec),
                              int(p.ping_time.tv_nsec), float(p.longitude), float(p.latitude)))


def numba_info(path) -> dict:
    """The summary through the kernels' path (``GsfFile``, as a load reads)."""
    with gsf.GsfFile(path, strict=False) as f:
        if f.version is None:
            raise f.damage[0] if f.damage else GsfError("not a GSF file", path=f.path)
        return f.info()


def _corruptions(blob: bytes) -> dict:
    """name -> bytes: truncations at several places and three kinds of bad ping record."""
    recs, _ = slow_walk(blob)
    pings = [r for r in recs if r[3] == 2]
    out = {"whole": blob, "header only": blob[:recs[0][1] + recs[0][2]]}
    if len(recs) > 1:
        out["cut in a record header"] = blob[:recs[len(recs) // 2][0] + 5]
    if not pings:
        return out
    mid, last = pings[len(pings) // 2], pings[-1]
    out["cut in the last ping"] = blob[:last[0] + 8 + last[2] // 2]
    out["cut in a middle ping"] = blob[:mid[0] + 8 + mid[2] // 3]
    at = mid[0]
    out["absurd size word"] = blob[:at] + struct.pack(">I", 0x7FFF_FFF0) + blob[at + 4:]
    size, word = struct.unpack(">II", blob[at:at + 8])
    out["bad checksum"] = (blob[:at] + struct.pack(">III", size, word | 0x8000_0000, 12345)
                           + blob[at + 8:])
    nb = mid[1] + 16        # the ping header's number_beams
    out["ping of 0 beams"] = blob[:nb] + b"\0\0" + blob[nb + 2:]
    return out


def _assert_like_libgsf(d: dict, ref: dict, content_damage: bool) -> None:
    pings = ref["pings"]
    assert d["n_pings"] == len(pings)
    assert d["n_beams"] == sum(p[0] for p in pings)
    if ref["error"] == _END_OF_FILE:
        assert d["damage"] == []
    else:
        assert [x["offset"] for x in d["damage"]] == [ref["stop"]], (d["damage"], ref)
    if not content_damage:      # libgsf stops at a bad ping; the framing goes on past it
        assert d["record_counts"] == ref["counts"]
        assert d["n_ping_records"] == ref["counts"].get("SWATH_BATHYMETRY_PING", 0)
    if not pings:
        assert d["beams_per_ping"] == {"min": None, "max": None}
        assert d["time"]["start"] is None and d["latitude"]["min"] is None
        return
    assert d["beams_per_ping"] == {"min": min(p[0] for p in pings),
                                   "max": max(p[0] for p in pings)}
    t = sorted((p[1], p[2]) for p in pings)
    assert (d["time"]["start"], d["time"]["end"]) == (t[0][0] + t[0][1] / 1e9,
                                                      t[-1][0] + t[-1][1] / 1e9)
    placed = [p for p in pings if abs(p[3]) <= 90 and abs(p[4]) <= 180]
    assert d["latitude"] == {"min": min(p[3] for p in placed), "max": max(p[3] for p in placed)}
    assert d["longitude"] == {"min": min(p[4] for p in placed), "max": max(p[4] for p in placed)}


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("synth-info")
    synth.generate(out, files=1, pings=40, beams=64, seed=11)
    return sorted(out.glob("*.gsf"))[0]


def _check_all_copies(src, tmp_path) -> None:
    for name, blob in _corruptions(src.read_bytes()).items():
        path = tmp_path / (name.replace(" ", "_") + ".gsf")
        path.write_bytes(blob)
        plain = gsf.info(path)
        assert plain == numba_info(path), name
        assert plain["path"] == str(path) and plain["size"] == len(blob)
        assert bool(plain["damage"]) == (name not in ("whole", "header only")), name
        _assert_like_libgsf(plain, libgsf_walk(path), name == "ping of 0 beams")


def test_plain_info_is_the_kernels_and_libgsfs_on_samples_and_damaged_copies(gsf_sample,
                                                                              tmp_path):
    _check_all_copies(gsf_sample, tmp_path)


def test_plain_info_is_the_kernels_and_libgsfs_on_a_synthetic_file(synth_file, tmp_path):
    _check_all_copies(synth_file, tmp_path)


@pytest.mark.parametrize("blob", [b"", b"GSF", b"\0" * 100, b"\0\0\0\x0c\0\0\0\x01GSF-v9"])
def test_not_gsf_raises_the_same_error_both_ways(tmp_path, blob):
    path = tmp_path / "bad.gsf"
    path.write_bytes(blob)
    with pytest.raises(GsfError) as plain:
        gsf.info(path)
    with pytest.raises(GsfError) as kernels:
        numba_info(path)
    assert str(plain.value) == str(kernels.value) and str(path) in str(plain.value)
    with pytest.raises(GsfError, match="cannot open"):
        gsf.info(tmp_path / "none.gsf")


def test_python_framing_is_the_kernels(gsf_sample):
    """``scan_records(fast=False)`` lists the kernel's records (the EM302 sample's 73,748
    fill the first output arrays and make the walk ask for larger ones)."""
    blob = gsf_sample.read_bytes()
    a, b = scan_records(blob, "x", fast=False), scan_records(blob, "x")
    for k in ("offsets", "data_offsets", "sizes", "ids"):
        assert getattr(a, k).tolist() == getattr(b, k).tolist(), k
    assert (a.end, a.version, [str(e) for e in a.damage]) == (
        b.end, b.version, [str(e) for e in b.damage])


def test_package_names_are_each_modules_public_names():
    """The lazy package (``pfm_dask.gsf.__init__``) gives each module's ``__all__``."""
    import importlib

    for mod, names in gsf._MODULES.items():
        public = set(importlib.import_module(f"pfm_dask.gsf.{mod}").__all__)
        assert set(names) <= public, mod
        if mod not in ("_decode", "_summary"):   # those keep internals public to the package
            assert set(names) == public, mod
    assert sorted(gsf.__all__) == sorted(set(gsf.__all__))
    assert all(getattr(gsf, n) is not None for n in gsf.__all__)
