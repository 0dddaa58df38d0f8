"""edged's benchmarks: each module measures one path against the direct library call in the
same run and writes a table and JSON (`python -m tools.bench SUITE`)."""
