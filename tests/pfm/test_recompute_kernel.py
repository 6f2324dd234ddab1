"""The recompute's compiled band pass (``_recompute_kernel``) leaves the bytes of the general path.

The general path (``_recompute.FUSED = False``: the store's chain reader, ``grouped_bin_stats``
and ``write_bin_records``) is itself checked against a per-bin port of the library's loop in
``test_recompute.py``; here two copies of the same PFM are recomputed, one by each path, with
the options the load and an append use, and every byte of the ``.bin`` and ``.cvg`` and the
header extrema must agree. Damage the compiled pass gives up on must still be reported by the
general path's error.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from pfm_dask import pfm as P
from pfm_dask.errors import PfmFormatError
from pfm_dask.pfm import _recompute
from pfm_dask.pfm import validity as V

from .test_recompute import build_pfm


def _copy(src: str, dst: str) -> str:
    """A copy of the PFM whose handle is ``src`` under the handle ``dst``."""
    a, b = os.path.basename(src), os.path.basename(dst)
    shutil.copy(src, dst)
    shutil.copytree(src + ".data", dst + ".data")
    for e in ("ctl", "lin", "bin", "ndx", "cvg"):
        os.rename(f"{dst}.data/{a}.{e}", f"{dst}.data/{b}.{e}")
    return dst


def _bytes(path: str, ext: str) -> bytes:
    with open(f"{path}.data/{os.path.basename(path)}.{ext}", "rb") as fh:
        return fh.read()


def _both(monkeypatch, a: str, b: str, **kw):
    """Recompute ``a`` by the general path and ``b`` by the compiled one; their extrema."""
    out = []
    for path, fused in ((a, False), (b, True)):
        monkeypatch.setattr(_recompute, "FUSED", fused)
        with P.open_pfm(path, "r+") as f:
            out.append(P.recompute(f, **kw))
    return out


@pytest.mark.parametrize("seed,kw", [
    (11, {}),
    (12, {"threads": 1}),
    (13, {"band_soundings": 7, "threads": 3}),
    (14, {"keep_mask": V.USER_02 | V.SUSPECT}),
    (15, {"clear_mask": V.CHECKED | V.VERIFIED}),
])
def test_compiled_band_pass_leaves_the_general_paths_bytes(tmp_path, monkeypatch, seed, kw):
    a, _, _ = build_pfm(tmp_path, seed=seed, n=3000, batches=3, do_recompute=False, name="a.pfm")
    b = _copy(a, os.fspath(tmp_path / "b.pfm"))
    ea, eb = _both(monkeypatch, a, b, **kw)
    assert ea == eb
    for e in ("bin", "cvg"):
        assert _bytes(a, e) == _bytes(b, e), e


def test_compiled_band_pass_on_a_subset_and_prior_statistics(tmp_path, monkeypatch):
    """An append's recompute: some bins only, over records that already hold statistics
    (among them a bin whose soundings are all invalid keeps its prior std)."""
    a, _, inputs = build_pfm(tmp_path, seed=16, n=2000, batches=2, name="a.pfm")
    with P.open_pfm(a, "r+") as f:
        r = f.read_bin_records(0, f.height)
        has = np.flatnonzero(r["num_soundings"] > 0)
        f.write_bin_records(r["bin_index"][has], std=np.linspace(0.0, 3.0, has.size),
                            validity=r["validity"][has] | V.CHECKED)
    b = _copy(a, os.fspath(tmp_path / "b.pfm"))
    chosen = np.unique(inputs["bin_index"])[::2]
    ea, eb = _both(monkeypatch, a, b, bin_index=chosen, clear_mask=V.CHECKED)
    assert ea == eb
    for e in ("bin", "cvg"):
        assert _bytes(a, e) == _bytes(b, e), e


def test_a_broken_chain_is_reported_by_the_general_path(tmp_path, monkeypatch):
    """A head pointer outside the .ndx: the compiled pass gives up on the band and the store's
    reader raises, naming the file, as it did before the compiled pass."""
    a, _, _ = build_pfm(tmp_path, seed=17, n=500, name="a.pfm")
    with P.open_pfm(a, "r+") as f:
        r = f.read_bin_records(0, f.height, fields=("num_soundings", "head"))
        b = int(r["bin_index"][np.flatnonzero(r["num_soundings"] > 0)[0]])
        off = f.bin_header_size + b * f.bin_record_size
        lay = f._bin_layout.fields["head"]
    raw = bytearray(_bytes(a, "bin"))
    for bit in range(lay.offset, lay.offset + lay.nbits):   # head = all ones
        raw[off + bit // 8] |= 0x80 >> (bit % 8)
    with open(f"{a}.data/a.pfm.bin", "wb") as fh:
        fh.write(raw)
    monkeypatch.setattr(_recompute, "FUSED", True)
    with P.open_pfm(a, "r+") as f, pytest.raises(PfmFormatError) as err:
        P.recompute(f)
    assert "a.pfm.ndx" in str(err.value)


@pytest.mark.parametrize("widths", [(1, 7, 22, 57, 64, 0, 33), (64, 63, 58, 9), (3,) * 30])
def test_record_fields_reads_what_the_bit_packing_unpacks(widths):
    """The one-load field reads (record_fields) against BitLayout.unpack, on random bytes,
    fields of 1 to 64 bits (and 0) at every bit phase, the last field at the record's end."""
    from pfm_dask.pfm._bitpack import BitLayout
    from pfm_dask.pfm._recompute_kernel import record_fields

    rng = np.random.default_rng(len(widths))
    for shift in range(8):
        fields, off = [], shift
        for i, nb in enumerate(widths):
            fields.append((f"f{i}", off, nb))
            off += nb
        lay = BitLayout(fields)
        recs = rng.integers(0, 256, (257, lay.record_bytes), dtype=np.uint8)
        want = lay.unpack(recs)
        got = record_fields(recs, lay)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k} {shift}")
