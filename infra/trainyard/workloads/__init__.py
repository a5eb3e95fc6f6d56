"""Workload layer: the elastic training jobs that run on the platform."""
