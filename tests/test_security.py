"""What a load exposes and where it writes (docs/cluster.md, "Security").

* The embedded cluster listens on loopback only: the scheduler, the nannies,
  the workers and every HTTP server, read from ``/proc/net/tcp{,6}`` while a
  load runs; ``--dashboard-address`` opens the dashboard, and nothing else.
* Nothing is written outside the output but the numba cache folder: Dask's
  scratch space is a temporary folder removed at the end, numba's cache goes
  to ``$XDG_CACHE_HOME/pfm-dask/numba`` unless ``NUMBA_CACHE_DIR`` says otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ helpers
def _proc_net_listening() -> dict[int, tuple[str, int]]:
    """``{socket inode: (address, port)}`` of every listening TCP socket, from /proc/net/tcp{,6}."""
    out = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # TCP_LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out[int(f[9])] = (socket.inet_ntop(family, raw), int(hexport, 16))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _listening_of_tree(root: int) -> dict[tuple[int, str, int], str]:
    """Listening sockets of ``root`` and all its descendants: ``{(pid, addr, port): cmdline}``."""
    try:
        procs = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    table = _proc_net_listening()
    found = {}
    for p in procs:
        for ino in _socket_inodes(p.pid):
            if ino in table:
                try:
                    cmd = " ".join(p.cmdline())[:100]
                except psutil.Error:
                    cmd = "?"
                found[(p.pid, *table[ino])] = cmd
    return found


def _loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback  # 127.0.0.0/8 and ::1


def _watched_load(args: list[str], env: dict, cwd: Path, timeout: float = 300):
    """Run ``pfm-dask load ARGS`` and read the listening sockets of its process tree every 0.1 s.

    Returns (exit code, stdout, stderr, {(pid, addr, port): cmdline} over the whole load).
    """
    out, err = cwd / "load.out", cwd / "load.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen([sys.executable, "-m", "pfm_dask.cli", "load", *args],
                             stdout=fo, stderr=fe, env=env, cwd=cwd)
        seen: dict = {}
        t0 = time.monotonic()
        try:
            while p.poll() is None:
                seen.update(_listening_of_tree(p.pid))
                if time.monotonic() - t0 > timeout:
                    raise AssertionError("the load did not finish in time")
                time.sleep(0.1)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
    return p.returncode, out.read_text(), err.read_text(), seen


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), **extra)


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("sec-survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=5)
    return out


# --------------------------------------------- the embedded cluster's sockets
@pytest.fixture(scope="module")
def default_load(survey, tmp_path_factory):
    """One default load on the embedded cluster (2 workers), watched from outside.

    ``TMPDIR`` points at an empty folder of its own, to see what the load leaves there.
    """
    tmp = tmp_path_factory.mktemp("sec-load")
    tmpdir = tmp / "tmp"
    tmpdir.mkdir()
    code, out, err, seen = _watched_load(
        [str(survey), "-o", str(tmp / "out.pfm"), "--bin-size", "25", "-q", "--json",
         "--workers", "2"],                   # a small input loads in-process by default
        _env(TMPDIR=str(tmpdir)), tmp)
    assert code == 0, err[-3000:]
    return {"report": json.loads(out), "seen": seen, "tmpdir": tmpdir, "err": err}


@pytest.mark.cluster
def test_embedded_cluster_listens_on_loopback_only(default_load):
    seen = default_load["seen"]
    # the scheduler's and the worker's dashboards; scheduler and worker talk in memory
    # (inproc, in the load's process: no nanny), so neither listens for Dask's messages
    assert len({(a, port) for _, a, port in seen}) >= 2, seen
    open_ = {k: v for k, v in seen.items() if not _loopback(k[1])}
    assert not open_, f"listening outside loopback: {open_}"
    assert default_load["report"]["dashboard"].startswith("http://127.0.0.1:")


@pytest.mark.cluster
def test_dashboard_exposed_only_when_asked():
    """``dashboard_address`` opens the dashboard (``--dashboard-address``), and nothing else."""
    from distributed import Client

    from pfm_dask.cluster import make_local_cluster

    before = set(_listening_of_tree(os.getpid()))
    with make_local_cluster(1, dashboard_address="0.0.0.0:0") as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(1, timeout=120)
        seen = {k: v for k, v in _listening_of_tree(os.getpid()).items() if k not in before}
        dash_port = int(client.dashboard_link.rsplit(":", 1)[1].split("/", 1)[0])
    assert len(seen) >= 2, seen  # the scheduler's and the worker's dashboards (inproc, no nanny)
    open_ = {(a, port) for _, a, port in seen if not _loopback(a)}
    assert open_ == {("0.0.0.0", dash_port)}, seen


@pytest.mark.parametrize("address", ["0.0.0.0", "host:99999", "a b:1", "http://x:1"])
def test_bad_dashboard_address_is_a_one_line_error(survey, tmp_path, address):
    from typer.testing import CliRunner

    from pfm_dask.cli import app
    from pfm_dask.cluster import ClusterProfile
    from pfm_dask.errors import ConfigError

    r = CliRunner().invoke(app, ["load", str(survey), "-o", str(tmp_path / "x.pfm"),
                                 "--dashboard-address", address])
    assert r.exit_code == 2 and "--dashboard-address must be HOST:PORT" in r.output, r.output
    with pytest.raises(ConfigError, match="scheduler.dashboard_address: must be HOST:PORT"):
        ClusterProfile.from_dict({"kind": "local", "scheduler": {"dashboard_address": address}},
                                 source="p.yaml")


def test_dashboard_address_refused_where_pfm_dask_starts_no_cluster(survey, tmp_path):
    from typer.testing import CliRunner

    from pfm_dask.cli import app

    r = CliRunner().invoke(app, ["load", str(survey), "-o", str(tmp_path / "x.pfm"),
                                 "--serial", "--dashboard-address", "0.0.0.0:8787"])
    assert r.exit_code == 2 and "--dashboard-address" in r.output, r.output
    assert not (tmp_path / "x.pfm").exists()


# ------------------------------------------------------- nothing left behind
@pytest.mark.cluster
def test_no_dask_scratch_left_in_the_temp_folder(default_load):
    left = sorted(str(p.relative_to(default_load["tmpdir"]))
                  for p in default_load["tmpdir"].rglob("*"))
    assert left == [], left


_NUMBA_PROBE = textwrap.dedent("""
    import json, os, sys
    if sys.argv[1] == "numba-first":
        import numba
    import pfm_dask
    import numba
    print(json.dumps({"env": os.environ.get("NUMBA_CACHE_DIR"),
                      "config": numba.config.CACHE_DIR}))
