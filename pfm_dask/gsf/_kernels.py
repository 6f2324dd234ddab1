"""numba kernels of the GSF reader: the record walk, the subrecord walk of many pings, the decode.

Real files change their ping layout from ping to ping (a scale-factor table in some pings
only, optional arrays, an intensity series of varying size), so the pings cannot be decoded
as one block; walking them one by one in Python was the reader's cost. ``_k_walk`` walks the
subrecords of a run of pings with the same rules as :func:`._decode.walk_ping` (libgsf's
width inference and look-ahead, scale-factor tables merged into a state carried from ping to
ping) and stops at the first ping that needs anything else: damage, or state from before the
run. Python then walks that ping with :func:`._decode.walk_ping`, which raises the error
(naming file and byte offset) or resolves the state, and the kernel resumes after it.
``_k_decode`` then turns every ping's arrays into the output columns in one pass.
``_k_frame`` lists the records of a file (sizes change from ping to ping in real files, so
each record header is read in turn); it leaves checksummed records and damage to Python.

Kernels are compiled on first use (or loaded from numba's on-disk cache) and never import
Dask. No fastmath: every value is ``float64(raw) / multiplier - offset``, as libgsf computes.
"""

from __future__ import annotations

import numpy as np

from .._numeric import CompiledKernels
from ._records import (ARRAY_SPECS, MAX_ARRAY_ID, MAX_BEAMS, MAX_RECORD_SIZE, MIN_RECORD_SIZE,
                       OUTPUT_ARRAYS)

__all__ = ["SPEC_TABLE", "OUT_SIGNED", "FLAGS_SLOT", "kernel"]

_SUB_SCALE_FACTORS = 100
_SUB_QUALITY_FLAGS = 15

#: Per subrecord id 0..255, the walk's view of ARRAY_SPECS: is_array, fixed, default width,
#: allowed widths (bit mask of 1, 2, 4), scaled, output slot (-1 = not a column).
SPEC_TABLE = np.zeros((256, 6), dtype=np.int64)
SPEC_TABLE[:, 5] = -1
for _sid, _s in ARRAY_SPECS.items():
    SPEC_TABLE[_sid, :5] = (1, int(_s.fixed), _s.default, sum(_s.widths), int(_s.scaled))
for _k, _sid in enumerate(OUTPUT_ARRAYS):
    SPEC_TABLE[_sid, 5] = _k
#: Per output slot: 1 if the array's integers are signed.
OUT_SIGNED = np.array([int(ARRAY_SPECS[s].signed) for s in OUTPUT_ARRAYS], dtype=np.int64)
_N_OUT = len(OUTPUT_ARRAYS)
#: The output slot of the beam flags (16), the one array column that is not scaled.
FLAGS_SLOT = list(OUTPUT_ARRAYS).index(16)
assert [not ARRAY_SPECS[s].scaled for s in OUTPUT_ARRAYS].count(True) == 1


def _field_size(v):
    """The field-size nibble for a byte width of 1, 2 or 4; -1 for any other quotient."""
    if v == 1:
        return 0x10
    if v == 2:
        return 0x20
    if v == 4:
        return 0x40
    return -1


def _size_or_high(width, sid, high, hknown):
    """The field-size nibble for ``width`` bytes per beam, else the array's last known one
    (``high``), else -1 (no way to tell: the Python walk decides)."""
    fs = _field_size(width)
    if fs < 0 and hknown[sid] != 0:
        fs = high[sid] & 0xF0
    return fs


def _u32(u8, at):
    return (np.int64(u8[at]) << 24) | (np.int64(u8[at + 1]) << 16) \
        | (np.int64(u8[at + 2]) << 8) | np.int64(u8[at + 3])


def _bswap32(x):
    """A uint32 with its bytes reversed (big-endian word read natively)."""
    return ((x >> np.uint32(24)) & np.uint32(0xFF)) | ((x >> np.uint32(8)) & np.uint32(0xFF00)) \
        | ((x << np.uint32(8)) & np.uint32(0xFF0000)) | ((x << np.uint32(24)) & np.uint32(0xFF000000))


