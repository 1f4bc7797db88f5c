"""Measuring a pair without moving it: ``rmq probe`` (probe.py), ``rmq eval`` (evaluate.py) on a
throwaway copy (sandbox.py), and the Old/New/naive references (baseline.py). Imports
operations/ and below."""
