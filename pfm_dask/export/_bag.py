"""BAG 1.6 (Bathymetric Attributed Grid) from a PFM, written with h5py.

Layout (Open Navigation Surface BAG 1.6, as the reference library and GDAL's
BAG driver write and read it): group ``BAG_root`` with attribute
``Bag Version``; ``metadata``, the ISO 19115/19139 XML as a 1-D dataset of
single characters; ``elevation`` and ``uncertainty``, float32 (rows, columns)
with row 0 the southmost, null ``1e6``, chunked and deflated, each with its
minimum/maximum attributes; ``tracking_list``, a compound dataset of changed
nodes with its length attribute. Elevations are positive up (``-depth``).
GDAL takes the geotransform from the metadata's corner points, which are
the centres of the south-west and north-east cells, in longitude, latitude.
"""

from __future__ import annotations

import datetime as _dt
import os
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from .. import __version__
from ..errors import PfmDaskError
from ._surface import (DEFAULT_MEMORY, DEFAULT_SURFACE, check_surface, plan_tiles, read_tiles,
                       replace_atomically, surface_label, temp_path)

__all__ = ["write_bag", "BAG_VERSION", "BAG_NULL", "TRACKING_LIST_DTYPE", "WGS84_GEOGCS_WKT"]

#: Value of the ``Bag Version`` attribute.
BAG_VERSION = "1.6.3"
#: Null value of the elevation and uncertainty layers.
BAG_NULL = np.float32(1.0e6)
#: One tracking-list entry, laid out as the BAG library's ``TrackingItem``.
TRACKING_LIST_DTYPE = np.dtype({
    "names": ["row", "col", "depth", "uncertainty", "track_code", "list_series"],
    "formats": ["<u4", "<u4", "<f4", "<f4", "u1", "<i2"],
    "offsets": [0, 4, 8, 12, 16, 18],
    "itemsize": 20,
})
#: WGS 84 geographic (EPSG:4326) as WKT 1, the horizontal reference of every PFM.
WGS84_GEOGCS_WKT = (
    'GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",6378137,298.257223563,'
    'AUTHORITY["EPSG","7030"]],AUTHORITY["EPSG","6326"]],PRIMEM["Greenwich",0,'
    'AUTHORITY["EPSG","8901"]],UNIT["degree",0.0174532925199433,AUTHORITY["EPSG","9122"]],'
    'AXIS["Latitude",NORTH],AXIS["Longitude",EAST],AUTHORITY["EPSG","4326"]]'
)
_VERT_WKT = 'VERT_CS["unknown",VERT_DATUM["unknown",2000],UNIT["metre",1],AXIS["Up",UP]]'
_CHUNK = 100                  # chunk side of the grid layers (the BAG library's default)
_METADATA_CHUNK = 1024        # chunk length of the metadata string (as the BAG library)
_TRACKING_CHUNK = 10

_CL = "http://www.isotc211.org/2005/resources/Codelist/gmxCodelists.xml#"
_CLASSIFICATIONS = {"UNCLASSIFIED": "unclassified", "RESTRICTED": "restricted",
                    "CONFIDENTIAL": "confidential", "SECRET": "secret",
                    "TOP SECRET": "topSecret", "TOPSECRET": "topSecret"}


