"""Chaos: loads killed at random moments (whole run, the writer's worker, a compute worker),
resumed, and compared with an uninterrupted run; and what the journal costs.

Each trial starts ``pfm-dask load`` as its own process group and, at a moment drawn
uniformly over an uninterrupted run's duration (so kills land in the pre-scan, the loading,
the area filter, the recompute, the check, or after the end), SIGKILLs:

* ``whole``   — the whole process group (driver and workers), serial or Dask;
* ``writer``  — the worker process that holds the writer actor (its pid is in the journal);
* ``compute`` — a worker process that does not hold the writer.

If the load did not finish by itself, the trial runs the same command with ``--resume``.
The result must equal the uninterrupted serial run: equal Parquet dumps, and the ``.ndx``,
``.cvg``, ``.lin`` and bin records byte for byte. The script prints how many matched.

The journal's cost is measured two ways on uninterrupted runs: the time the writer spends
on it (checkpoints, undo log, touched log) as a fraction of the run, and the wall time of
the same load with the journal switched off (``run_load(journal=False)``).

    python -m benchmarks.chaos                  # 24 trials on a ~40 MB survey (~15 min)
    python -m benchmarks.chaos --trials 4 --quick
    python -m benchmarks.chaos --cost-gb 1.1    # the journal's cost on a 1.1 GB survey too
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from pfm_dask import pfm, pipeline, synth
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from ._report import DATA_DIR, remove_pfm, write_results

WORK = Path(__file__).resolve().parent / "_work" / "chaos"
OPTS = ["--bin-size", "50", "--area-filter", "--two-sided", "--cellstd", "2", "-q"]
CFG = LoadConfig(bin_size_m=50.0, area_filter=True, deep_only=False, cellstd=2.0)
KINDS = [("serial", "whole"), ("dask", "whole"), ("dask", "writer"), ("dask", "compute")]


def survey(files: int, pings: int, seed: int = 21) -> Path:
    out = DATA_DIR / f"chaos_{files}x{pings}_s{seed}"
    if not (out / "survey.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        synth.generate(out, files=files, pings=pings, beams=432, seed=seed)
    return out


def _cmd(data: Path, out: Path, mode: str, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pfm_dask.cli", "load", str(data), "-o", str(out), *OPTS, *extra]
    if mode == "serial":
        cmd.append("--serial")
    return cmd


def _journal_pid(out: Path) -> int | None:
    try:
        return int(json.loads((Path(str(out) + ".data") / "journal.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _phase(out: Path) -> str | None:
    """The journal's phase now (None: no journal yet: cluster start, pre-scan)."""
    try:
        return json.loads((Path(str(out) + ".data") / "journal.json").read_text())["phase"]
    except (OSError, ValueError, KeyError):
        return None


