"""PFM v7 validity flags (one word on soundings and on bins).

Values as the PFM library V7.00 defines them (``pfm.h``); see docs/pfm-format.md.
They sit at the bottom of the package (not in :mod:`pfm_dask.pfm`) because the filters,
the task code and the writer all use them, and none of them needs the PFM codec for it.
On a bin, a flag means "at least one sounding has it", except CHECKED, DATA,
INTERPOLATED and VERIFIED, which belong to the bin itself.
"""

MANUALLY_INVAL = 1
FILTER_INVAL = 2
SELECTED_SOUNDING = 4
SUSPECT = 8
SELECTED_FEATURE = 16
MODIFIED = 32
USER_01 = 64
USER_02 = 128
USER_03 = 256
CHECKED = 512
DATA = 1024
DELETED = 2048
USER_04 = 4096
INTERPOLATED = 8192
REFERENCE = 16384
VERIFIED = 32768
USER_05 = 65536
DESIGNATED_SOUNDING = 131072
USER_06 = 262144
USER_07 = 524288
USER_08 = 1048576
USER_09 = 2097152
USER_10 = 4194304

INVAL = MANUALLY_INVAL | FILTER_INVAL  # 3
SELECTED = SELECTED_SOUNDING | SELECTED_FEATURE  # 20
# The library's PFM_USER is 7672256: it leaves out USER_07 (524288). We keep its
# value, because the recompute mask is built from it: 65535 XOR (SUSPECT | SELECTED |
# USER | REFERENCE | INVAL) keeps some bits above 2**16 and clears USER_07 and
# DESIGNATED (see pfm/_recompute.py, PRIOR_KEEP).
USER = (USER_01 | USER_02 | USER_03 | USER_04 | USER_05 | USER_06
        | USER_08 | USER_09 | USER_10)
VAL_MASK = (1 << 23) - 1

# Coverage-map bits (.cvg), v7.
COV_DATA = 128
COV_CHECKED = 64
COV_VERIFIED = 32
COV_SURVEYED = 16
COV_GAP = 8
