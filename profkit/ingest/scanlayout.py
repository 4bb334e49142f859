"""The compiled scanner's output layout: what ``jsonscan.scan_piece`` writes where, read by ``scanned``.

Its own module so that the scanner, which compiles these numbers in, and its caller, which reads
its arrays with them, both take them from here: the built module is named for this file and
``jsonscan.py`` (``scanbuild._SOURCES``), so a change here builds a new one.
"""
from __future__ import annotations

# The scanner's output (``jsonscan.scan_piece``): its status, and one int64 column per field of a row
# (in ``ints``) with flag bits for null ids and numbers left to Arrow's parse.
OK, DEFER = 0, 1
(C_CAT_S, C_CAT_E, C_NAME_S, C_NAME_E, C_TS_S, C_TS_E, C_DUR_S, C_DUR_E, C_PID, C_TID, C_CORR, C_DEV, C_STREAM,
 C_EV_S, C_EV_E, C_FLAGS, N_INT_COLUMNS) = range(17)
F_PID_NULL, F_TID_NULL, F_CORR_NULL, F_DEV_NULL, F_STREAM_NULL, F_TS_SLOW, F_DUR_SLOW, F_RARE = (
    1, 2, 4, 8, 16, 32, 64, 128)
# a collective arg of a RARE row (``jsonscan.ARG_KEYS[3:]``, in this order): its kind
N_COLL_ARGS = 7
A_COLL, A_BYTES, A_GROUP, A_SEQ, A_SEQNUM, A_NELEMS, A_DTYPE = range(N_COLL_ARGS)
V_MISSING, V_NULL, V_STRING, V_INT, V_ODD = range(5)
MAX_DEPTH = 64  # values nested deeper: the element is declined (the decoders' own limits decide)
