"""What a load exposes, and where Dask may write: loopback addresses, TLS, a scratch folder.

* The embedded cluster (``--workers``, ``--cluster local``) listens on
  127.0.0.1 only: a Dask scheduler runs any code a connected client sends, so
  an open port would let anyone who reaches it run code as the load's user.
  Only the dashboard can be opened, on purpose (``--dashboard-address``).
* Other clusters are reached over Dask's TLS when asked: a
  :class:`distributed.Security` built from a CA, a certificate and a key, as
  ``dask scheduler --tls-ca-file/--tls-cert/--tls-key`` take them, or from
  Dask's own configuration (``distributed.comm.tls.*``).
* Dask's scratch space (each server's work folder, spilled data) goes to a
  temporary folder of the load that is removed when its cluster closes.

docs/cluster.md ("Security") has the user's view.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["LOOPBACK", "LOCAL_DASHBOARD", "TlsFiles", "dashboard_address_problem",
           "client_security", "scratch_folder", "scratch_spec_cluster"]

LOOPBACK = "127.0.0.1"
#: The embedded cluster's dashboard unless told otherwise: loopback, any free port.
LOCAL_DASHBOARD = f"{LOOPBACK}:0"


def dashboard_address_problem(address: str) -> str | None:
    """What is wrong with a dashboard address, or None: it must be ``HOST:PORT`` (``:PORT``
    and a bare ``PORT`` are every interface, as Dask reads them), caught here rather than
    in a Dask traceback."""
    host, sep, port = str(address).rpartition(":")
    if not sep and port.isdigit() and int(port) <= 65535:
        return None
    if not sep or not port.isdigit() or int(port) > 65535 or any(c in host for c in "/ ,"):
        return ("must be HOST:PORT, e.g. 127.0.0.1:8787, 0.0.0.0:8787 (every interface) or "
                f"127.0.0.1:0 (any free port), got {address!r}")
    return None


# ----------------------------------------------------------------------- TLS
@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of Dask's TLS: the CA that signed every party's certificate, and the
    certificate and key this side presents (the key may be appended to the certificate)."""

    ca_file: str
    cert: str
    key: str | None = None

    def check(self, source=None) -> "TlsFiles":
        """The files, expanded (``~``, ``$VAR``); a :class:`ConfigError` naming one that cannot be read."""
        paths = {}
        for name, value in (("ca_file", self.ca_file), ("cert", self.cert), ("key", self.key)):
            if value is None:
                paths[name] = None
                continue
            p = os.path.expandvars(os.path.expanduser(str(value)))
            if not os.path.isfile(p) or not os.access(p, os.R_OK):
                raise ConfigError(f"TLS {name.replace('_', ' ')} {p!r} is not a readable file",
                                  path=source)
            paths[name] = os.path.abspath(p)
        return TlsFiles(**paths)

    def security(self):
        """A :class:`distributed.Security` with these files for every role (client,
        scheduler, worker) and encryption required: plain-TCP peers are refused."""
        from distributed import Security

        kw = {"tls_ca_file": self.ca_file}
        for role in ("client", "scheduler", "worker"):
            kw[f"tls_{role}_cert"] = self.cert
            kw[f"tls_{role}_key"] = self.key
        return Security(require_encryption=True, **kw)


def tls_files(ca_file: str | None, cert: str | None, key: str | None,
              source=None, where: str = "--tls-") -> TlsFiles | None:
    """The three options (or profile keys) as :class:`TlsFiles`, None when none is given."""
    if ca_file is None and cert is None and key is None:
        return None
    if ca_file is None or cert is None:
        missing = " and ".join(n for n, v in (("ca-file", ca_file), ("cert", cert)) if v is None)
        raise ConfigError(f"TLS needs a CA file and a certificate: {where}{missing} missing",
                          path=source)
    return TlsFiles(ca_file, cert, key).check(source)


def client_security(address: str, files: TlsFiles | None):
    """``(address, security)`` for a :class:`distributed.Client` of an existing scheduler.

    With ``files``: their :class:`~distributed.Security`, and ``tls://`` added to an
    address without a protocol. Without: None (Dask's configuration applies, as for any
    Dask client), after checking that a ``tls://`` address has certificates there.
    """
    import dask

    proto, sep, _ = address.partition("://")
    if files is not None:
        if not sep:
            return "tls://" + address, files.security()
        if proto != "tls":
            raise ConfigError(f"TLS certificates were given, but the scheduler address "
                              f"{address!r} is not tls://")
        return address, files.security()
    if proto == "tls" and not dask.config.get("distributed.client.security-loader", None):
        from distributed import Security

        sec = Security()  # what Dask's configuration (~/.config/dask, DASK_*) gives
        if not (sec.tls_ca_file and sec.tls_client_cert):
            raise ConfigError(f"{address} is a TLS scheduler: give --tls-ca-file and --tls-cert "
                              "(and --tls-key), or set distributed.comm.tls.ca-file and "
                              "distributed.comm.tls.client.cert in Dask's configuration "
                              "(docs/cluster.md, Security)")
    return address, None


# ------------------------------------------------------------------- scratch
def scratch_folder() -> str:
    """A new folder for the Dask servers of one load, in Dask's ``temporary-directory`` or the
    system's temporary folder (``$TMPDIR``); :func:`scratch_spec_cluster` removes it."""
    import dask

    parent = dask.config.get("temporary-directory", None) or None
    return tempfile.mkdtemp(prefix="pfm-dask-", dir=parent)


@functools.cache
def scratch_spec_cluster():
    """A :class:`distributed.SpecCluster` that removes its ``scratch`` folder when it closes
    (and at interpreter exit, should it never be closed), and then calls ``on_close``."""
    from distributed import SpecCluster

    class ScratchSpecCluster(SpecCluster):
        def __init__(self, *args, scratch: str, on_close=None, **kwargs):
            self._scratch = scratch
            self._scratch_finalizer = weakref.finalize(self, shutil.rmtree, scratch, True)
            self._on_close = on_close
            try:
                super().__init__(*args, **kwargs)
            except BaseException:
                self._closed_here()
                raise

        def _closed_here(self) -> None:
            self._scratch_finalizer()
            if self._on_close is not None:
                self._on_close()

        async def _close(self):
            try:
                await super()._close()
            finally:
                self._closed_here()

        @property
        def dashboard_link(self):
            """The dashboard's link; an in-memory (inproc) scheduler's address names the
            machine's address, but the dashboard listens on loopback."""
            link = super().dashboard_link
            if link and self.scheduler_address.startswith("inproc://"):
                from distributed.utils import format_dashboard_link

                return format_dashboard_link(LOOPBACK,
                                             self.scheduler_info["services"]["dashboard"])
            return link

    return ScratchSpecCluster
