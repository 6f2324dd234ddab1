"""Dask's TLS: a load through a ``tls://`` scheduler, and batch profiles that pass TLS to their jobs.

A real ``dask scheduler`` and two ``dask worker`` processes on loopback, all
started with ``--tls-ca-file/--tls-cert/--tls-key`` and certificates made
here (``cryptography``). The load goes through ``--scheduler tls://...`` with
the same options and must write what ``--serial`` writes; a plain-TCP client,
and a TLS client whose certificate another CA signed, are refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pfm_dask import pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from .daskprocs import DaskProcesses

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------- certificates
def make_certificates(folder: Path, name: str = "ca") -> dict[str, Path]:
    """A CA and one certificate it signed (for 127.0.0.1 and localhost), as PEM files.

    Returns ``{"ca": ..., "cert": ..., "key": ...}``.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"pfm-dask test {name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=True, data_encipherment=False,
                                         key_agreement=True, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / f"{name}.pem", "cert": folder / f"{name}-cert.pem",
             "key": folder / f"{name}-key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def _tls_args(c: dict[str, Path]) -> list[str]:
    return ["--tls-ca-file", str(c["ca"]), "--tls-cert", str(c["cert"]), "--tls-key", str(c["key"])]


def _security(c: dict[str, Path]):
    """A Dask client's TLS settings for these files, built directly (not with our helper)."""
    from distributed import Security

    return Security(tls_ca_file=str(c["ca"]), tls_client_cert=str(c["cert"]),
                    tls_client_key=str(c["key"]), require_encryption=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("certs")
    return {"good": make_certificates(tmp, "ca"), "other": make_certificates(tmp, "other-ca")}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, certs):
    """``dask scheduler`` + a disk worker + a compute worker, TLS only, on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("tlscluster")
    sfile = tmp / "scheduler.json"
    tls = _tls_args(certs["good"])
    with DaskProcesses(tmp, dict(os.environ, PYTHONPATH=str(REPO))) as dp:
        sched = dp.spawn(["distributed.cli.dask_scheduler", "--protocol", "tls", "--host",
                          "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                          "--scheduler-file", str(sfile), "--preload", "pfm_dask.dashboard",
                          *tls], "scheduler")
        addr = dp.scheduler_identity(sfile, sched)["address"]
        assert addr.startswith("tls://127.0.0.1:"), addr
        for name, res in (("disk-node", "disk=1"), ("compute-node", "compute=1")):
            dp.spawn(["distributed.cli.dask_worker", addr, "--name", name, "--nthreads", "1",
                      "--resources", res, "--host", "127.0.0.1", "--no-dashboard", *tls], name)
        from distributed import Client

        with Client(addr, timeout="30s", security=_security(certs["good"])) as client:
            client.wait_for_workers(2, timeout=60)
            names = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        yield addr, names


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("tls-survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=7)
    return out


def _cli(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "pfm_dask.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


# ------------------------------------------------------------ --scheduler tls://
@pytest.mark.cluster
def test_load_through_a_tls_scheduler_writes_what_serial_writes(tls_cluster, certs, survey,
                                                               tmp_path):
    addr, names = tls_cluster
    out = tmp_path / "tls.pfm"
    r = _cli("load", survey, "-o", out, "--bin-size", "25", "--scheduler", addr,
             *_tls_args(certs["good"]), "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "tls.pfm.data" / "load-report.json").read_text())
    assert rep["writer_worker"] == names["disk-node"] and rep["check"]["sound"]
    ref = tmp_path / "serial.pfm"
    res = pipeline.run_load(expand_inputs([survey]), ref, LoadConfig(bin_size_m=25.0),
                            mode="serial")
    assert res.exit_code == 0
    for part in (".ndx", ".bin", ".lin", ".ctl"):
        a = (tmp_path / "serial.pfm.data" / f"serial.pfm{part}").read_bytes()
        b = (tmp_path / "tls.pfm.data" / f"tls.pfm{part}").read_bytes()
        if part == ".bin":  # the header holds the creation date
            a, b = a[131072:], b[131072:]
        if part == ".ctl":  # names the PFM
            a, b = a.replace(b"serial.pfm", b"X"), b.replace(b"tls.pfm", b"X")
        assert a == b, part


@pytest.mark.cluster
def test_plain_tcp_client_is_refused(tls_cluster):
    from distributed import Client

    addr, _ = tls_cluster
    with pytest.raises((OSError, TimeoutError)):
        Client(addr.replace("tls://", "tcp://"), timeout="5s").close()


@pytest.mark.cluster
def test_client_certified_by_another_ca_is_refused(tls_cluster, certs):
    from distributed import Client

    addr, _ = tls_cluster
    with pytest.raises((OSError, TimeoutError)):
        Client(addr, timeout="5s", security=_security(certs["other"])).close()


@pytest.mark.cluster
def test_tls_scheduler_without_certificates_is_a_one_line_error(tls_cluster, survey, tmp_path):
    addr, _ = tls_cluster
    env_free = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM")}
    r = subprocess.run([sys.executable, "-m", "pfm_dask.cli", "load", str(survey), "-o",
                        str(tmp_path / "x.pfm"), "--scheduler", addr, "-q"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(env_free, PYTHONPATH=str(REPO), DASK_CONFIG=str(tmp_path)))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert "TLS scheduler" in r.stderr and "--tls-ca-file" in r.stderr


def test_certificates_for_a_tcp_scheduler_are_an_error(certs, survey, tmp_path):
    r = _cli("load", survey, "-o", tmp_path / "x.pfm", "--scheduler", "tcp://127.0.0.1:1",
             *_tls_args(certs["good"]), "-q")
    assert r.returncode == 2 and "not tls://" in r.stderr and "Traceback" not in r.stderr


def test_tls_options_are_refused_for_the_embedded_cluster(certs, survey, tmp_path):
    r = _cli("load", survey, "-o", tmp_path / "x.pfm", *_tls_args(certs["good"]), "-q")
    assert r.returncode == 2 and "127.0.0.1" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_certificate_file_is_named(certs, survey, tmp_path):
    missing = tmp_path / "nope.pem"
    r = _cli("load", survey, "-o", tmp_path / "x.pfm", "--scheduler", "tls://127.0.0.1:1",
             "--tls-ca-file", certs["good"]["ca"], "--tls-cert", missing, "-q")
    assert r.returncode == 2 and str(missing) in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------- batch profiles
def _batch_profile(kind: str, c: dict[str, Path] | None) -> dict:
    prof = {"kind": kind,
            "compute": {"cores": 2, "processes": 1, "memory": "2GB", "walltime": "01:00:00"},
            "disk": {"memory": "2GB", "walltime": "02:00:00"}}
    if c is not None:
        prof["tls"] = {"ca_file": str(c["ca"]), "cert": str(c["cert"]), "key": str(c["key"])}
    return prof


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_profile_tls_goes_into_both_job_scripts(certs, kind):
    from pfm_dask.cluster import ClusterProfile, render_job_scripts

    c = certs["good"]
    scripts = render_job_scripts(ClusterProfile.from_dict(_batch_profile(kind, c)))
    for role, text in scripts.items():
        cmd = next(ln for ln in text.splitlines() if "distributed.cli.dask_worker" in ln)
        assert "tls://SCHEDULER:8786" in cmd, role
        assert "--protocol tls://" in cmd, role
        assert f"--tls-ca-file {c['ca']}" in cmd, role
        assert f"--tls-cert {c['cert']}" in cmd, role
        assert f"--tls-key {c['key']}" in cmd, role
    plain = render_job_scripts(ClusterProfile.from_dict(_batch_profile(kind, None)))
    for text in plain.values():
        assert "--tls-" not in text and "tcp://SCHEDULER:8786" in text


def test_tls_options_replace_a_batch_profiles_section(certs):
    from pfm_dask.cli import _exposure
    from pfm_dask.cluster import ClusterProfile

    prof = ClusterProfile.from_dict(_batch_profile("slurm", certs["good"]))
    o = certs["other"]
    new, files = _exposure("cluster", prof, None, (str(o["ca"]), str(o["cert"]), str(o["key"])))
    assert new.tls == files and files.ca_file == str(o["ca"]) and files.cert == str(o["cert"])
    assert prof.tls.ca_file == str(certs["good"]["ca"])  # the profile itself is left alone


def test_profile_tls_errors_name_the_key(certs, tmp_path):
    from pfm_dask.cluster import ClusterProfile
    from pfm_dask.errors import ConfigError

    c = certs["good"]
    bad = _batch_profile("slurm", c)
    del bad["tls"]["cert"]
    with pytest.raises(ConfigError, match=r"tls\.cert: missing"):
        ClusterProfile.from_dict(bad, source="p.yaml")
    bad = _batch_profile("slurm", c)
    bad["tls"]["key"] = str(tmp_path / "absent.pem")
    with pytest.raises(ConfigError, match="absent.pem"):
        ClusterProfile.from_dict(bad, source="p.yaml")
    with pytest.raises(ConfigError, match="127.0.0.1 only"):
        ClusterProfile.from_dict({"kind": "local", "tls": _batch_profile("slurm", c)["tls"]})
    with pytest.raises(ConfigError, match="127.0.0.1 only"):
        ClusterProfile.from_dict({"kind": "local", "scheduler": {"host": "0.0.0.0"}})


# ------------------------------------------- a slurm profile with TLS, for real
_FAKE_SBATCH = '''#!{python}
"""sbatch for the tests: runs the job script at once, in a session of its own; prints its id."""
import os, shutil, subprocess, sys
jobs = {jobs!r}
n = len([f for f in os.listdir(jobs) if f.endswith(".sh")])
script = os.path.join(jobs, f"job-{{n}}.sh")
shutil.copy(sys.argv[-1], script)
log = open(script[:-3] + ".log", "w")
p = subprocess.Popen(["bash", script], stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True)
with open(os.path.join(jobs, "ids"), "a") as f:
    f.write(f"{{p.pid}}\\n")
print(f"Submitted batch job {{p.pid}}")
'''
_FAKE_SCANCEL = '''#!{python}
"""scancel for the tests: ends the job's session (bash and its dask worker)."""
import os, signal, sys
for jid in sys.argv[1:]:
    try:
        os.killpg(int(jid), signal.SIGTERM)
    except (ProcessLookupError, ValueError):
        pass
