"""Simulation and demo tooling: a local Kubernetes API stand-in, fleet traces, the demo."""
