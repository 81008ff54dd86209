"""The scorer: a kube-scheduler extender that filters and scores nodes from GPU annotations."""