def _k_frame(u8, pos, offs, sizes, ids, state):
    """List the plain records from byte ``pos`` on: offset, data size, record id.

    Stops (``state`` = [records listed, next position]) and returns 0 at the end of the
    file (fewer than 8 bytes left), 1 when the output arrays are full, 2 at a record Python
    must look at: one with a checksum word, or whose size is out of bounds or past the end.
    """
    n = len(u8)
    cap = len(offs)
    k = 0
    code = 0
    while pos + 8 <= n:
        if k == cap:
            code = 1
            break
        size = _u32(u8, pos)
        word = _u32(u8, pos + 4)
        if (word & 0x80000000) or size > MAX_RECORD_SIZE or size < MIN_RECORD_SIZE \
                or pos + 8 + size > n:
            code = 2
            break
        offs[k] = pos
        sizes[k] = size
        ids[k] = word & 0x3FFFFF
        k += 1
        pos += 8 + size
    state[0] = k
    state[1] = pos
    return code


def _k_walk(u8, doffs, sizes, hdr_len, i0, spec, mult, soff, low, high, tknown, hknown,
            nb, pos, width, mul_out, off_out, seen, saved):
    """Walk pings i0.. of (``doffs``, ``sizes``), updating the scale-factor state in place.

    State per array id 0..31: ``mult``, ``soff``, ``low`` (compression nibble), ``high``
    (field-size nibble); ``tknown``/``hknown`` say whether the table entry / the nibble
    is known (0: it lies before the run). Fills row i of ``nb``, ``pos``, ``width``,
    ``mul_out``, ``off_out`` per ping, marks subrecord ids met in ``seen``. Returns the
    index of the first ping it could not walk (state restored to before that ping, its
    row untouched), or len(doffs) when all were walked. ``saved`` is scratch (6, 32).
    """
    n_pings = len(doffs)
    n_file = len(u8)
    for i in range(i0, n_pings):
        saved[0, :] = mult
        saved[1, :] = soff
        saved[2, :] = low
        saved[3, :] = high
        saved[4, :] = tknown
        saved[5, :] = hknown
        doff = doffs[i]
        size = sizes[i]
        ok = size >= hdr_len and doff >= 0 and doff + size <= n_file
        n = 0
        if ok:
            n = (np.int64(u8[doff + 16]) << 8) | np.int64(u8[doff + 17])
            ok = 0 < n <= MAX_BEAMS
        end = doff + size
        p = doff + hdr_len
        while ok and end - p > 4:
            word = _u32(u8, p)
            sid = word >> 24
            ssize = word & 0xFFFFFF
            q = p + 4
            seen[sid] = 1
            if spec[sid, 0] == 1:
                fs = _size_or_high(ssize // n, sid, high, hknown)
                if fs < 0:
                    ok = False
                    break
                sr = ssize
                count = 0
                while True:
                    more = end - p - sr > 4
                    if not (more and count <= 3):
                        break
                    nq = q + sr
                    if nq + 4 <= end:
                        nw = _u32(u8, nq)
                        nid = nw >> 24
                        nsz = nw & 0xFFFFFF
                        if 0 < nid <= MAX_ARRAY_ID and (nsz == n or nsz == 2 * n
                                                        or nsz == 4 * n):
                            fs = _size_or_high(sr // n, sid, high, hknown)
                            if fs < 0:
                                ok = False
                            break
                    if count < 3:
                        sr = n * (1 << count)       # 1, 2, 4 bytes per beam
                    count += 1
                if not ok:
                    break
                high[sid] = fs
                hknown[sid] = 1
                if spec[sid, 1] == 1:
                    w = spec[sid, 2]
                else:
                    w = 1 if fs == 0x10 else (2 if fs == 0x20 else (4 if fs == 0x40 else 0))
                    if w == 0 or (spec[sid, 3] & w) == 0:
                        w = spec[sid, 2]
                nbytes = n * w
                if q + nbytes > end:
                    ok = False
                    break
                m = np.int64(0)
                o = np.int64(0)
                if spec[sid, 4] == 1:
                    if tknown[sid] == 0:
                        ok = False
                        break
                    m = mult[sid]
                    if m == 0 or (low[sid] & 0x0F) == 1:
                        ok = False
                        break
                    o = soff[sid]
                slot = spec[sid, 5]
                if slot >= 0:
                    pos[i, slot] = q
                    width[i, slot] = w
                    mul_out[i, slot] = m
                    off_out[i, slot] = o
                p = q + nbytes
            elif sid == _SUB_SCALE_FACTORS:
                if end - q < 4:
                    ok = False
                    break
                cm = _u32(u8, q)
                if cm < 1 or cm >= 0x80000000 or q + 4 + 12 * cm > end:
                    ok = False
                    break
                for e in range(cm):
                    a = q + 4 + 12 * e
                    aid = np.int64(u8[a])
                    m = _u32(u8, a + 4)
                    if m < 1:
                        ok = False
                        break
                    if 1 <= aid <= MAX_ARRAY_ID:
                        o = _u32(u8, a + 8)
                        if o >= 0x80000000:
                            o -= 0x100000000
                        cflag = np.int64(u8[a + 1])
                        mult[aid] = m
                        soff[aid] = o
                        low[aid] = cflag & 0x0F
                        high[aid] = cflag & 0xF0
                        tknown[aid] = 1
                        hknown[aid] = 1
                if not ok:
                    break
                p = q + 4 + 12 * cm
            elif sid == _SUB_QUALITY_FLAGS:
                nbytes = (n + 3) // 4
                if q + nbytes > end:
                    ok = False
                    break
                p = q + nbytes
            else:
                # sensor-specific, intensity series, unknown: skip, clamped to the record
                if ssize <= end - q:
                    p = q + ssize
                else:
                    p = end
        if not ok:
            mult[:] = saved[0, :]
            soff[:] = saved[1, :]
            low[:] = saved[2, :]
            high[:] = saved[3, :]
            tknown[:] = saved[4, :]
            hknown[:] = saved[5, :]
            for k in range(pos.shape[1]):
                pos[i, k] = -1
                width[i, k] = 0
                mul_out[i, k] = 1.0
                off_out[i, k] = 0.0
            return i
        nb[i] = n
    return n_pings


def _k_decode(u8, doffs, nb, pos, width, mult, off, signed, per_ping, t, tsec, tnsec, lat, lon,
              heading, pflags, beam, arrays, flags, valid):
    """Every beam of every ping into the output columns, in file order.

    Ping-header values are repeated per beam (once per ping with ``per_ping``); ``arrays`` (n_out - 1, total) gets the
    scaled arrays (slots other than the beam flags, in slot order), ``flags`` the raw
    beam flags; an absent array gives 0 and, when ``valid`` has rows, False there.
    """
    n_pings = len(doffs)
    fslot = FLAGS_SLOT
    r = 0
    for i in range(n_pings):
        d = doffs[i]
        n = nb[i]
        sec = _u32(u8, d)
        nsec = _u32(u8, d + 4)
        lo = _u32(u8, d + 8)
        la = _u32(u8, d + 12)
        if lo >= 0x80000000:
            lo -= 0x100000000
        if la >= 0x80000000:
            la -= 0x100000000
        pf = (np.int64(u8[d + 20]) << 8) | np.int64(u8[d + 21])
        hd = (np.int64(u8[d + 30]) << 8) | np.int64(u8[d + 31])
        tv = np.float64(sec) + np.float64(nsec) / 1e9
        lav = np.float64(la) / 1.0e7
        lov = np.float64(lo) / 1.0e7
        hv = np.float64(hd) / 100.0
        h0, h1 = (i, i + 1) if per_ping else (r, r + n)
        t[h0:h1] = tv
        tsec[h0:h1] = sec
        tnsec[h0:h1] = nsec
        lat[h0:h1] = lav
        lon[h0:h1] = lov
        heading[h0:h1] = hv
        pflags[h0:h1] = pf
        for b in range(n):
            beam[np.uint64(r + b)] = b + 1
        a = 0
        for k in range(pos.shape[1]):
            q = pos[i, k]
            w = width[i, k]
            has = q >= 0
            if valid.shape[1] > 0:
                valid[k, r:r + n] = has
            if k == fslot:
                if has:
                    flags[r:r + n] = u8[q:q + n]
                else:
                    flags[r:r + n] = 0
                continue
            out = arrays[a]
            a += 1
            if not has:
                out[r:r + n] = 0.0
                continue
            m = mult[i, k]
            o = off[i, k]
            sg = signed[k]
            # Whole words through a native view, byte-swapped with shifts, in 32-bit
            # integers: the compiler turns each loop into vector shuffles and
            # int32 -> double conversions (64-bit ones have no vector form on AVX2).
            # A u32 goes through int32 as (v - 2**31) + 2**31.0, exact in double.
            if w == 1:
                if sg:
                    c = u8[q:q + n].view(np.int8)
                    for b in range(n):
                        out[np.uint64(r + b)] = np.float64(np.int32(c[np.uint64(b)])) / m - o
                else:
                    for b in range(n):
                        out[np.uint64(r + b)] = np.float64(np.int32(u8[np.uint64(q + b)])) / m - o
            elif w == 2:
                h = u8[q:q + 2 * n].view(np.uint16)
                if sg:
                    for b in range(n):
                        x = np.int32(h[np.uint64(b)])
                        v = np.int32(np.int16(((x >> 8) | (x << 8)) & 0xFFFF))
                        out[np.uint64(r + b)] = np.float64(v) / m - o
                else:
                    for b in range(n):
                        x = np.int32(h[np.uint64(b)])
                        out[np.uint64(r + b)] = np.float64(((x >> 8) | (x << 8)) & 0xFFFF) / m - o
            else:
                g = u8[q:q + 4 * n].view(np.uint32)
                if sg:
                    for b in range(n):
                        out[np.uint64(r + b)] = np.float64(np.int32(_bswap32(g[np.uint64(b)]))) / m - o
                else:
                    for b in range(n):
                        v = np.int32(_bswap32(g[np.uint64(b)]) ^ np.uint32(0x80000000))
                        out[np.uint64(r + b)] = (np.float64(v) + 2147483648.0) / m - o
        r += n


_HELPERS = ("_field_size", "_size_or_high", "_u32", "_bswap32")


def _signatures(T) -> dict:
    u8r = T.Array(T.uint8, 1, "C", readonly=True)
    i8r = T.Array(T.int64, 1, "C", readonly=True)
    i8r2 = T.Array(T.int64, 2, "C", readonly=True)
    i8, i8_2 = T.Array(T.int64, 1, "C"), T.Array(T.int64, 2, "C")
    i1_2, f8_2 = T.Array(T.int8, 2, "C"), T.Array(T.float64, 2, "C")
    i1r2, f8r2 = T.Array(T.int8, 2, "C", readonly=True), T.Array(T.float64, 2, "C", readonly=True)
    u1 = T.Array(T.uint8, 1, "C")
    f8, i4, u2 = T.Array(T.float64, 1, "C"), T.Array(T.int32, 1, "C"), T.Array(T.uint16, 1, "C")
    b2 = T.Array(T.bool_, 2, "C")
    return {
        "frame": T.int64(u8r, T.int64, i8, i8, i4, i8),
        "walk": T.int64(u8r, i8r, i8r, T.int64, T.int64, i8r2, i8, i8, i8, i8, i8, i8,
                        i8, i8_2, i1_2, f8_2, f8_2, u1, i8_2),
        "decode": T.void(u8r, i8r, i8r, i8r2, i1r2, f8r2, f8r2, i8r, T.boolean, f8, i8, i4, f8,
                         f8, f8, u2, u2, f8_2, u1, b2),
    }


#: the compiled ``_k_<name>`` (compiled, or loaded from the on-disk cache, on first use)
kernel = CompiledKernels(globals(), _signatures, _HELPERS, helper_options={"inline": "always"})
