"""An int8 first pass over a large table of vectors (retrieval.ranking.Vectors): the table's rows, a block of
BLOCK_ROWS at a time, stored as int8 (each row scaled by its largest component; 7 bits, QUANTISED_MAX) inside
an onnxruntime session that multiplies a question's vector with them on the CPU's int8 instructions
(com.microsoft.DynamicQuantizeMatMul, the block packed once when the session is built).

A float32 matrix-vector product reads four bytes per component and is bound by memory bandwidth on a long
conversation's passage vectors; the int8 blocks read a quarter of that (docs/benchmarks.md). Their scores
are close to the exact cosines but not equal, so the caller scores the best RESCORE_ROWS rows again in
float32 and those (every row a search ranks) are exact.

Nothing is downloaded: the graph is built here with the `onnx` package. Without it or onnxruntime, or when a
block cannot be built, `int8_block` returns None and the caller scores every row in float32."""

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

# Rows per int8 block: a block is built once, when the table has grown past it (building is not free), and
# the rows beyond the last full block (fewer than this) are scored in float32.
BLOCK_ROWS = 8192
# How many of the best int8 scores are computed again in float32: five times the fusion depth of the history
# index (retrieval.history.FUSION_DEPTH), so the rows it ranks carry exact cosines.
RESCORE_ROWS = 1000


class Int8Block:
    """Rows of a vector table as int8 with a scale per row, and a session computing their dot products with
    a float32 query (the query quantised per call)."""

    def __init__(self, session: Any, columns: np.ndarray) -> None:
        self._session = session
        self._columns = columns  # the session's initializer (onnxruntime reads it in place)

    def scores(self, query: np.ndarray) -> np.ndarray:
        """Approximate dot product of each row with `query` (float32, one per row)."""
        scores: np.ndarray = self._session.run(None, {"query": query.reshape(1, -1)})[0].ravel()
        return scores


_unavailable: list[str] = []  # why blocks cannot be built here, once it is known


def int8_block(rows: np.ndarray) -> Int8Block | None:
    """The int8 block of `rows` (float32, one vector per row); None when blocks cannot be built in this
    process (the first failure is logged and remembered: no retry per search)."""
    if _unavailable:
        return None
    try:
        return _block(rows)
    except Exception as exc:  # no onnx/onnxruntime, a build without the contrib operator, no memory
        _unavailable.append(f"{type(exc).__name__}: {exc}")
        logger.warning("int8 prescan unavailable (%s); vectors are scored in float32", _unavailable[0])
        return None


# The largest magnitude of a quantised component: 7 bits, not 8. On a CPU without VNNI (AVX2 only) the
# kernel multiplies the uint8 query by the int8 rows in pairs summed into 16 bits, which saturate when a
# component reaches 127 (2 * 255 * 127 > 32,767): on such a machine 8 bits reordered an exact scan's best
# rows; 7 bits keep the largest errors small at the same mean error.
QUANTISED_MAX = 63


def quantise_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row as int8 (-QUANTISED_MAX..QUANTISED_MAX) and the scale that brings it back:
    row ~= int8 row * scale."""
    largest = np.abs(rows).max(axis=1)
    scales = np.where(largest > 0, largest / QUANTISED_MAX, 1.0).astype(np.float32)
    quantised = np.clip(np.rint(rows / scales[:, None]), -QUANTISED_MAX, QUANTISED_MAX).astype(np.int8)
    return quantised, scales


def _block(rows: np.ndarray) -> Int8Block:
    """The session over `rows`. The int8 matrix is handed to onnxruntime as an external initializer, read
    in place, not copied into the model: inside the model, each block's matrix was held more than once."""
    # Imported here: optional heavy dependencies, and int8_block turns their absence into float32 scoring.
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    quantised, scales = quantise_rows(rows)
    columns = np.ascontiguousarray(quantised.T)
    external = TensorProto(name="rows", data_type=TensorProto.INT8, dims=columns.shape)
    external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "in-memory"), ("offset", "0"), ("length", str(columns.nbytes))):
        external.external_data.add(key=key, value=value)
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["query", "rows", "scales"], ["scores"], domain="com.microsoft"
    )
    graph = helper.make_graph(
        [node],
        "int8_prescan",
        [helper.make_tensor_value_info("query", TensorProto.FLOAT, [1, rows.shape[1]])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, len(rows)])],
        initializer=[external, numpy_helper.from_array(scales, "scales")],
    )
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_external_initializers(["rows"], [ort.OrtValue.ortvalue_from_numpy(columns)])
    session = ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return Int8Block(session, columns)
