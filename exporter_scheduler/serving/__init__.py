"""Serving: the request path from body to reply (wire, app, verdict tables, node store),
its explanations and its metrics. No sockets and no Kubernetes client: the edges feed it.
"""