def _workers(driver: int) -> list:
    import psutil

    try:
        kids = psutil.Process(driver).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:
            cl = " ".join(k.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cl and "resource_tracker" not in cl:
            out.append(k)
    return out


def _kill(proc: subprocess.Popen, out: Path, target: str) -> str:
    """SIGKILL the target now; returns what was killed."""
    import psutil

    try:
        return _kill_now(proc, out, target)
    except (ProcessLookupError, psutil.NoSuchProcess):
        return "nothing (the target had already exited)"


def _kill_now(proc: subprocess.Popen, out: Path, target: str) -> str:
    if target == "whole":
        os.killpg(proc.pid, signal.SIGKILL)
        return "process group"
    writer = _journal_pid(out)
    if target == "writer":
        if writer is None or writer == proc.pid:
            return "nothing (no writer worker yet)"
        os.kill(writer, signal.SIGKILL)
        return f"writer worker {writer}"
    cands = [w for w in _workers(proc.pid) if w.pid != writer]
    if not cands:
        return "nothing (no compute-only worker)"
    cands[0].kill()
    return f"compute worker {cands[0].pid}"


def _run(cmd: list[str], log: Path, timeout: float) -> int:
    with open(log, "w") as fh:
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return p.wait(timeout)
        finally:
            _reap(p)


def _reap(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # leftovers of the group (orphaned workers)
    except (ProcessLookupError, PermissionError):
        pass


def _dump(p: Path, tag: str):
    d = WORK / "dumps"
    d.mkdir(parents=True, exist_ok=True)
    s, b = d / f"{tag}-s.parquet", d / f"{tag}-b.parquet"
    pfm.dump(p, soundings=s, bins=b)
    return pq.read_table(s), pq.read_table(b)


def _parts(p: Path) -> dict:
    stem = Path(str(p) + ".data") / p.name
    return {e: Path(str(stem) + e) for e in (".bin", ".ndx", ".cvg", ".lin")}


def same(got: Path, ref: Path, ref_dump, tag: str) -> tuple[bool, str]:
    """Equal dumps, identical parts (bin records without the header's date)."""
    if pfm.check(got):
        return False, "check: " + str(pfm.check(got)[0])
    s, b = _dump(got, tag)
    if not (s.equals(ref_dump[0]) and b.equals(ref_dump[1])):
        return False, "dumps differ"
    g, r = _parts(got), _parts(ref)
    for e in (".ndx", ".cvg", ".lin"):
        if g[e].read_bytes() != r[e].read_bytes():
            return False, f"{e} bytes differ"
    with pfm.open_pfm(got) as f:
        hs = f.bin_header_size
    if g[".bin"].read_bytes()[hs:] != r[".bin"].read_bytes()[hs:]:
        return False, "bin records differ"
    return True, "same"


def reference(data: Path, mode: str, extra: list[str]) -> tuple[Path, float, dict]:
    out = WORK / f"ref-{mode}.pfm"
    remove_pfm(out)
    t = time.perf_counter()
    rc = _run(_cmd(data, out, mode, extra + ["--json"]), WORK / f"ref-{mode}.log", 3600)
    wall = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"reference {mode} run failed: see {WORK / f'ref-{mode}.log'}")
    rep = json.loads((Path(str(out) + ".data") / "load-report.json").read_text())
    return out, wall, rep


def trial(i: int, data: Path, mode: str, target: str, at: float, extra: list[str], ref: Path,
          ref_dump, timeout: float) -> dict:
    out = WORK / f"trial-{i:03d}.pfm"
    remove_pfm(out)
    cmd = _cmd(data, out, mode, extra)
    log = WORK / f"trial-{i:03d}.log"
    with open(log, "w") as fh:
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.perf_counter()
        killed = "nothing (finished first)"
        phase = None
        while p.poll() is None and time.perf_counter() - t0 < at:
            time.sleep(0.02)
        while p.poll() is None:
            phase = _phase(out)
            killed = _kill(p, out, target)
            if not killed.startswith("nothing (no "):
                break
            time.sleep(0.05)  # the target does not exist yet (cluster starting): wait for it
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        _reap(p)
    rec = {"trial": i, "mode": mode, "target": target, "kill_at_s": round(at, 2),
           "killed": killed, "exit": rc, "journal_phase_at_kill": phase, "resumed": False}
    if rc != 0:
        rrc = _run(cmd + ["--resume"], WORK / f"trial-{i:03d}-resume.log", timeout)
        rec["resumed"] = True
        rec["resume_exit"] = rrc
        if rrc != 0:
            rec["match"], rec["why"] = False, f"resume exit {rrc}"
            return rec
    ok, why = same(out, ref, ref_dump, f"t{i}")
    rec["match"], rec["why"] = ok, why
    if ok:
        remove_pfm(out)
    return rec


def journal_cost(data: Path, repeat: int, checkpoint_seconds: float) -> dict:
    """Uninterrupted serial loads with and without the journal (interleaved).

    Without the journal nothing is fsynced; the fair baseline is that load made durable at
    its end (every part fsynced), as any loader must before it calls its output done: that
    fsync is timed and added ("durable" below). Each run starts with clean page cache dirt
    (``os.sync``) so that one run's writeback does not land in the next one's time.
    """
    from pfm_dask.journal import fsync_dir, fsync_path

    paths = expand_inputs([data])
    on, off, off_durable, inside = [], [], [], []
    for r in range(repeat):
        for journal in (True, False):
            out = WORK / f"cost-{'on' if journal else 'off'}.pfm"
            remove_pfm(out)
            os.sync()
            t = time.perf_counter()
            res = pipeline.run_load(paths, out, CFG, mode="serial", journal=journal,
                                    checkpoint_seconds=checkpoint_seconds)
            wall = time.perf_counter() - t
            assert res.exit_code == 0, res.summary()
            if journal:
                on.append(wall)
                inside.append(res.journal["seconds"] / wall)
            else:
                t = time.perf_counter()
                for p in Path(str(out) + ".data").iterdir():
                    fsync_path(p)
                fsync_path(out)
                fsync_dir(out.parent)
                off.append(wall)
                off_durable.append(wall + time.perf_counter() - t)
            remove_pfm(out)

    def med(x):
        return sorted(x)[len(x) // 2]

    return {"gsf_bytes": sum(os.path.getsize(p) for p in paths), "repeat": repeat,
            "checkpoint_seconds": checkpoint_seconds,
            "wall_with_journal_s": on, "wall_without_journal_s": off,
            "wall_without_journal_then_fsync_s": off_durable,
            "writer_journal_fraction_median": med(inside),
            "ab_fraction_vs_durable": (med(on) - med(off_durable)) / med(off_durable),
            "ab_fraction_vs_not_durable": (med(on) - med(off)) / med(off)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24, help="loads to kill (trials whose load "
                    "ended before its kill moment do not count; at most twice as many run)")
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--pings", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint-seconds", type=float, default=1.0,
                    help="checkpoint interval of the chaos runs (short, so kills land between "
                         "checkpoints and the undo log is exercised)")
    ap.add_argument("--cost-repeat", type=int, default=3)
    ap.add_argument("--cost-gb", type=float, default=0.0,
                    help="also measure the journal's cost on the bench_load survey of this size")
    ap.add_argument("--quick", action="store_true", help="a tiny survey")
    ap.add_argument("--no-cost", action="store_true", help="kills only, no cost runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.pings = 4, 60
    WORK.mkdir(parents=True, exist_ok=True)
    data = survey(args.files, args.pings)
    rng = random.Random(args.seed)
    extra = ["--checkpoint-seconds", str(args.checkpoint_seconds)]

    ref, t_serial, ref_rep = reference(data, "serial", extra)
    ref_dump = _dump(ref, "ref")
    ref_dask, t_dask, dask_rep = reference(data, "dask", extra)
    ok, why = same(ref_dask, ref, ref_dump, "ref-dask")
    print(f"reference runs: serial {t_serial:.1f}s, dask {t_dask:.1f}s; dask == serial: {why}",
          flush=True)
    if not ok:
        raise SystemExit("the uninterrupted Dask run differs from the serial one")
    durations = {"serial": t_serial, "dask": t_dask}
    timeout = 10 * max(t_serial, t_dask) + 120
    trials = []
    kills = 0
    i = 0
    while kills < args.trials and i < 2 * args.trials:
        mode, target = KINDS[i % len(KINDS)]
        # over a whole uninterrupted run (a load that ends first is not counted as killed)
        at = rng.uniform(0.3, durations[mode])
        rec = trial(i, data, mode, target, at, extra, ref, ref_dump, timeout)
        trials.append(rec)
        kills += not rec["killed"].startswith("nothing")
        i += 1
        print(f"trial {rec['trial']:2d} {mode:6s} kill {target:7s} at {rec['kill_at_s']:6.2f}s "
              f"({rec['killed']}; journal phase {rec['journal_phase_at_kill']}; exit {rec['exit']}"
              f"{'; resumed' if rec['resumed'] else ''}): {rec['why']}", flush=True)
    matched = sum(t["match"] for t in trials)
    killed = [t for t in trials if not t["killed"].startswith("nothing")]
    print(f"\n{sum(t['match'] for t in killed)} of {len(killed)} killed loads matched the "
          f"uninterrupted run ({matched} of {len(trials)} trials, counting those that ended "
          "before their kill)")

    cost = {}
    if not args.no_cost:
        cost["chaos_survey"] = journal_cost(data, args.cost_repeat, 10.0)
        cost["chaos_survey_short_interval"] = journal_cost(data, args.cost_repeat,
                                                           args.checkpoint_seconds)
    if args.cost_gb and not args.no_cost:
        from .bench_load import survey as bench_survey

        cost["bench_survey"] = journal_cost(bench_survey(args.cost_gb, 48), 3, 10.0)
    for name, c in cost.items():
        print(f"journal cost ({name}, {c['gsf_bytes'] / 1e6:.0f} MB, checkpoint every "
              f"{c['checkpoint_seconds']:g}s, median of {c['repeat']}): writer time "
              f"{100 * c['writer_journal_fraction_median']:.1f}% of the load; wall time "
              f"{100 * c['ab_fraction_vs_durable']:+.1f}% against the same load fsynced at its "
              f"end, {100 * c['ab_fraction_vs_not_durable']:+.1f}% against it not fsynced at all")
    results = {"survey": str(data),
               "gsf_bytes": sum(os.path.getsize(p) for p in expand_inputs([data])),
               "trials": trials, "matched": matched, "total": len(trials),
               "killed": len(killed), "killed_matched": sum(t["match"] for t in killed),
               "reference_seconds": durations,
               "journal_writer_fraction_in_reference": {
                   "serial": ref_rep.get("journal", {}).get("fraction_of_total"),
                   "dask": dask_rep.get("journal", {}).get("fraction_of_total")},
               "journal_cost": cost, "target": "all match; journal < 5% of load time"}
    write_results("chaos" if not args.no_cost else "chaos_kills", results)
    return results


if __name__ == "__main__":
    main()
