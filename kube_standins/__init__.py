"""Stand-ins for Kubernetes parts, answering as the real ones do: the kube-apiserver's Node API,
the kubelet's pod-resources API, kube-scheduler's calls to an extender, and realistic Nodes."""