""")


def _numba_env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp / "xdg"), HOME=str(tmp / "home"),
               PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


@pytest.mark.parametrize("order", ["pfm-dask-first", "numba-first"])
def test_numba_cache_goes_to_the_user_cache_folder(tmp_path, order):
    r = subprocess.run([sys.executable, "-c", _NUMBA_PROBE, order], env=_numba_env(tmp_path),
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    want = str(tmp_path / "xdg" / "pfm-dask" / "numba")
    assert got == {"env": want, "config": want}


def test_numba_cache_without_xdg_is_under_home(tmp_path):
    env = _numba_env(tmp_path)
    del env["XDG_CACHE_HOME"]
    r = subprocess.run([sys.executable, "-c", _NUMBA_PROBE, "x"], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["config"] == str(tmp_path / "home" / ".cache" / "pfm-dask" / "numba")


def test_users_numba_cache_dir_is_kept(tmp_path):
    mine = str(tmp_path / "mine")
    r = subprocess.run([sys.executable, "-c", _NUMBA_PROBE, "x"],
                       env=_numba_env(tmp_path, NUMBA_CACHE_DIR=mine),
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout) == {"env": mine, "config": mine}


_KERNEL_PROBE = textwrap.dedent("""
    from pfm_dask import geodesy
    print(geodesy._kernel("direct")._cache._cache_path)
""")


def test_compiled_kernel_is_cached_in_the_user_folder_not_the_package(tmp_path):
    """A real kernel compiled with ``cache=True``: its index lands in the user's cache folder."""
    r = subprocess.run([sys.executable, "-c", _KERNEL_PROBE], env=_numba_env(tmp_path),
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    cache_path = Path(r.stdout.strip())
    root = tmp_path / "xdg" / "pfm-dask" / "numba"
    assert root in cache_path.parents, cache_path
    assert list(root.rglob("*.nbi")), "no numba index written to the user cache folder"
