"""The demo: the whole loop of agents, scorer and a scheduler on loopback, and its live view."""
