"""A real Kubernetes control plane on loopback (etcd, kube-apiserver, kube-scheduler v1.36) and
what the e2e tests, the real-scheduler benchmark and the demo run on it."""
