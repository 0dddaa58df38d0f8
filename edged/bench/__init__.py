"""Benchmarks behind `edged bench`: each compares variants inside one run and writes JSON."""
