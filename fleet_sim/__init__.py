"""Offline simulations of a GPU fleet: seeded load traces, the agents' write budget, and pod
placement under several scoring policies."""
