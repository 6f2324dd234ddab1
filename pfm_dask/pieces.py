"""What a load's task hands to the writer: the piece of work, the sorted soundings, the counts.

These types sit at the bottom of the package so that the writer, the driver and the task code
share them without importing each other: importing them loads neither the GSF decoder nor the
PFM codec. :func:`pfm_dask.soundings.prepare_piece` makes a :class:`PreparedPiece`;
:class:`pfm_dask.writer.PfmWriter` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

__all__ = ["BATCH_SCHEMA", "COUNTED_ROW_BYTES", "PING_SCHEMA", "COUNT_KEYS", "Piece", "PreparedPiece", "empty_counts"]

#: One row per loaded sounding, sorted by (bin, ping, beam). The bin index in 4 bytes: a grid
#: has fewer than 2**31 bins (``pfm._grid.MAX_BINS``, pfmLoader's limit); the writer widens it
#: a run at a time, so a group of pieces waiting for the writer holds 4 bytes a sounding less.
BATCH_SCHEMA = pa.schema([
    ("bin_index", pa.uint32()),
    ("ping", pa.uint32()),
    ("beam", pa.uint16()),
    ("depth", pa.float64()),
    ("x_off", pa.uint16()),
    ("y_off", pa.uint16()),
    ("validity", pa.uint32()),
    ("horizontal_error", pa.float32()),
    ("vertical_error", pa.float32()),
])

#: bytes a sounding the groups count beyond the batch's own (:attr:`PreparedPiece.nbytes`)
_WIDENED = 8 - BATCH_SCHEMA.field("bin_index").type.byte_width
#: a sounding's bytes as the plan, the groups and the hold count them (an 8-byte bin index)
COUNTED_ROW_BYTES = sum(f.type.bit_width // 8 for f in BATCH_SCHEMA) + _WIDENED

# One row per ping that contributed at least one sounding inside the area.
PING_SCHEMA = pa.schema([
    ("ping", pa.uint32()),
    ("heading", pa.float64()),
    ("time_sec", pa.int64()),
    ("time_nsec", pa.int32()),
])

COUNT_KEYS = (
    "pings_read", "soundings_read", "ping_skipped", "beam_rejected",
    "outside_area", "loaded", "depth_out_of_range", "invalid_by_gsf_flags",
    "flagged_swath_filter",
)


@dataclass(frozen=True)
class Piece:
    """A unit of work: the pings ``[start_ping, stop_ping)`` of one input file.

    ``seq`` orders all pieces of a load (file order, then ping order); the
    writer writes them in that order whichever worker finished first.
    """

    seq: int
    file_number: int
    path: str
    start_ping: int = 0
    stop_ping: int | None = None
    piece_index: int = 0
    n_pieces: int = 1
    est_soundings: int = 0

    @property
    def last(self) -> bool:
        return self.piece_index == self.n_pieces - 1


@dataclass
class PreparedPiece:
    """What a task hands to the writer: sorted soundings, contributing pings, counts."""

    piece: Piece
    batch: pa.RecordBatch
    pings: pa.Table
    counts: dict = field(default_factory=dict)
    damage: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """The piece's bytes as the writer's groups and the driver's hold count them: its batch
        with an 8-byte bin index, as it was handed over before the index took 4 (4 bytes a
        sounding more than it holds), so that the groups, and with them the output's bytes,
        are those of earlier versions and of a journal one wrote."""
        return int(self.batch.nbytes + _WIDENED * self.batch.num_rows + self.pings.nbytes)


def empty_counts() -> dict:
    """A piece's counts, all zero (:data:`COUNT_KEYS`)."""
    return {k: 0 for k in COUNT_KEYS}
