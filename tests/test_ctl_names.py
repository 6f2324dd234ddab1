"""File names that are not latin-1 (issue 20): the ``.ctl`` and ``.lin`` hold each input's
path as the file system's bytes, so an ``--append`` recognises a file already loaded
(a name written as ``?`` was a different, missing file, and the file was loaded twice).

Reference: ``os.fsencode`` of the path given, compared with the raw bytes of the ``.ctl``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pfm_dask import pipeline, synth
from pfm_dask.config import LoadConfig
from pfm_dask.errors import ConfigError
from pfm_dask.pfm import open_pfm


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory):
    """Two survey files renamed: one UTF-8 name outside latin-1, one not UTF-8 at all."""
    root = tmp_path_factory.mktemp("names")
    synth.generate(root / "s", files=2, pings=12, beams=16, seed=5)
    a, b = sorted((root / "s").glob("*.gsf"))
    utf8 = root / "測線_α.gsf"
    raw = os.fsdecode(os.fsencode(str(root)) + b"/line_\xff\xfe.gsf")  # surrogate-escaped
    os.rename(a, utf8)
    try:
        os.rename(b, raw)
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system refuses names that are not UTF-8")
    return utf8, Path(raw)


def _ctl_names(pfm: Path) -> list[bytes]:
    data = Path(str(pfm) + ".data") / (pfm.name + ".ctl")
    return [ln.split(b" ", 3)[3] for ln in data.read_bytes().split(b"\n")[5:] if ln]


def test_ctl_holds_the_file_systems_bytes_and_append_recognises_them(odd_names, tmp_path):
    utf8, raw = odd_names
    out = tmp_path / "n.pfm"
    cfg = LoadConfig(bin_size_m=25.0)
    first = pipeline.run_load([str(utf8)], out, cfg, mode="serial")
    assert first.exit_code == 0, first.summary()
    names = _ctl_names(out)
    assert names == [os.fsencode(os.path.abspath(utf8))], names
    with open_pfm(out, "r") as f:
        assert [x.path for x in f.files()] == [os.path.abspath(utf8)]
    # the append skips the file already in the .ctl and adds the other, bytes intact
    res = pipeline.run_load([str(utf8), str(raw)], out, cfg, mode="serial", append=True)
    assert res.skipped_files == [str(utf8)], res.summary()
    assert [f["path"] for f in res.files] == [str(raw)]
    names = _ctl_names(out)
    assert names == [os.fsencode(os.path.abspath(utf8)), os.fsencode(os.path.abspath(raw))]
    assert b"?" not in b"".join(names)
    lin = (Path(str(out) + ".data") / (out.name + ".lin")).read_bytes()
    assert b"?" not in lin and lin.count(b"\n") >= 2
    with pytest.raises(ConfigError, match="already in the PFM"):   # both recognised now
        pipeline.run_load([str(utf8), str(raw)], out, cfg, mode="serial", append=True)
