"""The instruction-count bench's reading of callgrind_annotate: every function's count goes to
the part it ran in, the program total to none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench import instructions

REPORT = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
500 (50.0%)  Python-3.11.7/Python/ceval.c:_PyEval_EvalFrameDefault [/x/lib/libpython3.11.so.1.0]
100 (10.0%)  Python-3.11.7/./Include/object.h:_PyFrame_Clear
 90 ( 9.0%)  Python-3.11.7/Modules/_json.c:scanstring_unicode [/x/lib-dynload/_json.cpython-311.so]
 80 ( 8.0%)  ???:OrtRun [/x/onnxruntime/capi/onnxruntime_pybind11_state.so]
 70 ( 7.0%)  /project/vendor/llhttp/src/llhttp.c:llhttp__internal__run [/x/httptools/parser.so]
 60 ( 6.0%)  ./string/memmove-vec-unaligned-erms.S:__memcpy_avx [/usr/lib/libc.so.6]
 50 ( 5.0%)  ???:PyArray_NewFromDescr_int [/x/numpy/_core/_multiarray_umath.so]
 30 ( 3.0%)  ???:something [/x/other.so]
 20 ( 2.0%)  ???:uv__io_poll [/x/uvloop/loop.so]
"""


def test_by_part_when_given_an_annotate_report_counts_each_function_once_where_it_ran() -> None:
    parts = instructions._by_part(REPORT)
    assert parts == {"interpreter": 600, "json": 90, "ONNX Runtime": 80, "httptools": 70,
                     "libc": 60, "numpy": 50, "the rest": 30, "uvloop": 20}
    assert sum(parts.values()) == 1000


def test_run_bench_when_valgrind_is_missing_says_so(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    result = instructions.run_bench(tmp_path, quick=True)
    assert "valgrind" in result["skipped"]
    assert "skipped" in instructions.format_table(result)
