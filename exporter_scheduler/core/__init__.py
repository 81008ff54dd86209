"""The verdict core: pure functions of (pod, node data, in-flight pods, now, policy).

No I/O and no imports beyond `gpu_contract` and this package: every rule a verdict applies
lives here, so it can be read, tested and replayed alone.
"""
