"""Batched and partial reads equal the whole-file read.

Reading from ping k must apply the merged scale-factor state in force at ping k,
also when ping k carries no table of its own (samples #2 and #4) and when the
state is rebuilt by walking back (forced here with ``_forward_limit = 0``) rather
than forward. The reference is always the plain whole-file read, which is itself
checked against libgsf in ``test_reader_vs_gsfpy.py``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pfm_dask import gsf

from .test_pitfalls import array, header_record, ping_record, sf_table, sub, write


def tail(table: pa.Table, start: int, stop: int | None = None) -> pa.Table:
    """Rows of pings [start, stop) (0-based) of a whole-file table."""
    ping = table.column("ping").to_numpy()
    keep = ping > start
    if stop is not None:
        keep &= ping <= stop
    return table.filter(pa.array(keep))


@pytest.mark.parametrize("max_pings", [1, 3, 7, 1000])
def test_batches_equal_whole(gsf_sample, max_pings):
    whole = gsf.read_pings(gsf_sample)
    batches = list(gsf.iter_batches(gsf_sample, max_pings))
    assert all(b.schema.equals(gsf.SOUNDING_SCHEMA) for b in batches)
    if whole.num_rows == 0:
        assert batches == []
        return
    joined = pa.Table.from_batches(batches)
    assert joined.equals(whole)
    pings = [len(np.unique(b.column("ping").to_numpy())) for b in batches]
    assert max(pings) <= max_pings


@pytest.mark.parametrize("forward_limit", [0, 256])
def test_read_from_every_ping_equals_tail(gsf_sample, forward_limit):
    """Each start ping, on a fresh file object (no state cached): walking back or forward."""
    whole = gsf.read_pings(gsf_sample)
    with gsf.GsfFile(gsf_sample) as f0:
        n = f0.n_pings
    starts = range(n) if n <= 60 else list(range(0, n, 7)) + [n - 1]
    for start in starts:
        with gsf.GsfFile(gsf_sample) as f:
            f._forward_limit = forward_limit
            got = f.read(start_ping=start, stop_ping=min(n, start + 5))
        assert got.equals(tail(whole, start, min(n, start + 5))), start


def test_ranges_split_like_workers(sample_by_name):
    """Splitting by ping ranges across 'workers' and concatenating gives the whole file."""
    path = sample_by_name("6_184_1440")
    whole = gsf.read_pings(path)
    edges = [0, 13, 14, 50, 99, 131, 132]
    parts = []
    for a, b in zip(edges[:-1], edges[1:]):
        with gsf.GsfFile(path) as f:
            f._forward_limit = 0
            parts.extend(f.iter_batches(max_pings=10, start_ping=a, stop_ping=b))
    assert pa.Table.from_batches(parts).equals(whole)


def test_module_iter_batches_ranges(sample_by_name):
    path = sample_by_name("EM302")
    whole = gsf.read_pings(path)
    got = pa.Table.from_batches(list(gsf.iter_batches(path, 4, start_ping=10, stop_ping=23)))
    assert got.equals(tail(whole, 10, 23))
    with gsf.GsfFile(path) as f:
        assert f.read(start_ping=-5).equals(tail(whole, 45))
        assert f.read(start_ping=60).num_rows == 0
        with pytest.raises(ValueError):
            next(f.iter_batches(0))


def _merged_file(pings: int = 40) -> bytes:
    """Tables in ping 0 (ids 1, 2, 16, 19), ping 10 (id 1 only), ping 25 (id 19 only)."""
    n = 3
    blob = header_record()
    for k in range(pings):
        body = b""
        if k == 0:
            body += sf_table([(1, 0, 100, 0), (2, 0, 10, -3), (19, 0, 100, 0)])
        elif k == 10:
            body += sf_table([(1, 0, 1000, -100)])
        elif k == 25:
            body += sf_table([(19, 0, 10, 0)])
        body += (array(1, [k, k + 1, k + 2], "H") + array(2, [-k, 0, k], "h")
                 + array(19, [5, 6, 7], "H") + array(16, [k % 2] * n, "B"))
        blob += ping_record(body, n=n, sec=1_000_000 + k)
    return blob


def test_partial_tables_resolved_walking_back(tmp_path):
    """Start pings after partial tables: each id takes its value from the latest table
    that lists it (hand-computed here), however far back."""
    path = write(tmp_path, "merge.gsf", _merged_file())
    whole = gsf.read_pings(path)
    depth = whole.column("depth").to_numpy().reshape(-1, 3)
    across = whole.column("across_track").to_numpy().reshape(-1, 3)
    verr = whole.column("vertical_error").to_numpy().reshape(-1, 3)
    k = np.arange(40)[:, None]
    exp_depth = np.where(k < 10, (k + np.arange(3)) / 100, (k + np.arange(3)) / 1000 + 100)
    np.testing.assert_array_equal(depth, exp_depth)
    np.testing.assert_array_equal(across, np.array([-1, 0, 1]) * k / 10 + 3)
    np.testing.assert_array_equal(verr, np.where(k < 25, [0.05, 0.06, 0.07], [0.5, 0.6, 0.7]))
    for start in range(40):
        with gsf.GsfFile(path) as f:
            f._forward_limit = 0
            assert f.read(start_ping=start).equals(tail(whole, start)), start


def test_width_from_history_falls_back_to_forward_walk(tmp_path):
    """A depth array whose size is not N, 2N or 4N and that nothing confirms takes its
    width from the table's nibble; starting mid-file must rebuild that from history."""
    n = 4
    blob = header_record()
    for k in range(12):
        body = sf_table([(1, 0x20, 100, 0)]) if k == 0 else b""
        body += array(16, [0] * n, "B")
        # declared 3N bytes, holds 2N; followed by a sensor subrecord (no look-ahead hit)
        body += array(1, [k, k + 1, k + 2, k + 3], "H", declared=3 * n)
        body += sub(134, b"\0" * 12)
        blob += ping_record(body, n=n, sec=1_000 + k)
    path = write(tmp_path, "hist.gsf", blob)
    whole = gsf.read_pings(path)
    np.testing.assert_array_equal(whole.column("depth").to_numpy().reshape(-1, n),
                                  (np.arange(12)[:, None] + np.arange(n)) / 100)
    for start in (1, 5, 11):
        with gsf.GsfFile(path) as f:
            f._forward_limit = 0
            assert f.read(start_ping=start).equals(tail(whole, start))


