"""Benchmarks: gradvault against its peers, measured in the same run, reported as ratios."""
