"""Long-running fuzz of the GSF reader: only GsfError, or a lenient damage report, may come out.

Seeds are small synthetic files and the real samples (read in place from
``/work/shared/data/gsf``, never copied into the repository). Each iteration
mutates one seed (truncate, flip bytes, splice random bytes, overwrite a record's
size or id word, drop or repeat a record, zero a range), writes it to a
temporary file and reads it four ways: strict (a table or a GsfError), lenient
(a table of the pings before the damage, damage listed with byte offsets),
random ping ranges, and ``info``. Anything else escaping the reader, a lenient
table that is not well formed, or a damage entry without a GsfError type is a
failure: the input is saved under ``benchmarks/_work/fuzz_failures/``.

    python -m benchmarks.fuzz_gsf --seconds 600          # ten minutes
    python -m benchmarks.fuzz_gsf --seconds 30 --seed 7  # a quick look

With ``--atheris`` (if the atheris package is installed) the same check is the
target of a coverage-guided run instead of the random mutator.
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

from pfm_dask import gsf, synth
from pfm_dask.errors import GsfError

SAMPLES = Path(os.environ.get("PFM_DASK_GSF_SAMPLES", "/work/shared/data/gsf"))
FAILURES = Path(__file__).resolve().parent / "_work" / "fuzz_failures"


def seeds(tmp: Path) -> list[bytes]:
    out = []
    synth.generate(tmp / "synth", files=2, pings=12, beams=24, seed=3)
    out += [p.read_bytes() for p in sorted((tmp / "synth").glob("*.gsf"))]
    if SAMPLES.is_dir():
        out += [p.read_bytes() for p in sorted(SAMPLES.glob("*.mb121"))
                if p.stat().st_size < 8 << 20]
    return out


def records(blob: bytes) -> list[tuple[int, int]]:
    """(start, end) of each whole record, by a plain walk of the size words."""
    out, pos = [], 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        end = pos + (12 if word & 0x80000000 else 8) + size
        if end > len(blob) or size > 1 << 20:
            break
        out.append((pos, end))
        pos = end
    return out


def mutate(blob: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    b = bytearray(blob)
    recs = records(blob) or [(0, len(blob))]
    op = str(rng.choice(["truncate", "flip", "splice", "size", "id", "drop", "repeat", "zero"]))
    n = len(b)
    if op == "truncate":
        b = b[: int(rng.integers(0, max(1, n)))]
    elif op == "flip":
        for k in rng.integers(0, max(1, n), int(rng.integers(1, 32))):
            b[k] ^= int(rng.integers(1, 256))
    elif op == "splice":
        at = int(rng.integers(0, n + 1))
        b[at:at] = rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8).tobytes()
    elif op in ("size", "id"):
        s, _ = recs[int(rng.integers(0, len(recs)))]
        if s + 8 <= n:
            struct.pack_into(">I", b, s + (0 if op == "size" else 4), int(rng.integers(0, 2**32)))
    elif op == "drop":
        s, e = recs[int(rng.integers(0, len(recs)))]
        del b[s:e]
    elif op == "repeat":
        s, e = recs[int(rng.integers(0, len(recs)))]
        b[e:e] = b[s:e]
    else:
        a = int(rng.integers(0, max(1, n)))
        m = int(rng.integers(1, 512))
        b[a: a + m] = bytes(len(b[a: a + m]))
    return op, bytes(b)


def check_one(path: str, rng: np.random.Generator) -> str:
    """Read ``path`` every way; return the strict outcome's kind; raise on a reader bug."""
    try:
        gsf.read_pings(path)
        outcome = "ok"
    except GsfError:
        outcome = "GsfError"
    try:
        with gsf.GsfFile(path, strict=False) as f:
            t = f.read()
            for d in f.damage:
                if not isinstance(d, GsfError):
                    raise AssertionError(f"damage entry is a {type(d).__name__}, not a GsfError")
            ping = t.column("ping").to_numpy()
            if t.num_rows and not (ping[0] == 1 and np.all(np.diff(ping) >= 0)
                                   and np.all(np.diff(ping) <= 1)):
                raise AssertionError("lenient table's ping numbers are not 1, 2, 3, ...")
            n = f.n_pings
            if n:
                a = int(rng.integers(0, n))
                f.read(a, int(rng.integers(a, n + 1)))
    except GsfError:
        pass
    try:
        gsf.info(path)
    except GsfError:
        pass
    return outcome


def run(seconds: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pool = seeds(tmp)
        path = str(tmp / "fuzz.gsf")
        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds:
            op, data = mutate(pool[int(rng.integers(0, len(pool)))], rng)
            with open(path, "wb") as fh:
                fh.write(data)
            try:
                counts[(op, check_one(path, rng))] += 1
            except Exception:  # noqa: BLE001 - this is what we are looking for
                failures += 1
                FAILURES.mkdir(parents=True, exist_ok=True)
                keep = FAILURES / f"seed{seed}-iter{i}-{op}.gsf"
                keep.write_bytes(data)
                print(f"FAILURE ({op}): saved {keep}\n{traceback.format_exc()}", file=sys.stderr)
            i += 1
    total = sum(counts.values()) + failures
    return {"iterations": total, "seconds": seconds, "failures": failures,
            "by_mutation": {f"{op}/{kind}": n for (op, kind), n in sorted(counts.items())}}


def run_atheris() -> None:  # pragma: no cover - needs atheris
    import atheris

    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp())
    path = str(tmp / "fuzz.gsf")

    def target(data: bytes) -> None:
        with open(path, "wb") as fh:
            fh.write(data)
        check_one(path, rng)

    atheris.Setup(sys.argv[:1], target)
    atheris.Fuzz()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atheris", action="store_true", help="coverage-guided (needs atheris)")
    args = ap.parse_args(argv)
    if args.atheris:
        run_atheris()
        return {}
    res = run(args.seconds, args.seed)
    print(f"{res['iterations']:,} mutated inputs in {args.seconds:g}s, "
          f"{res['failures']} failure(s)")
    for k, v in res["by_mutation"].items():
        print(f"  {k:24s} {v:,}")
    if res["failures"]:
        raise SystemExit(1)
    return res


if __name__ == "__main__":
    main()