'''


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """``sbatch``/``scancel`` that run the jobs as local processes; yields the jobs folder."""
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    for name, text in (("sbatch", _FAKE_SBATCH), ("scancel", _FAKE_SCANCEL)):
        f = bin_dir / name
        f.write_text(text.format(python=sys.executable, jobs=str(jobs)))
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    yield jobs
    ids = jobs / "ids"
    if ids.exists():  # jobs a failed test left running
        subprocess.run(["scancel", *ids.read_text().split()], check=False)


def _running(jobs: Path, wait: float = 15.0) -> list[int]:
    """The job sessions (ids) that still have processes after ``wait`` seconds."""
    import psutil

    ids = {int(i) for i in (jobs / "ids").read_text().split()}
    t0 = time.monotonic()
    while True:
        left = sorted({i for p in psutil.process_iter() if (i := _sid(p)) in ids})
        if not left or time.monotonic() - t0 > wait:
            return left
        time.sleep(0.2)


def _sid(p) -> int | None:
    try:
        return os.getsid(p.pid)
    except OSError:
        return None


@pytest.mark.cluster
def test_slurm_profile_with_tls_runs_its_jobs_over_tls(fake_slurm, certs, survey, tmp_path,
                                                       monkeypatch):
    """The in-process scheduler listens on tls:// only, both jobs' workers connect with the
    profile's certificates, the load writes what --serial writes, and the scheduler's scratch
    folder is gone afterwards."""
    import dask
    from distributed import Client

    from pfm_dask.cluster import ClusterProfile

    scratch_parent = tmp_path / "scratch"
    scratch_parent.mkdir()
    prof = ClusterProfile.from_dict({
        **_batch_profile("slurm", certs["good"]),
        "scheduler": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        "interface": "lo", "wait_timeout": 120, "death_timeout": 30})
    refused: list[str] = []

    def progress(status):
        if refused:
            return
        scripts = sorted(fake_slurm.glob("*.sh"))
        cmd = next(ln for ln in scripts[0].read_text().splitlines() if "dask_worker" in ln)
        addr = next(w for w in cmd.split() if w.startswith("tls://"))
        try:
            Client(addr.replace("tls://", "tcp://"), timeout="3s").close()
            refused.append("accepted")
        except (OSError, TimeoutError):
            refused.append("refused")

    out = tmp_path / "slurm-tls.pfm"
    with dask.config.set({"temporary-directory": str(scratch_parent)}):
        res = pipeline.run_load(expand_inputs([survey]), out, LoadConfig(bin_size_m=25.0),
                                mode="cluster", cluster_profile=prof, progress=progress)
    assert res.exit_code == 0, res.summary()
    assert refused == ["refused"]
    scripts = sorted(fake_slurm.glob("*.sh"))
    assert len(scripts) >= 2  # the disk-node job and a compute job
    for s in scripts:
        text = s.read_text()
        assert "--protocol tls://" in text and f"--tls-ca-file {certs['good']['ca']}" in text
    assert sorted(scratch_parent.iterdir()) == []
    assert _running(fake_slurm) == [], "scancel left job processes running"
    ref = tmp_path / "serial.pfm"
    assert pipeline.run_load(expand_inputs([survey]), ref, LoadConfig(bin_size_m=25.0),
                             mode="serial").exit_code == 0
    for part in (".ndx", ".lin"):
        assert (tmp_path / "serial.pfm.data" / f"serial.pfm{part}").read_bytes() == \
            (tmp_path / "slurm-tls.pfm.data" / f"slurm-tls.pfm{part}").read_bytes(), part