def test_synthetic_survey_batches(tmp_path):
    """A 300-ping synthetic line (pfm_dask.synth): batches, far starts and the whole agree."""
    synth = pytest.importorskip("pfm_dask.synth")
    summary = synth.generate(tmp_path / "s", files=1, pings=300, beams=64, seed=3)
    path = tmp_path / "s" / summary["files"][0]["name"]
    whole = gsf.read_pings(path)
    assert whole.num_rows == 300 * 64
    assert pa.Table.from_batches(list(gsf.iter_batches(path, 37))).equals(whole)
    with gsf.GsfFile(path) as f:                 # > 256 pings past ping 0: walks back
        assert f.read(start_ping=290).equals(tail(whole, 290))
        assert f.read(start_ping=150, stop_ping=151).equals(tail(whole, 150, 151))


def test_closed_file_refuses_to_read(sample_by_name):
    f = gsf.GsfFile(sample_by_name("EX1604"))
    t = f.read()
    f.close()
    f.close()                                   # idempotent
    assert t.num_rows == 8 * 432                # tables outlive the file
    with pytest.raises(ValueError, match="closed"):
        f.read()


def test_recycled_output_memory_never_overwrites_live_tables(tmp_path):
    """Output buffers are recycled once unreferenced: tables (and numpy views of them)
    still alive must keep their values while other files are read."""
    synth = pytest.importorskip("pfm_dask.synth")
    summary = synth.generate(tmp_path / "s", files=2, pings=120, beams=432, seed=5)
    paths = [tmp_path / "s" / f["name"] for f in summary["files"]]
    kept, copies = [], []
    for k in range(6):
        t = gsf.read_pings(paths[k % 2])
        if k % 2 == 0:
            kept.append(t)                                   # a table kept alive
            copies.append(t.column("depth").to_numpy().copy())
        elif k == 3:
            view = t.column("across_track").to_numpy()       # only a numpy view kept
            view_copy = view.copy()
        del t
    for t, c in zip(kept, copies):
        np.testing.assert_array_equal(t.column("depth").to_numpy(), c)
    np.testing.assert_array_equal(view, view_copy)
    again = [gsf.read_pings(p) for p in paths]
    assert kept[0].equals(again[0]) and kept[-1].equals(again[0])


