"""Edges: the HTTP server and the list + watch caches (Nodes, Pods, Namespaces): all the
scorer's I/O, kept off the verdict core.
"""
