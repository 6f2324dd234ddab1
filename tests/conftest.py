"""Shared fixtures: the real GSF samples (read in place, never copied into the repo)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES_DIR = Path(os.environ.get("PFM_DASK_GSF_SAMPLES",
                                  REPO.parent / "shared" / "data" / "gsf"))


def _samples() -> list[Path]:
    if not SAMPLES_DIR.is_dir():
        return []
    return sorted(p for p in SAMPLES_DIR.iterdir() if p.name.endswith(".mb121"))


SAMPLE_FILES = _samples()


def sample_id(path: Path) -> str:
    """A short readable test id: the file name without the repository prefix."""
    return path.name.split("__", 1)[-1].replace(".gsf.mb121", "").replace(".mb121", "")


def missing_sample(name: str | None = None) -> None:
    """Skip a test whose real GSF sample (``name``, or any) is absent, saying where to point;
    under CI, fail it. Every test that needs a sample goes through here."""
    what = f"real GSF sample {name}" if name else "real GSF samples"
    reason = f"{what} not found in {SAMPLES_DIR} (set PFM_DASK_GSF_SAMPLES)"
    if os.environ.get("CI"):
        pytest.fail(f"CI runs every sample test: {reason}")
    pytest.skip(reason)


# without samples, one placeholder parameter whose test skips (or fails under CI) with the
# reason, rather than pytest's own "got empty parameter set"
@pytest.fixture(params=SAMPLE_FILES or [None],
                ids=[sample_id(p) for p in SAMPLE_FILES] or ["no-samples"])
def gsf_sample(request) -> Path:
    """Each real GSF sample file in ../shared/data/gsf, one test per file."""
    if request.param is None:
        missing_sample()
    return request.param


@pytest.fixture
def sample_by_name():
    """Look a sample up by a fragment of its name, e.g. ``sample_by_name('EM302')``."""
    def find(fragment: str) -> Path:
        if not SAMPLE_FILES:
            missing_sample()
        hits = [p for p in SAMPLE_FILES if fragment in p.name]
        if not hits:
            missing_sample(f"matching {fragment!r}")
        if len(hits) > 1:   # a test's mistake, not a missing sample
            pytest.fail(f"{len(hits)} GSF samples match {fragment!r}: name one")
        return hits[0]
    return find
