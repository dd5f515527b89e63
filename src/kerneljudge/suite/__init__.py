"""Suite runs, the results store and the field's metrics.

* :mod:`kerneljudge.suite.layout`: a suite's problems and the candidate files for each;
* :mod:`kerneljudge.suite.runner`: judge every pair, resumably, storing each verdict;
* :mod:`kerneljudge.suite.store`: :class:`ResultsStore`, one SQLite file, versioned schema;
* :mod:`kerneljudge.suite.metrics`: correctness, fast_p (with ties by interval), pass@k,
  fast_p@k, geomean speedup.

See ``docs/suites.md``.
"""

from kerneljudge.suite.metrics import GroupMetrics, Outcome, Sample, compute_metrics, pass_at_k
from kerneljudge.suite.store import ResultsStore, RunInfo, StoredVerdict, StoreError

__all__ = [
    "GroupMetrics",
    "Outcome",
    "ResultsStore",
    "RunInfo",
    "Sample",
    "StoreError",
    "StoredVerdict",
    "compute_metrics",
    "pass_at_k",
]
