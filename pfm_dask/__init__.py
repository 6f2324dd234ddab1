"""pfm-dask: many GSF multibeam files in, one PFM v7 bin file out, on Dask.

The codecs (:mod:`pfm_dask.gsf`, :mod:`pfm_dask.pfm`), the kernels
(:mod:`pfm_dask.geodesy`, :mod:`pfm_dask.bins`, :mod:`pfm_dask.filters`) and the
writer class never import Dask or typer; Dask lives in :mod:`pfm_dask.pipeline`
and :mod:`pfm_dask.cluster` only.
"""

__version__ = "0.1.0"