def test_remembered_framing_and_states_read_the_same(tmp_path):
    """``GsfFile(remember=True)`` takes the framing and scale-factor states a previous one of the
    same file left (a load's task opens a file once per piece); a changed file is framed again."""
    from pfm_dask import synth
    from pfm_dask.gsf import _reader

    synth.generate(tmp_path, files=1, pings=700, beams=16, seed=2)
    path = next(tmp_path.glob("*.gsf"))
    with gsf.GsfFile(path) as f:
        want = f.read(0, f.n_pings)
    with gsf.GsfFile(path, strict=False, remember=True) as f1:
        f1.read_columns(0, 400)
        framing = f1._framing
    with gsf.GsfFile(path, strict=False, remember=True) as f2:
        assert f2._framing is framing and 400 in f2._complete_keys
        assert f2.read(400, 700).equals(want.slice(int(np.searchsorted(
            want.column("ping").to_numpy(), 401)), None))
        assert f2.read(0, 700).equals(want)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF                              # same size, other bytes near the end
    path.write_bytes(bytes(data))
    with gsf.GsfFile(path, strict=False, remember=True) as f3:
        assert f3._framing is not framing
    assert len(_reader._KNOWN) <= _reader._KNOWN_FILES


def test_read_columns_per_ping_holds_each_pings_header_once(tmp_path):
    from pfm_dask import synth

    synth.generate(tmp_path, files=1, pings=90, beams=24, seed=6)
    with gsf.GsfFile(next(tmp_path.glob("*.gsf"))) as f:
        want = f.read(3, 80)
        every = f.read_columns(3, 80)
        once = f.read_columns(3, 80, per_ping=True)
    nb = once.pop("n_beams")
    first = np.concatenate([[0], np.cumsum(nb)[:-1]])
    assert nb.sum() == want.num_rows == every["ping"].size
    for name in want.column_names:
        got = np.repeat(once[name], nb) if once[name].size == nb.size else once[name]
        if name in ("time", "time_sec", "time_nsec", "latitude", "longitude", "heading",
                    "ping_flags"):
            assert once[name].size == nb.size
            np.testing.assert_array_equal(once[name], every[name][first])
        np.testing.assert_array_equal(got, every[name], err_msg=name)
        if name not in every["_valid"]:
            np.testing.assert_array_equal(got, want.column(name).to_numpy(), err_msg=name)


