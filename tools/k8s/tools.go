//go:build tools

// Package tools keeps the upstream command packages in this module's graph, so that
// `go build k8s.io/kubernetes/cmd/kube-apiserver` resolves every dependency from go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
