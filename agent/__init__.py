"""The node agent: samples NVML and publishes rate-limited GPU annotations on its own Node."""
