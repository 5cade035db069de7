"""Benchmarks: each `bench_*.py` measures one thing on this machine in one run and prints (or writes) its figures;
docs/benchmarks.md lists them with their commands. They run from a checkout with the project installed
(`python bench/bench_engine.py ...`); tests import some of them (`from bench import bench_served`)."""
