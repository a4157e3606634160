"""What "the kernels are there" means where CI requires them (``SEQ2SEQ_REQUIRE_KERNELS=1``)."""

from __future__ import annotations

from seq2seq.kernels.gru import c_loops
from seq2seq.kernels.library import blas_sgemm, library, unavailable_reason

REQUIRE_KERNELS = "SEQ2SEQ_REQUIRE_KERNELS"


def kernels_missing() -> str | None:
    """Why the C kernels, their C loops or the BLAS path are not in use here; None if all are."""
    if library() is None:
        return f"the C kernels did not build or load: {unavailable_reason()}"
    if not c_loops():
        return "the GRU's C loops do not compute what the Python loop over torch's GEMMs does"
    if blas_sgemm() is None:
        return "torch's BLAS sgemm_ was not found, or disagrees with torch.addmm (greedy C loop)"
    return None
