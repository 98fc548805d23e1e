"""`liger-core demo` end to end on CPU, shortened: both training runs (reference path), the interpreter's
kernel check, the side-by-side loss table and the PNG plot."""

from __future__ import annotations

import pytest

from liger_core import demo


def test_demo_runs_and_reports(tmp_path, capsys):
    pytest.importorskip("transformers")
    code = demo.main(["--device", "cpu", "--steps", "3", "--kernel-check-steps", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "liger_core: patched llama: rms_norm x9, swiglu x4, rope x4, fused_linear_cross_entropy x1" in out
    assert "tokens/s" in out and "largest loss difference over 3 steps: 0.00e+00" in out
    assert "liger_core (Triton kernels)" in out
    # progress for each of the four runs, from the start (two runs share a process on CPU); no speed ratio
    for label in ("[1/4] HF", "[3/4] HF"):
        assert f"{label}: starting (Python imports, building the model)" in out, out
    for label in ("[2/4] liger_core (reference code)", "[4/4] liger_core (Triton interpreter)"):
        assert f"{label}: starting (building the model)" in out, out
    assert "[2/4] liger_core (reference code): step 3/3" in out
    assert "not a kernel speedup" in out and "   x" not in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in out
    else:
        assert (tmp_path / "liger_core_demo.png").stat().st_size > 10_000