def write_bag(pfm_path, out, *, surface: str = DEFAULT_SURFACE, memory: int = DEFAULT_MEMORY,
              compression: int = 6, contact: str | None = None) -> dict:
    """Write the chosen surface of a PFM as a BAG; returns a summary dict.

    Elevation is ``-surface`` (BAG is positive up), uncertainty the standard
    deviation of the bin's valid soundings (``rawStdDev``; null where fewer
    than two are valid); bins without a surface value are null. The grid is
    streamed by bands of rows within ``memory`` bytes. The file appears under
    ``out`` only once complete.
    """
    import h5py

    from ..pfm import open_pfm

    check_surface(surface)
    out = os.fspath(out)
    tmp = temp_path(out)
    f = open_pfm(pfm_path, "r")
    try:
        W, H = f.width, f.height
        tiles = plan_tiles(W, H, memory, row_multiple=min(_CHUNK, H))
        band = tiles[0][1] - tiles[0][0]
        rows = min(H, _CHUNK, band)
        # chunks of about 100 x 100 values; thinner bands get wider chunks of the same size
        chunk = (rows, min(W, max(_CHUNK, _CHUNK * _CHUNK // rows), tiles[0][3] - tiles[0][2]))
        created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
        xml = bag_metadata_xml(f, surface=surface, created=created, contact=contact)
        stats = {"bins_with_surface": 0, "soundings": 0, "valid_soundings": 0}
        ext = {"emin": np.inf, "emax": -np.inf, "umin": np.inf, "umax": -np.inf}
        try:
            with h5py.File(tmp, "w", libver=("earliest", "v110")) as h:
                root = h.create_group("BAG_root")
                root.attrs.create("Bag Version", np.array(BAG_VERSION.encode(), dtype="S32"))
                md = np.frombuffer(xml, dtype="S1")
                root.create_dataset("metadata", data=md, maxshape=(None,),
                                    chunks=(min(_METADATA_CHUNK, max(1, md.size)),))
                layers = {}
                for name in ("elevation", "uncertainty"):
                    layers[name] = root.create_dataset(
                        name, shape=(H, W), dtype="<f4", chunks=chunk, fillvalue=BAG_NULL,
                        compression="gzip" if compression else None,
                        compression_opts=compression if compression else None)
                tl = root.create_dataset("tracking_list", shape=(0,), maxshape=(None,),
                                         dtype=TRACKING_LIST_DTYPE, chunks=(_TRACKING_CHUNK,))
                tl.attrs.create("Tracking List Length", np.uint32(0), dtype="<u4")
                for t in read_tiles(f, surface, memory, row_multiple=min(_CHUNK, H)):
                    elev = np.negative(t.depth)
                    unc = np.where(np.isnan(elev), np.nan, t.std).astype(np.float32)
                    _extend(ext, "e", elev)
                    _extend(ext, "u", unc)
                    stats["bins_with_surface"] += int(np.count_nonzero(~np.isnan(elev)))
                    stats["soundings"] += int(t.num_soundings.sum(dtype=np.int64))
                    stats["valid_soundings"] += int(t.num_valid.sum(dtype=np.int64))
                    np.nan_to_num(elev, copy=False, nan=BAG_NULL)
                    np.nan_to_num(unc, copy=False, nan=BAG_NULL)
                    sl = np.s_[t.row0:t.row1, t.col0:t.col1]
                    layers["elevation"][sl] = elev
                    layers["uncertainty"][sl] = unc
                    del elev, unc, t
                for name, key, label in (("elevation", "e", "Elevation"),
                                         ("uncertainty", "u", "Uncertainty")):
                    lo, hi = ext[key + "min"], ext[key + "max"]
                    if not np.isfinite(lo):
                        lo = hi = BAG_NULL
                    layers[name].attrs.create(f"Minimum {label} Value", np.float32(lo), dtype="<f4")
                    layers[name].attrs.create(f"Maximum {label} Value", np.float32(hi), dtype="<f4")
            replace_atomically(tmp, out)
        except OSError as err:
            raise PfmDaskError(f"cannot write the BAG: {err}", path=out) from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        f.close()
    return {"path": out, "format": "BAG", "bag_version": BAG_VERSION, "surface": surface,
            "width": W, "height": H, "chunks": list(chunk), "tiles_read": len(tiles),
            "min_elevation": None if not np.isfinite(ext["emin"]) else float(ext["emin"]),
            "max_elevation": None if not np.isfinite(ext["emax"]) else float(ext["emax"]),
            **stats}


def _extend(ext: dict, key: str, a: np.ndarray) -> None:
    if a.size and not np.all(np.isnan(a)):
        ext[key + "min"] = min(ext[key + "min"], float(np.nanmin(a)))
        ext[key + "max"] = max(ext[key + "max"], float(np.nanmax(a)))


# ---------------------------------------------------------------------------
# ISO 19115 / 19139 metadata


def _t(text) -> str:
    return escape(str(text))


def _cs(text) -> str:
    return f"<gco:CharacterString>{_t(text)}</gco:CharacterString>"


def _code(tag: str, codelist: str, value: str) -> str:
    return f"<{tag} codeList={quoteattr(codelist)} codeListValue={quoteattr(value)}>{_t(value)}</{tag}>"


def _num(v: float) -> str:
    return repr(float(v))


def _party(name: str, role: str) -> str:
    return ("<gmd:CI_ResponsibleParty>"
            f"<gmd:individualName>{_cs(name)}</gmd:individualName>"
            f"<gmd:role>{_code('gmd:CI_RoleCode', _CL + 'CI_RoleCode', role)}</gmd:role>"
            "</gmd:CI_ResponsibleParty>")


def _citation(title: str, date: str | None, date_type: str = "creation") -> str:
    d = f"<gco:Date>{_t(date)}</gco:Date>" if date else None
    date_el = f"<gmd:date>{d}</gmd:date>" if d else '<gmd:date gco:nilReason="unknown"/>'
    return ("<gmd:CI_Citation>"
            f"<gmd:title>{_cs(title)}</gmd:title>"
            f"<gmd:date><gmd:CI_Date>{date_el}"
            f"<gmd:dateType>{_code('gmd:CI_DateTypeCode', _CL + 'CI_DateTypeCode', date_type)}"
            "</gmd:dateType></gmd:CI_Date></gmd:date>"
            "</gmd:CI_Citation>")


def _dimension(name: str, size: int, res_deg: float) -> str:
    return ("<gmd:axisDimensionProperties><gmd:MD_Dimension>"
            f"<gmd:dimensionName>{_code('gmd:MD_DimensionNameTypeCode', _CL + 'MD_DimensionNameTypeCode', name)}"
            "</gmd:dimensionName>"
            f"<gmd:dimensionSize><gco:Integer>{int(size)}</gco:Integer></gmd:dimensionSize>"
            f'<gmd:resolution><gco:Measure uom="deg">{_num(res_deg)}</gco:Measure></gmd:resolution>'
            "</gmd:MD_Dimension></gmd:axisDimensionProperties>")


def _reference_system(wkt: str) -> str:
    return ("<gmd:referenceSystemInfo><gmd:MD_ReferenceSystem><gmd:referenceSystemIdentifier>"
            f"<gmd:RS_Identifier><gmd:code>{_cs(wkt)}</gmd:code>"
            f"<gmd:codeSpace>{_cs('WKT')}</gmd:codeSpace></gmd:RS_Identifier>"
            "</gmd:referenceSystemIdentifier></gmd:MD_ReferenceSystem></gmd:referenceSystemInfo>")


def bag_metadata_xml(f, *, surface: str, created: _dt.datetime, contact: str | None = None) -> bytes:
    """The ISO 19115 (19139 XML, BAG profile) metadata of a PFM surface, as UTF-8 bytes.

    Grid geometry (sizes, resolution, cell-centre corner points in longitude,
    latitude), WGS 84 geographic reference (EPSG:4326) with an unknown
    vertical datum, creation date, the uncertainty type (``rawStdDev``) and
    the PFM's input files as lineage sources.
    """
    g = f.grid
    h = f.header
    W, H = f.width, f.height
    llx, lly = g.min_x + 0.5 * g.x_bin, g.min_y + 0.5 * g.y_bin
    urx, ury = g.min_x + (W - 0.5) * g.x_bin, g.min_y + (H - 0.5) * g.y_bin
    date = created.date().isoformat()
    stamp = created.strftime("%Y-%m-%dT%H:%M:%S")
    name = os.path.basename(os.fspath(f.path))
    who = contact or "unknown"
    files = f.files()
    live = [x for x in files if not x.deleted]
    n_deleted = len(files) - len(live)
    klass_text = (h.classification or "").strip()
    klass = _CLASSIFICATIONS.get(klass_text.upper(), "restricted" if klass_text else "unclassified")
    abstract = (f"{surface_label(surface)} ({surface}) of each bin of the PFM {name} "
                f"({W} x {H} bins of {g.bin_size_xy:.6g} m), as elevation positive up "
                "(the negated PFM depth). Uncertainty: standard deviation of the bin's valid "
                "soundings (null where fewer than two are valid). Empty bins are null (1000000).")
    step = (f"Soundings binned into the PFM {name} ({h.creation_software or 'unknown software'}, "
            f"{h.date or 'date unknown'}); surface {surface} exported by pfm-dask {__version__}. "
            f"{len(live)} input file(s)"
            + (f"; {n_deleted} file(s) deleted from the PFM do not contribute." if n_deleted else "."))
    sources = "".join(
        "<gmd:source><gmd:LI_Source>"
        f"<gmd:description>{_cs(f'input file {x.number} (PFM data type {x.data_type})')}</gmd:description>"
        f"<gmd:sourceCitation>{_citation(x.path, None)}</gmd:sourceCitation>"
        "</gmd:LI_Source></gmd:source>" for x in live)
    bbox = ("<gmd:EX_GeographicBoundingBox>"
            f"<gmd:westBoundLongitude><gco:Decimal>{_num(g.min_x)}</gco:Decimal></gmd:westBoundLongitude>"
            f"<gmd:eastBoundLongitude><gco:Decimal>{_num(g.max_x)}</gco:Decimal></gmd:eastBoundLongitude>"
            f"<gmd:southBoundLatitude><gco:Decimal>{_num(g.min_y)}</gco:Decimal></gmd:southBoundLatitude>"
            f"<gmd:northBoundLatitude><gco:Decimal>{_num(g.max_y)}</gco:Decimal></gmd:northBoundLatitude>"
            "</gmd:EX_GeographicBoundingBox>")
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<gmi:MI_Metadata xmlns:gmi="http://www.isotc211.org/2005/gmi" '
        'xmlns:gmd="http://www.isotc211.org/2005/gmd" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xmlns:gml="http://www.opengis.net/gml/3.2" '
        'xmlns:gco="http://www.isotc211.org/2005/gco" '
        'xmlns:xlink="http://www.w3.org/1999/xlink" '
        'xmlns:bag="http://www.opennavsurf.org/schema/bag">'
        "<gmd:language>"
        '<gmd:LanguageCode codeList="http://www.loc.gov/standards/iso639-2/" codeListValue="eng">eng'
        "</gmd:LanguageCode></gmd:language>"
        f"<gmd:characterSet>{_code('gmd:MD_CharacterSetCode', _CL + 'MD_CharacterSetCode', 'utf8')}"
        "</gmd:characterSet>"
        f"<gmd:hierarchyLevel>{_code('gmd:MD_ScopeCode', _CL + 'MD_ScopeCode', 'dataset')}</gmd:hierarchyLevel>"
        f"<gmd:contact>{_party(who, 'pointOfContact')}</gmd:contact>"
        f"<gmd:dateStamp><gco:Date>{date}</gco:Date></gmd:dateStamp>"
        f"<gmd:metadataStandardName>{_cs('ISO 19115')}</gmd:metadataStandardName>"
        f"<gmd:metadataStandardVersion>{_cs('2003/Cor.1:2006')}</gmd:metadataStandardVersion>"
        "<gmd:spatialRepresentationInfo><gmd:MD_Georectified>"
        "<gmd:numberOfDimensions><gco:Integer>2</gco:Integer></gmd:numberOfDimensions>"
        + _dimension("row", H, g.y_bin) + _dimension("column", W, g.x_bin) +
        f"<gmd:cellGeometry>{_code('gmd:MD_CellGeometryCode', _CL + 'MD_CellGeometryCode', 'point')}"
        "</gmd:cellGeometry>"
        "<gmd:transformationParameterAvailability><gco:Boolean>1</gco:Boolean>"
        "</gmd:transformationParameterAvailability>"
        "<gmd:checkPointAvailability><gco:Boolean>0</gco:Boolean></gmd:checkPointAvailability>"
        '<gmd:cornerPoints><gml:Point gml:id="id1">'
        f'<gml:coordinates decimal="." cs="," ts=" ">{_num(llx)},{_num(lly)} {_num(urx)},{_num(ury)}'
        "</gml:coordinates></gml:Point></gmd:cornerPoints>"
        "<gmd:pointInPixel><gmd:MD_PixelOrientationCode>center</gmd:MD_PixelOrientationCode>"
        "</gmd:pointInPixel>"
        "</gmd:MD_Georectified></gmd:spatialRepresentationInfo>"
        + _reference_system(WGS84_GEOGCS_WKT) + _reference_system(_VERT_WKT) +
        "<gmd:identificationInfo><bag:BAG_DataIdentification>"
        f"<gmd:citation>{_citation(name, date)}</gmd:citation>"
        f"<gmd:abstract>{_cs(abstract)}</gmd:abstract>"
        f"<gmd:spatialRepresentationType>"
        f"{_code('gmd:MD_SpatialRepresentationTypeCode', _CL + 'MD_SpatialRepresentationTypeCode', 'grid')}"
        "</gmd:spatialRepresentationType>"
        "<gmd:spatialResolution><gmd:MD_Resolution><gmd:distance>"
        f'<gco:Distance uom="m">{_num(g.bin_size_xy)}</gco:Distance>'
        "</gmd:distance></gmd:MD_Resolution></gmd:spatialResolution>"
        "<gmd:language>"
        '<gmd:LanguageCode codeList="http://www.loc.gov/standards/iso639-2/" codeListValue="eng">eng'
        "</gmd:LanguageCode></gmd:language>"
        f"<gmd:characterSet>{_code('gmd:MD_CharacterSetCode', _CL + 'MD_CharacterSetCode', 'utf8')}"
        "</gmd:characterSet>"
        "<gmd:topicCategory><gmd:MD_TopicCategoryCode>elevation</gmd:MD_TopicCategoryCode></gmd:topicCategory>"
        f"<gmd:environmentDescription>{_cs(f'pfm-dask {__version__}')}</gmd:environmentDescription>"
        f"<gmd:extent><gmd:EX_Extent><gmd:geographicElement>{bbox}</gmd:geographicElement>"
        "</gmd:EX_Extent></gmd:extent>"
        "<bag:verticalUncertaintyType>"
        + _code("bag:BAG_VertUncertCode",
                "http://www.opennavsurf.org/schema/bag/bagCodelists.xml#BAG_VertUncertCode", "rawStdDev") +
        "</bag:verticalUncertaintyType>"
        "</bag:BAG_DataIdentification></gmd:identificationInfo>"
        "<gmd:dataQualityInfo><gmd:DQ_DataQuality>"
        "<gmd:scope><gmd:DQ_Scope><gmd:level>"
        + _code("gmd:MD_ScopeCode", _CL + "MD_ScopeCode", "dataset") +
        "</gmd:level></gmd:DQ_Scope></gmd:scope>"
        "<gmd:lineage><gmd:LI_Lineage><gmd:processStep><gmd:LI_ProcessStep>"
        f"<gmd:description>{_cs(step)}</gmd:description>"
        f"<gmd:dateTime><gco:DateTime>{stamp}</gco:DateTime></gmd:dateTime>"
        f"<gmd:processor>{_party(who, 'processor')}</gmd:processor>"
        + sources +
        "</gmd:LI_ProcessStep></gmd:processStep></gmd:LI_Lineage></gmd:lineage>"
        "</gmd:DQ_DataQuality></gmd:dataQualityInfo>"
        "<gmd:metadataConstraints><gmd:MD_LegalConstraints>"
        f"<gmd:useConstraints>{_code('gmd:MD_RestrictionCode', _CL + 'MD_RestrictionCode', 'otherRestrictions')}"
        "</gmd:useConstraints>"
        f"<gmd:otherConstraints>{_cs('unknown')}</gmd:otherConstraints>"
        "</gmd:MD_LegalConstraints></gmd:metadataConstraints>"
        "<gmd:metadataConstraints><gmd:MD_SecurityConstraints>"
        f"<gmd:classification>{_code('gmd:MD_ClassificationCode', _CL + 'MD_ClassificationCode', klass)}"
        "</gmd:classification>"
        f"<gmd:userNote>{_cs('PFM classification: ' + (klass_text or 'none given'))}</gmd:userNote>"
        "</gmd:MD_SecurityConstraints></gmd:metadataConstraints>"
        "</gmi:MI_Metadata>\n")
    return xml.encode("utf-8")