def _mapped_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (the kernel's count, smaps)."""
    name, total, cur = str(path), 0, None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                cur = parts[5] if len(parts) > 5 else None
            elif parts[0] == "Rss:" and cur == name:
                total += int(parts[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux only")
def test_forget_unmaps_the_pages_of_a_ping_range_and_reads_the_same(tmp_path):
    """A task reads its piece in chunks: the pages before the chunk it is at leave this process
    (the framing scan mapped the whole file), and reading them again gives the same values."""
    from pfm_dask import synth

    synth.generate(tmp_path, files=1, pings=400, beams=256, seed=4)
    path = next(tmp_path.glob("*.gsf")).resolve()
    with gsf.GsfFile(path) as f:
        want = f.read(0, f.n_pings)
        whole = _mapped_kib(path)
        assert whole * 1024 > 0.9 * f.size            # reading every ping mapped it all
        f.forget(350, f.n_pings)                     # past the pings to read
        assert _mapped_kib(path) * 1024 <= int(f.ping_offsets[350]) + 4096
        f.forget(0, f.n_pings)
        assert _mapped_kib(path) == 0
        f.read_columns(300, 320)
        f.forget(0, 300)
        mapped = _mapped_kib(path) * 1024
        assert mapped < 0.25 * f.size                # the 20 pings read and the pages around
        f.forget(5, 5)                               # an empty range: a no-op
        f.forget(f.n_pings, f.n_pings + 5)           # out of range: a no-op
        assert f.read(0, f.n_pings).equals(want)     # pages mapped again on demand


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux only")
def test_a_first_open_drops_the_pages_its_framing_walk_left_behind(tmp_path):
    """Opening a file walks all its records' framing; the walk drops the pages behind it every
    few hundred records, so the open holds the last steps' pages, not the whole file (two tasks
    opening 25 MB files at once held 50 MB of them), with the same framing as an undropped
    walk, and reads give the same values as the file's bytes."""
    from pfm_dask import synth
    from pfm_dask.gsf._framing import _WALKED_EVERY, scan_records

    synth.generate(tmp_path, files=1, pings=2000, beams=64, seed=5)
    path = next(tmp_path.glob("*.gsf")).resolve()
    data = path.read_bytes()
    steps = []
    plain, walked = scan_records(data), scan_records(data, walked=steps.append)
    assert len(plain.offsets) > 3 * _WALKED_EVERY and len(steps) >= 3
    assert steps == sorted(steps) and steps[-1] < len(data)
    for name in ("offsets", "data_offsets", "sizes", "ids"):
        assert np.array_equal(getattr(plain, name), getattr(walked, name))
    assert (plain.end, plain.damage) == (walked.end, walked.damage)
    with gsf.GsfFile(path) as f:
        assert _mapped_kib(path) * 1024 < 0.4 * f.size
        got = f.read(0, f.n_pings)
    assert got.equals(gsf.read_pings(path))


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux only")
def test_long_passes_hold_a_window_of_the_file_and_read_the_same(tmp_path, monkeypatch):
    """The pre-scan reads every ping's header and walks every ping for its scale factors
    (``sample_at``: both in one pass); a walk to a ping far into the file walks all before it.
    Over more than ``PASS_WINDOW`` bytes each pass unmaps the pages it has gone by, so it holds
    about a window of the file, not all of it (a ``--serial`` load of one 1 GB line peaked at
    1.18 GB RSS, 0.29 GB with the windows), and gives the same values as one pass."""
    from pfm_dask import synth
    from pfm_dask.gsf import _decode

    synth.generate(tmp_path, files=1, pings=16000, beams=64, seed=5)
    path = next(tmp_path.glob("*.gsf")).resolve()
    with gsf.GsfFile(path) as f:                     # the file in one window: the reference
        n = f.n_pings
        picks = sorted(set(range(0, n, n // 48)) | {n - 1})
        want_h, want_c, want = f.ping_headers(), f.read_columns_at(picks), f.read(0, n)
        tail_c = f.read_columns(n - 5, n)
    window = 1 << 20
    monkeypatch.setattr(_decode, "PASS_WINDOW", window)
    # a fault maps the page cache's whole folio around it (up to 2 MB with large folios), a
    # window's pages and those of the next page fault's folio on either side
    bound = window + 2 * (2 << 20)
    with gsf.GsfFile(path) as f:
        assert f.size > 4 * bound
        f.forget(0, n)
        got_h = f.ping_headers()
        assert 0 < _mapped_kib(path) * 1024 <= bound
        f.forget(0, n)
        assert len(f._walk(0, n)[0].n_beams) == n   # the walk of every ping read_columns_at does
        assert 0 < _mapped_kib(path) * 1024 <= bound
        got_c = f.read_columns_at(picks)
        f.forget(0, n)
        both = f.sample_at([0, n - 1])        # the headers read as the walk goes by
        assert 0 < _mapped_kib(path) * 1024 <= bound + 2 * (2 << 20)   # and the 2 decoded
        for k in want_h:
            np.testing.assert_array_equal(both[0][k], want_h[k], err_msg=k)
        same_h, same_c = f.sample_at(picks)
        for k in want_h:
            np.testing.assert_array_equal(same_h[k], want_h[k], err_msg=k)
        for k in want_c.keys() - {"_valid"}:
            np.testing.assert_array_equal(same_c[k], want_c[k], err_msg=k)
        for k in want_h:
            np.testing.assert_array_equal(got_h[k], want_h[k], err_msg=k)
        assert want_c["_valid"].keys() == got_c["_valid"].keys()
        for k, v in want_c["_valid"].items():
            np.testing.assert_array_equal(got_c["_valid"][k], v, err_msg=k)
        for k in want_c.keys() - {"_valid"}:
            np.testing.assert_array_equal(got_c[k], want_c[k], err_msg=k)
    with gsf.GsfFile(path) as f:             # a walk forward from the first ping to the last
        f._forward_limit = n
        f.forget(0, n)
        got = f.read_columns(n - 5, n)
        assert _mapped_kib(path) * 1024 <= bound + (2 << 20)    # and the 5 pings decoded
        for k in tail_c.keys() - {"_valid"}:
            np.testing.assert_array_equal(got[k], tail_c[k], err_msg=k)
    with gsf.GsfFile(path) as f:
        assert f.read(0, n).equals(want)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux only")
@pytest.mark.parametrize("plain", [True, False], ids=["gsf-info", "GsfFile.info"])
def test_info_holds_a_window_of_the_file_and_says_the_same(tmp_path, monkeypatch, plain):
    """``gsf-info`` (plain Python) and ``GsfFile.info`` walk every ping and read every ping's
    header (as the walk goes by): the pass holds about a window of the file (``gsf-info`` of a
    1 GB line peaked at 1.0 GB RSS), and the summary is the one of a single window."""
    from pfm_dask import synth
    from pfm_dask.gsf import _decode, _summary

    synth.generate(tmp_path, files=1, pings=16000, beams=64, seed=5)
    path = next(tmp_path.glob("*.gsf")).resolve()

    def info():
        if plain:
            return _summary.info(path)
        with gsf.GsfFile(path, strict=False) as f:
            f.forget(0, f.n_pings)             # what the open's framing walk left mapped
            return f.info()

    want = info()
    window = 1 << 20
    monkeypatch.setattr(_decode, "PASS_WINDOW", window)
    seen: list[int] = []
    real = _decode.HeadersAlong.finish

    def finish(self, *a, **k):                 # after the walk and the headers' read
        out = real(self, *a, **k)
        seen.append(_mapped_kib(path) * 1024)
        return out

    monkeypatch.setattr(_decode.HeadersAlong, "finish", finish)
    assert info() == want
    assert len(seen) == 1 and 0 < seen[0] <= window + 2 * (2 << 20), seen


def test_prescan_the_same_in_windows(gsf_sample, monkeypatch):
    """The pre-scan of each real sample read a window of 16 kB at a time (many windows, the
    samples' scale-factor tables in every pattern) equals the pre-scan in one pass."""
    from pfm_dask.gsf import _decode
    from pfm_dask.planning import prescan_file

    want = prescan_file(str(gsf_sample))
    monkeypatch.setattr(_decode, "PASS_WINDOW", 16 << 10)
    assert prescan_file(str(gsf_sample)) == want


def test_keep_buffers_limits_the_recycled_decode_buffers(tmp_path):
    """``keep_buffers(n)``: at most n decode buffers kept from then on (a --serial load keeps one,
    none once its pieces are read), the previous limit returned; values unaffected."""
    from pfm_dask import synth
    from pfm_dask.gsf import _decode

    synth.generate(tmp_path, files=2, pings=200, beams=432, seed=8)
    paths = sorted(tmp_path.glob("*.gsf"))
    want = [gsf.read_pings(p) for p in paths]
    old = gsf.keep_buffers(1)
    try:
        assert len(_decode._POOL) <= 1
        kept = [gsf.read_pings(p) for p in paths]       # both alive: a second buffer is made
        assert len(_decode._POOL) <= 1
        assert gsf.keep_buffers(0) == 1 and _decode._POOL == []
        assert [gsf.read_pings(p).equals(w) for p, w in zip(paths, want)] == [True, True]
        assert _decode._POOL == [] and kept[0].equals(want[0]) and kept[1].equals(want[1])
    finally:
        assert gsf.keep_buffers(old) == 0
