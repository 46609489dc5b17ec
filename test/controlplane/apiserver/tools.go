//go:build tools

// Package tools pins k8s.io/kubernetes/cmd/kube-apiserver so that `go mod tidy` keeps every
// module it needs; build.sh builds that command from this module.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
