"""A real Kubernetes control plane on loopback (etcd, kube-apiserver, kube-scheduler v1.37, or
v1.36 of the version matrix) and what the e2e tests, the real-scheduler benchmark and the demo
run on it."""
